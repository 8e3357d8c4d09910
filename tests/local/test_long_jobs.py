"""Long jobs: a detached job fails fast with no launcher left, stops are graceful (SIGTERM once, then
the grace period), torchrun's failed rank decides the exit code, and a taken rendezvous port is
named before anything starts, on local targets too."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time

import pytest

from helpers import Background, job_id_in, podrun, processes_of_job, ps_on_every_host, wait_until, worker_exit

# worker 1 fails after a second; the others run until they are stopped, saying so once per SIGTERM
ONE_FAILS = """\
run: |
  if [ "$PODRUN_WORKER" = 1 ]; then sleep 1; echo "worker 1 fails"; exit 3; fi
  trap 'echo "worker $PODRUN_WORKER got SIGTERM"; exit 143' TERM
  echo "worker $PODRUN_WORKER runs"; sleep 300 & wait
"""


def torchrun_job(job_file, workers: int, port: int, script: str, arguments: str = "", extra: str = ""):
    """A spec running `script` (train.py) under torchrun with 2 ranks per local worker."""
    return job_file(f"target: {{local: {{workers: {workers}}}}}\ntorchrun: {{nproc_per_node: 2, port: {port}}}\n"
                    f"run: train.py {arguments}\n{extra}", files={"train.py": script})


@pytest.mark.slow
def test_a_detached_job_fails_fast_on_its_workers_with_no_launcher_left(home, job_file):
    spec = job_file("target: {local: {workers: 3}}\n" + ONE_FAILS)
    launched = podrun("exec", "--detach", spec)  # the launcher is gone once this returns
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    took = wait_until(lambda: all(worker_exit(home, w, job_id) for w in range(3)), "every worker's exit", timeout=20)
    assert took < 10  # not the 300 s the other workers would run
    assert processes_of_job(job_id) == []
    exits = [worker_exit(home, w, job_id) for w in range(3)]
    assert [e["code"] for e in exits] == [143, 3, 143]
    assert [e["stop_reason"] for e in exits] == ["worker 1 failed with code 3", None, "worker 1 failed with code 3"]
    # `podrun jobs` asks the workers of a running detached job: it shows how and when it ended
    listed = json.loads(podrun("jobs", "--json").stdout)
    record = next(job for job in listed if job["id"] == job_id)
    assert (record["state"], record["exit_code"], record["summary"]) == ("failed", 3, "worker 1 exited with code 3")
    assert record["ended_at"] - record["started_at"] < 10
    followed = podrun("logs", "-f", job_id, "--no-collapse")
    assert followed.returncode == 3
    assert "[w0] worker 0 got SIGTERM" in followed.stdout
    assert followed.stdout.count("got SIGTERM") == 2  # once each: the job's processes got SIGTERM once


def test_a_detached_job_whose_first_worker_is_killed_stops_everywhere(home, job_file):
    """Worker 0's agent holds the watch: when it dies (kill -9), the other agents stop their steps."""
    spec = job_file("target: {local: {workers: 2}}\nrun: sleep 300\n")
    launched = podrun("exec", "--detach", spec)
    job_id = job_id_in(launched.stderr)
    agent_file = home / "local" / "w0" / ".podrun" / "jobs" / job_id / "run.agent"
    wait_until(agent_file.exists, "worker 0's agent pid file")
    os.kill(int(agent_file.read_text().split()[0]), signal.SIGKILL)
    wait_until(lambda: worker_exit(home, 1, job_id), "worker 1 to stop", timeout=20)
    assert worker_exit(home, 1, job_id)["stop_reason"] == "worker 0 failed with code 255"
    listed = json.loads(podrun("jobs", "--json").stdout)
    assert [(job["state"], job["exit_code"], job["summary"]) for job in listed if job["id"] == job_id] == [
        ("failed", 255, "worker 0 was lost (its agent, its host or the link to it)")]
    # the known limit: nothing is left on worker 0 to stop worker 0's own step (the README's Limits)
    left = processes_of_job(job_id)
    for line in left:
        os.kill(int(line.split()[0]), signal.SIGKILL)
    assert [line.split(None, 1)[1].strip() for line in left] == ["sleep 300"]  # worker 0's; nothing of worker 1


@pytest.mark.parametrize("exits, causes, outcome", [
    # podrun stop reached worker 2 first; its exit made worker 0's agent stop worker 1 "for" it
    ([(143, "SIGTERM"), (143, "worker 2 failed with code 143"), (143, "SIGTERM")], [(2, 143)],
     ("stopped", 143, "stopped by SIGTERM")),
    ([(143, "worker 1 failed with code 3"), (3, None), (143, "worker 1 failed with code 3")], [(1, 3), (1, 3)],
     ("failed", 3, "worker 1 exited with code 3")),
    ([None, (143, "worker 0 failed with code 255")], [(0, 255)],
     ("failed", 255, "worker 0 was lost (its agent, its host or the link to it)")),
    # worker 2's link went down: the first worker's agent names it; worker 2, cut off, names worker 0
    ([(143, "worker 2 failed with code 255"), (143, "worker 2 failed with code 255"),
      (143, "worker 0 failed with code 255")], [(2, 255), (2, 255), (0, 255)],
     ("failed", 255, "worker 2 was lost (its agent, its host or the link to it)")),
    ([(0, None), (0, None)], [], ("succeeded", 0, None)),
])
def test_a_detached_jobs_outcome_comes_from_its_workers_exits(home, exits, causes, outcome):
    """exits: (code, stop_reason) per worker, None where the worker left no exit; causes: the failures
    the stopped workers' exit files name, (cause_worker, cause_code), in worker order."""
    from podrun import jobstore
    from podrun.launch.detached import _record_end

    workers = [jobstore.WorkerRecord(index, f"w{index}") for index in range(len(exits))]
    for worker, exit_record in zip(workers, exits):
        worker.exit_code, worker.stop_reason = exit_record or (None, None)
    record = jobstore.JobRecord("j-1", "j", f"local:{len(workers)}", "j.yaml", workers, detached=True)
    record.create()
    _record_end(record, causes, {}, {})
    assert (record.state, record.exit_code, record.summary) == outcome


@pytest.mark.slow
def test_ctrl_c_gives_each_process_sigterm_once_and_the_grace_period_to_save(home, job_file):
    spec = job_file("""\
        target: {local: {workers: 2}}
        run: python3 -u save.py
        """, files={"save.py": """\
import os, signal, sys, time
def save(signum, frame):  # os.write: a print here could land inside the main loop's print
    os.write(1, b"got SIGTERM\\n")
    time.sleep(2)  # longer than the old fixed 5 s would allow for a real checkpoint, scaled down
    with open("checkpoint.tmp", "w") as f:
        f.write("complete")
    os.replace("checkpoint.tmp", "checkpoint")
    os.write(1, b"saved\\n")
    os._exit(0)
signal.signal(signal.SIGTERM, save)
print("training", flush=True)
while True:
    time.sleep(1)
"""})
    job = Background("exec", "--grace", "10", "--no-collapse", spec)
    for index in (0, 1):
        job.wait_for(rf"^\[w{index}\] training$")
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130
    assert job.text.count("got SIGTERM") == 2
    assert job.text.count("saved") == 2
    job_id = job_id_in(job.text)
    assert processes_of_job(job_id) == []


@pytest.mark.slow
def test_torchrun_exit_code_and_error_are_the_failed_ranks_and_lines_carry_the_rank(home, job_file, tmp_path):
    # rank 3 fails once every rank has printed: on a loaded machine fail-fast could otherwise stop a rank whose
    # Python had not reached its print yet (seen once in a fresh-clone .ci/run), and no line of it would exist
    said = tmp_path / "said"
    said.mkdir()
    spec = torchrun_job(job_file, 2, 29531, f"""\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"hello from rank {{rank}}", flush=True)
open(os.path.join({str(said)!r}, str(rank)), "w").close()
if rank == 3:
    while len(os.listdir({str(said)!r})) < 4:
        time.sleep(0.05)
    raise SystemExit("rank 3 gives up: no data in /data/shard-3")
time.sleep(60)
""")
    result = podrun("exec", spec, timeout=120)
    assert result.returncode == 1  # SystemExit with a message exits 1 ... the rank's own code
    assert "worker 1 (local/w1) rank 3 exited with code 1 in run" in result.stderr
    assert "rank 3 gives up: no data in /data/shard-3" in result.stderr.split("job ")[-1]  # in the summary line
    for rank in range(4):
        assert sum(f"hello from rank {rank}" in line for line in result.stdout.splitlines()) == 1


@pytest.mark.slow
def test_torchrun_passes_on_a_ranks_own_exit_code(home, job_file):
    spec = torchrun_job(job_file, 1, 29532, "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(7)\n"
                                            "time.sleep(60)\n")
    result = podrun("exec", spec, timeout=120)
    assert result.returncode == 7, result.stderr
    assert "worker 0 rank 1 exited with code 7" in result.stderr


def test_a_taken_rendezvous_port_is_named_before_anything_starts_on_one_local_worker(home, job_file):
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        spec = job_file(f"""\
            target: {{local: {{workers: 1}}}}
            torchrun: {{nproc_per_node: 1, port: {port}}}
            setup: echo setup ran
            run: train.py
            """, files={"train.py": "print('ran')\n"})
        started = time.monotonic()
        result = podrun("exec", spec)
    assert result.returncode == 1
    assert f"rendezvous port {port} is not free on worker 0" in result.stderr
    assert "setup ran" not in result.stdout and "ran" not in result.stdout
    assert time.monotonic() - started < 10


def test_a_detached_job_on_ssh_hosts_fails_fast_and_says_so_after_its_launcher_is_gone(home, lab, hosts_spec):
    launched = podrun("exec", "--detach", hosts_spec(ONE_FAILS))
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    started = time.monotonic()
    followed = podrun("logs", "-f", job_id, timeout=60)
    assert time.monotonic() - started < 15  # fail-fast on the workers, not the 300 s of the others
    assert followed.returncode == 3, followed.stderr
    assert followed.stderr.strip().splitlines()[-1].startswith(
        f"podrun: job {job_id} failed: worker 1 exited with code 3")
    assert ps_on_every_host(lab, job_id) == []
    listed = json.loads(podrun("jobs", "--json").stdout)
    assert [(job["state"], job["exit_code"]) for job in listed if job["id"] == job_id] == [("failed", 3)]


BAR_SCRIPT = """\
import os, signal, sys, time
rank = os.environ["RANK"]
def save(signum, frame):  # os.write: a print here could land inside the main loop's print
    os.write(1, f"rank {rank} got SIGTERM\\n".encode())
    time.sleep(1)
    os.write(1, f"rank {rank} saved\\n".encode())
    os._exit(0)
signal.signal(signal.SIGTERM, save)
for step in range(1, 51):
    sys.stderr.write(f"\\rrank {rank} step {step}/50 " + "#" * (step // 5))
    sys.stderr.flush()
    time.sleep(0.01)
sys.stderr.write("\\n")
print(f"rank {rank} trained", flush=True)
if "hold" in sys.argv:
    time.sleep(300)
"""


@pytest.mark.slow
def test_under_torchrun_a_ranks_progress_bar_is_one_line_and_ranks_never_share_one(home, job_file):
    spec = torchrun_job(job_file, 2, 29533, BAR_SCRIPT)
    result = podrun("exec", spec, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for rank in range(4):
        worker = rank // 2
        mine = [line for line in lines if line.startswith(f"[w{worker} r{rank}] ")]
        assert mine == [f"[w{worker} r{rank}] rank {rank} step 50/50 ##########", f"[w{worker} r{rank}] rank {rank} trained"]
    # no line per redraw, no empty line, nothing of two ranks in one line; torchrun's own lines are [wN]
    # (its warnings; and, when worker 0's agent and its store leave first, worker 1's exit barrier's trace)
    assert len([line for line in lines if line.startswith(("[w0 r", "[w1 r"))]) == 8, result.stdout
    assert all(re.fullmatch(r"\[w[01] r[0-3]\] rank [0-3] (step 50/50 #+|trained)", line)
               or (re.match(r"\[w[01](-1)?\] ", line) and not re.search(r"rank [0-3] (step|trained)", line))
               for line in lines), result.stdout


@pytest.mark.slow
def test_ctrl_c_under_torchrun_gives_each_rank_sigterm_once(home, job_file):
    spec = torchrun_job(job_file, 2, 29534, BAR_SCRIPT, arguments="hold", extra="stop_grace: 20s\n")
    job = Background("exec", spec)
    for rank in range(4):
        job.wait_for(rf"^\[w{rank // 2} r{rank}\] rank {rank} trained$")
    job.process.send_signal(signal.SIGINT)
    assert job.finish(timeout=60) == 130
    for rank in range(4):
        assert job.text.count(f"rank {rank} got SIGTERM") == 1, job.text
        assert f"rank {rank} saved" in job.text
    assert processes_of_job(job_id_in(job.text)) == []


@pytest.mark.slow
def test_a_detached_torchrun_job_records_the_failed_ranks_own_code(home, job_file):
    spec = torchrun_job(job_file, 2, 29535, "import os, sys, time\nif os.environ['RANK'] == '2': sys.exit(9)\n"
                                            "time.sleep(300)\n")
    launched = podrun("exec", "--detach", spec)
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    followed = podrun("logs", "-f", job_id, timeout=60)
    assert followed.returncode == 9, followed.stderr
    assert f"podrun: job {job_id} failed: worker 1 rank 2 exited with code 9" in followed.stderr
    assert worker_exit(home, 1, job_id)["rank"] == 2
    assert processes_of_job(job_id) == []


def test_torchruns_failure_summary_names_the_rank_and_its_code():
    from podrun.remote.step import torchrun_root_cause

    summary = (b"[rank1]:Traceback ...\nFailures:\n[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 7)\n"
               b"------\nRoot Cause (first observed failure):\n[0]:\n  time      : 2026-11-23_20:12:54\n"
               b"  host      : vm\n  rank      : 3 (local_rank: 1)\n  exitcode  : -9 (pid: 26555)\n"
               b"  error_file: <N/A>\n====\n")
    assert torchrun_root_cause(summary) == (3, 137)  # killed by SIGKILL: 128 + 9, as a shell says
    assert torchrun_root_cause(summary.replace(b"-9 (pid", b"4 (pid")) == (3, 4)
    assert torchrun_root_cause(b"no summary at all\n") is None


@pytest.mark.slow
def test_jobs_does_not_hang_on_a_detached_jobs_workers_that_do_not_answer(home):
    """A listener that accepts and never speaks SSH: `podrun jobs` gives up on it and says so."""
    from podrun import jobstore
    from podrun.launch.detached import REFRESH_TIMEOUT_S

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        endpoint = {"kind": "ssh", "host": "127.0.0.1", "port": silent.getsockname()[1], "user": "root",
                    "identity_file": None, "check_host_keys": False}
        record = jobstore.JobRecord("quiet-1", "quiet", "hosts:1", "quiet.yaml",
                                    [jobstore.WorkerRecord(0, "127.0.0.1", endpoint=endpoint)], detached=True)
        record.create()
        started = time.monotonic()
        listed = podrun("jobs")
    assert time.monotonic() - started < REFRESH_TIMEOUT_S + 5
    assert listed.returncode == 0
    assert "quiet-1" in listed.stdout and "running" in listed.stdout
    assert (f"podrun: job quiet-1: shown as last recorded; its workers could not be asked (no answer within "
            f"{REFRESH_TIMEOUT_S}s)") in listed.stderr


def test_stopping_a_detached_job_whose_first_worker_already_succeeded_records_it_stopped(home):
    # worker 0's agent is the hub the others watch; its run ended well before the stop
    started = podrun("exec", "--local", "3", "--detach", "--", 'if [ "$PODRUN_WORKER" -ge 1 ]; then exec sleep 300; fi')
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: (home / "local" / "w0" / ".podrun" / "jobs" / job_id / "run.exit").exists(), "worker 0's exit")
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0 and f"job {job_id} is stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    record = json.loads((home / "jobs" / job_id / "job.json").read_text())
    assert record["state"] == "stopped" and "lost" not in (record["summary"] or ""), record
    assert podrun("logs", job_id, "-f").returncode == 143  # stopped by SIGTERM, not a lost worker's 255
    assert processes_of_job(job_id) == []


def test_a_killed_supervisor_reads_as_lost_and_stop_still_reaches_the_workers(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: exec sleep 300\nrestarts: {max: 1, on: [failure]}\n")
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0 and "a supervisor" in started.stderr, started.stderr
    job_id = job_id_in(started.stderr)
    record = json.loads((home / "jobs" / job_id / "job.json").read_text())
    os.kill(record["supervisor"]["pid"], signal.SIGKILL)
    wait_until(lambda: "running (supervisor lost, idle " in podrun("jobs").stdout, "podrun jobs to show the supervisor lost")
    assert "succeeded" not in podrun("jobs").stdout
    assert len(processes_of_job(job_id)) >= 2  # the job itself goes on
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0 and "is stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    assert processes_of_job(job_id) == []
