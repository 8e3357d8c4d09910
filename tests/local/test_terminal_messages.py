"""What podrun says on the terminal around a job's edges (issue 26, part 3): a stop's grace period
announced and counted down, a kill named as one, every host of a connect failure, the loopback line
only where gloo or NCCL reads it, `validate`'s wording, the restarts in a success line, `logs -f` of a
stopped job, `logs --tail` after torchrun's stop, and the hint when restarted workers resumed apart."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from helpers import Background, job_id_in, podrun, run_in_terminal, stderr_lines_without_traceback, wait_until

IGNORES_TERM = "trap '' TERM; echo \"ready $PODRUN_WORKER\"; sleep 300"


def record_of(home, job_id: str) -> dict:
    return json.loads((home / "jobs" / job_id / "job.json").read_text())


def exit_codes_cell(job_id: str) -> str:
    """The EXIT CODES column of the job's row in `podrun jobs` (in a pipe: whole rows, two spaces apart)."""
    listed = podrun("jobs", env={key: value for key, value in os.environ.items() if key != "COLUMNS"})
    row = next(line for line in listed.stdout.splitlines() if line.startswith(job_id))
    return re.split(r"\s{2,}", row)[4]


# --- stop grace ----------------------------------------------------------------------------------

def interrupted_once_ready(spec) -> Background:
    """`podrun exec spec`, given Ctrl-C once both workers said they are ready, run to its end (exit 130)."""
    job = Background("exec", spec)
    for index in (0, 1):
        job.wait_for(rf"^\[w{index}\] ready {index}$")
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130
    return job


@pytest.mark.slow
def test_a_stop_announces_its_grace_period_and_names_a_kill_as_a_kill(home, job_file):
    spec = job_file(f"target: {{local: {{workers: 2}}}}\nrun: {IGNORES_TERM}\nstop_grace: 2s\n")
    job = interrupted_once_ready(spec)
    assert "podrun: stopping: SIGTERM sent, waiting up to 2s (stop_grace)" in job.lines
    for index in (0, 1):
        assert (f"podrun: worker {index} (local/w{index}) was killed after the grace period (2s): it had not ended "
                f"on SIGTERM") in job.lines
    assert "left of the grace period" not in job.text and "\x1b" not in job.text  # a pipe: plain lines only
    job_id = job_id_in(job.text)
    assert exit_codes_cell(job_id) == "2 killed after the grace period"
    assert [worker["killed"] for worker in record_of(home, job_id)["workers"]] == [True, True]


def test_a_worker_that_ends_on_sigterm_is_stopped_not_killed(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: echo \"ready $PODRUN_WORKER\"; exec sleep 300\n")
    job = interrupted_once_ready(spec)
    assert "podrun: stopping: SIGTERM sent, waiting up to 30s (stop_grace)" in job.lines
    assert "killed after the grace period" not in job.text
    assert exit_codes_cell(job_id_in(job.text)) == "2 stopped"


def detached_and_ready(job_file, grace_s: int) -> str:
    """The id of a detached job on 2 local workers that ignore SIGTERM, once both said they are ready."""
    spec = job_file(f"target: {{local: {{workers: 2}}}}\nrun: {IGNORES_TERM}\nstop_grace: {grace_s}s\n")
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: all("ready" in podrun("logs", job_id, "--worker", str(i)).stdout for i in (0, 1)),
               "both workers ready")
    return job_id


@pytest.mark.slow
def test_a_detached_stop_announces_the_grace_period_and_records_the_kill(home, job_file):
    job_id = detached_and_ready(job_file, grace_s=1)
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    assert "podrun: stopping: SIGTERM sent, waiting up to 1s (stop_grace)\n" in stopped.stderr
    assert "\x1b" not in stopped.stderr
    assert exit_codes_cell(job_id) == "2 killed after the grace period"


@pytest.mark.slow
def test_on_a_terminal_the_grace_period_counts_down_then_goes(home, job_file):
    spec = job_file(f"target: {{local: {{workers: 2}}}}\nrun: {IGNORES_TERM}\nstop_grace: 3s\n")
    code, written = run_in_terminal(["exec", spec], rows=24, columns=100, interrupt_after=b"ready 1")
    text = written.decode(errors="replace")
    assert code == 130, text
    assert "podrun: stopping: SIGTERM sent, waiting up to 3s (stop_grace)" in text
    seconds_shown = {int(left) for left in re.findall(r"podrun: stopping: (\d)s left of the grace period, then SIGKILL",
                                                      text)}
    assert seconds_shown and seconds_shown <= {1, 2, 3}, text
    # the countdown was a live line: erased (CSI J) before the job's last word, not left among the lines
    last_countdown = text.rindex("left of the grace period")
    assert "\x1b[J" in text[last_countdown:text.index("stopped on every worker")]


@pytest.mark.slow
def test_a_detached_stop_on_a_terminal_counts_down_the_first_workers_grace_period_apart(home, job_file):
    job_id = detached_and_ready(job_file, grace_s=2)
    code, written = run_in_terminal(["stop", job_id], rows=24, columns=100)
    text = written.decode(errors="replace")
    assert code == 0, text
    # worker 1 first, then worker 0 (its agent watches the others): each has its own grace period
    assert text.count("stopping: 2s left of the grace period, then SIGKILL") == 2, text
    assert text.rstrip().endswith(f"podrun: job {job_id} is stopped")


# --- connect failures --------------------------------------------------------------------------

def test_a_connect_failure_names_every_host_that_failed(home, job_file):
    ports = range(1, 5)  # nothing listens on them: each connection is refused at once
    spec = job_file("target: {hosts: [" + ", ".join(f"'127.0.0.1:{port}'" for port in ports) + "]}\nrun: 'true'\n")
    result = podrun("exec", spec)
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr)[-5:] == [
        "podrun: error: 4 of 4 workers failed to connect:",
        *(f"  127.0.0.1:{port}: cannot connect: Connection refused" for port in ports)]


def test_a_connect_failure_on_more_hosts_than_a_screen_holds_counts_the_rest(home, job_file):
    ports = range(1, 41)
    spec = job_file("target: {hosts: [" + ", ".join(f"'127.0.0.1:{port}'" for port in ports) + "]}\nrun: 'true'\n")
    result = podrun("exec", spec)
    assert result.returncode == 1
    lines = stderr_lines_without_traceback(result.stderr)
    heading = lines.index("podrun: error: 40 of 40 workers failed to connect:")
    named = lines[heading + 1:]
    assert len(named) == 21 and named[-1] == "  and 20 more: w20-39"  # a 24-row screen's worth, in a pipe
    assert named[:20] == [f"  127.0.0.1:{port}: cannot connect: Connection refused" for port in range(1, 21)]


# --- the loopback line ------------------------------------------------------------------------

SHOW_VARIABLES = 'echo "gloo=$GLOO_SOCKET_IFNAME nccl=$NCCL_SOCKET_IFNAME"'
LOOPBACK_LINE = ("podrun: set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to eth0 on workers 0, 1 ({ips}): the interface "
                 "of the route to MASTER_ADDR {master}, as the host name resolves to 127.0.0.1 there, which gloo and "
                 "NCCL would advertise to the other workers. To choose otherwise, set either variable in the spec's "
                 "env or with --env (then podrun sets neither)\n")


@pytest.mark.slow
def test_the_loopback_line_says_what_podrun_set_where_for_a_torchrun_job(home, lab, hosts_spec):
    spec = hosts_spec("run: show.py\ndevice: CPU\ntorchrun: {nproc_per_node: 1, port: 29631}\n", hosts=(0, 1),
                      files={"show.py": f"import os\nos.system({SHOW_VARIABLES!r})\n"})
    result = podrun("exec", spec, "--no-collapse")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("gloo=eth0 nccl=eth0") == 2
    ips = f"{lab.hosts[0].ip}, {lab.hosts[1].ip}"
    assert LOOPBACK_LINE.format(ips=ips, master=lab.hosts[0].ip) in result.stderr


@pytest.mark.slow
def test_a_cpu_job_without_torch_gets_the_variables_without_the_line(home, lab, hosts_spec):
    result = podrun("exec", hosts_spec(f"run: sh -c '{SHOW_VARIABLES}'\ndevice: CPU\n", hosts=(0, 1)), "--no-collapse")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("gloo=eth0 nccl=eth0") == 2  # set all the same: harmless where nothing reads them
    assert "SOCKET_IFNAME" not in result.stderr


# --- validate ----------------------------------------------------------------------------------

@pytest.mark.parametrize("target, where", [
    ("local: {workers: 3}", "3 local workers"),
    ("hosts: [10.1.0.7, 'root@gpu-1:2222']", "2 SSH hosts: 10.1.0.7, root@gpu-1:2222"),
    ("tpu: {name: my-pod}", "the TPU VM my-pod"),
    ("tpu: {name: my-pod, accelerator_type: v4-32}", "the TPU VM my-pod (v4-32, created if missing)"),
    ("tpu: {name: ms, accelerator_type: v5p-128, slices: 2}", "the multislice ms (2 slices, v5p-128)"),
])
def test_validate_says_what_the_job_runs_on(home, job_file, target, where):
    spec = job_file(f"name: mine\ntarget: {{{target}}}\nrun: 'true'\n")
    result = podrun("validate", spec)
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"podrun: {spec}: valid; job 'mine' on {where}\n"


# --- success after a restart ---------------------------------------------------------------------

def exec_restarting_failures(job_file, run: str, max_restarts: int):
    """`podrun exec` of a job on 2 local workers that restarts after failures, with little backoff."""
    spec = job_file(f"target: {{local: {{workers: 2}}}}\nrun: '{run}'\nrestarts: {{max: {max_restarts}, on: [failure]}}\n")
    return podrun("exec", spec, env={**os.environ, "PODRUN_RESTART_BACKOFF": "0.1"})


def test_the_success_line_after_a_restart_says_how_many(home, job_file):
    result = exec_restarting_failures(job_file, 'test "$PODRUN_ATTEMPT" = 1 || exit 3', max_restarts=2)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^podrun: job \S+ succeeded after 1 restart, \d+\.\ds in all$", result.stderr, re.MULTILINE)
    followed = podrun("logs", "-f", job_id_in(result.stderr))
    assert followed.returncode == 0
    assert re.search(r"^podrun: job \S+ succeeded after 1 restart, \d+\.\ds in all$", followed.stderr, re.MULTILINE)


# --- logs -f of a stopped job --------------------------------------------------------------------

def test_following_a_detached_job_that_was_stopped_says_who_stopped_it(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: echo \"ready $PODRUN_WORKER\"; exec sleep 300\n")
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    follower = Background("logs", "-f", job_id)
    follower.wait_for(r"^\[w0\] ready 0$")
    follower.wait_for(r"^\[w1\] ready 1$")
    assert podrun("stop", job_id).returncode == 0
    assert follower.finish() == 143  # as `exec` exits when `podrun stop` stops it: no failure of `logs`
    assert re.fullmatch(rf"podrun: job {job_id} stopped by SIGTERM after \d+\.\ds", follower.lines[-1])
    assert record_of(home, job_id)["exit_code"] == 143


# --- logs --tail after torchrun's stop -----------------------------------------------------------

EPOCHS = """
import sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
for epoch in range(10000):
    print(f"rank {dist.get_rank()} epoch {epoch}", flush=True)
    time.sleep(0.2)
"""


@pytest.mark.slow
def test_after_a_stop_logs_tail_keeps_the_ranks_last_lines_above_torchruns_tracebacks(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: epochs.py\nenv: {OMP_NUM_THREADS: 1}\n"
                    "torchrun: {nproc_per_node: 2, port: 29632}\n", files={"epochs.py": EPOCHS})
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: "rank 3 epoch 2" in podrun("logs", job_id, "--worker", "1").stdout, "the ranks at work", 90)
    assert podrun("stop", job_id).returncode == 0
    shown = podrun("logs", job_id, "--worker", "1", "--tail", "4")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    # the ranks' last 4 lines, then torchrun's own last 4 (the end of its SignalException traceback)
    assert sorted(re.sub(r"\d+$", "N", line) for line in lines[:4]) == ["[r2] rank 2 epoch N"] * 2 + [
        "[r3] rank 3 epoch N"] * 2
    assert len(lines) == 8 and "SignalException" in lines[-1]
    assert re.search(r"^podrun: w1: \d+ lines after its ranks' last lines not shown; the last 4:$", shown.stderr,
                     re.MULTILINE)


# --- restarted workers that resumed apart --------------------------------------------------------

# pytorch/examples' multinode tutorial, in brief: rank 0 alone saves the snapshot, in the run directory
# (each worker's own disk); every rank resumes from it if it finds it
RANK_0_SNAPSHOT = """
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
start = torch.load("snapshot.pt")["epoch"] if os.path.exists("snapshot.pt") else 0
print(f"rank {rank} starts at epoch {start}", flush=True)
for epoch in range(start, 6):
    dist.all_reduce(torch.ones(1))
    if rank == 0:
        torch.save({"epoch": epoch + 1}, "snapshot.pt")
    if epoch == 2 and os.environ["PODRUN_ATTEMPT"] == "0" and rank == 1:
        sys.exit(3)
    time.sleep(0.2)
"""


@pytest.mark.slow
def test_a_restart_whose_workers_resumed_from_different_epochs_says_what_probably_happened(home, job_file,
                                                                                            monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.1")
    spec = job_file("target: {local: {workers: 2}}\nrun: train.py\nenv: {OMP_NUM_THREADS: 1}\nstop_grace: 3s\n"
                    "torchrun: {nproc_per_node: 1, port: 29633}\nrestarts: {max: 1, on: [failure]}\n",
                    files={"train.py": RANK_0_SNAPSHOT})
    result = podrun("exec", spec, timeout=180)
    assert result.returncode == 1, result.stderr
    assert "[w0 r0] rank 0 starts at epoch 3" in result.stdout and "[w1 r1] rank 1 starts at epoch 0" in result.stdout
    hint = next(line for line in result.stderr.splitlines() if line.startswith("podrun: attempt 1 (a restart) failed"))
    assert "resumed from different points: a rank lost its peer (closed by peer)" in hint
    assert "saved on one worker's disk only" in hint
    # one hint, where the failure that ended the attempt was named, before podrun gave up
    assert result.stderr.index(hint) < result.stderr.index("podrun: no restart left")


def test_a_restart_that_failed_alone_gets_no_such_hint(home, job_file):
    result = exec_restarting_failures(job_file, 'test "$PODRUN_WORKER" = 1 && exit 3; exec sleep 300', max_restarts=1)
    assert result.returncode == 3, result.stderr
    assert "resumed from different points" not in result.stderr
