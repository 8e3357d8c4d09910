"""The fault matrix (docs/benchmarks.md lists its times): each fault injected for real on the lab
hosts, three times (PODRUN_FAULT_ATTEMPTS), and after each `ps` on every host must show nothing of the job. The seconds from
each fault to its expected outcome are collected and printed at the end of the run
(conftest.FAULT_TIMES). The rows of a job that saves a checkpoint on SIGTERM run once each, on the
lab hosts and in real containers (tests/docker_lab.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import (
    REPO,
    Background,
    job_id_in,
    podrun,
    processes_of_job,
    ps_on_every_host,
    stderr_lines_without_traceback,
    wait_until,
)

# three in CI keeps the suite's time in bounds; PODRUN_FAULT_ATTEMPTS=10 hunts a race that shows 1 time in 6;
# then once more with workers 1 and 2 behind worker 0, a control tree's relay (launch/control_tree.py)
TREE = "tree"
ATTEMPTS = [*range(int(os.environ.get("PODRUN_FAULT_ATTEMPTS", "3"))), TREE]
KEEPALIVE_TIMEOUT_S = 15  # the launcher: keepalives 5 s apart, given up after 3 intervals (podrun/transport/ssh.py)
HEARTBEAT_TIMEOUT_S = 20  # a worker: no word from the launcher (podrun/launch.py)
repeated = pytest.mark.parametrize("attempt", ATTEMPTS)
pytestmark = pytest.mark.slow  # minutes: every fault three times


@pytest.fixture(autouse=True)
def reach(request, monkeypatch) -> str:
    """How the launcher reaches the workers: "direct", or through a control tree (the TREE attempt)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec and callspec.params.get("attempt") == TREE:
        monkeypatch.setenv("PODRUN_CONTROL_TREE", "2")
        monkeypatch.setenv("PODRUN_CONTROL_TREE_FANOUT", "2")
        return TREE
    return "direct"


def started_job(hosts_spec, run: str, files: dict[str, str] | None = None,
                name: str = "job") -> tuple[Background, str]:
    """podrun exec on hosts 0-2 in the background, once every worker printed `up <index>`."""
    body = "".join(f"  {line}\n" for line in ['echo "up $PODRUN_WORKER"', *run.splitlines()])
    job = Background("exec", "--no-collapse", hosts_spec(f"name: {name}\nrun: |\n{body}", files=files))
    for index in range(3):
        job.wait_for(rf"^\[w{index}\] up {index}$")
    return job, job_id_in(job.text)


def step_pid(job_id: str, worker: int) -> int:
    """The pid of the worker's step (the process the agent started), from the environments in /proc.
    Polled: while the step's shell execs its last command, its /proc environ reads empty for a moment."""
    wanted = {f"PODRUN_JOB_ID={job_id}".encode(), f"PODRUN_WORKER={worker}".encode()}

    def find() -> int | None:
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    environ = set(handle.read().split(b"\0"))
                if wanted <= environ and os.getsid(int(entry)) == int(entry):
                    return int(entry)
            except OSError:
                continue
        return None

    found = []
    wait_until(lambda: found.append(find()) or found[-1] is not None,
               f"the step process of worker {worker} of {job_id}", timeout=5)
    return found[-1]


@repeated
def test_a_worker_killed_with_sigkill_fails_the_job_naming_it(home, lab, hosts_spec, fault_time, attempt):
    job, job_id = started_job(hosts_spec, "exec sleep 300")
    killed_at = time.monotonic()
    os.kill(step_pid(job_id, 1), signal.SIGKILL)
    assert job.finish() == 137
    fault_time("worker process kill -9 -> job failed", time.monotonic() - killed_at)
    assert time.monotonic() - killed_at < 5
    assert f"worker 1 ({lab.hosts[1].ip}) was killed by SIGKILL (exit code 137) in run" in job.text
    assert ps_on_every_host(lab, job_id) == []


@repeated
def test_a_worker_exiting_3_stops_the_others_and_podrun_exits_3(home, lab, hosts_spec, fault_time, attempt):
    job, job_id = started_job(hosts_spec, 'if [ "$PODRUN_WORKER" = 2 ]; then\n'
                                          '  while [ ! -e ~/fail-$PODRUN_JOB_ID ]; do sleep 0.01; done\n'
                                          '  echo "disk full"; exit 3\nfi\nexec sleep 300')
    failed_at = time.monotonic()
    (lab.hosts[2].home / f"fail-{job_id}").touch()  # every worker is up: now worker 2 fails
    assert job.finish() == 3
    fault_time("worker exits 3 -> others stopped, podrun exits 3", time.monotonic() - failed_at)
    assert f"worker 2 ({lab.hosts[2].ip}) exited with code 3 in run" in job.text
    assert "  disk full" in job.text
    assert ps_on_every_host(lab, job_id) == []
    record = json.loads((home / "jobs" / job_id / "job.json").read_text())
    assert [(w["exit_code"], w["signal"]) for w in record["workers"]] == [(143, "SIGTERM"), (143, "SIGTERM"), (3, None)]
    for index in (0, 1):  # each host's agent recorded why its job ended
        exit_record = json.loads((lab.hosts[index].home / ".podrun" / "jobs" / job_id / "run.exit").read_text())
        assert exit_record["stop_reason"] == "stop requested"


@repeated
def test_ctrl_c_stops_every_worker_exits_130_and_the_logs_are_complete(home, lab, hosts_spec, fault_time, attempt):
    job, job_id = started_job(hosts_spec, 'i=0; while true; do echo "line $i"; i=$((i+1)); sleep 0.01; done')
    for index in range(3):
        job.wait_for(rf"^\[w{index}\] line 20$")
    interrupted_at = time.monotonic()
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130
    fault_time("Ctrl-C -> every worker stopped, exit 130", time.monotonic() - interrupted_at)
    assert ps_on_every_host(lab, job_id) == []
    for index, host in enumerate(lab.hosts[:3]):
        local = (home / "jobs" / job_id / f"w{index}.log").read_bytes()
        remote = (host.home / ".podrun" / "jobs" / job_id / "output.log").read_bytes()
        assert local == remote  # everything the worker printed up to the stop reached the local log
        lines = local.decode().splitlines()
        assert lines[0] == f"up {index}" and lines[1:] == [f"line {i}" for i in range(len(lines) - 1)]


@repeated
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_podrun_terminated_or_killed_leaves_nothing_running(home, lab, hosts_spec, fault_time, signum, attempt):
    job, job_id = started_job(hosts_spec, "exec sleep 300")
    signalled_at = time.monotonic()
    job.process.send_signal(signum)
    code = job.finish()
    stopped_after = wait_until(lambda: ps_on_every_host(lab, job_id) == [], "the workers to stop",
                               timeout=HEARTBEAT_TIMEOUT_S + 10)
    fault_time(f"{signum.name} to podrun -> workers stopped", time.monotonic() - signalled_at)
    assert stopped_after < (5 if signum == signal.SIGTERM else HEARTBEAT_TIMEOUT_S)
    state = {entry["id"]: entry["state"] for entry in json.loads(podrun("jobs", "--json").stdout)}[job_id]
    if signum == signal.SIGTERM:
        assert code == 143 and state == "stopped"
    else:  # killed: it could record nothing, so `jobs` sees a running job without its launcher
        assert code == -signal.SIGKILL and state == "lost"


@repeated
def test_a_host_whose_link_goes_down_fails_the_job_and_stops_on_its_own(home, lab, hosts_spec, fault_time, attempt):
    job, job_id = started_job(hosts_spec, "exec sleep 300")
    lost_at = time.monotonic()
    subprocess.run(["ip", "-n", lab.hosts[2].namespace, "link", "set", "eth0", "down"], check=True)
    try:
        assert job.finish(timeout=60) == 255
        fault_time("link down -> job failed naming the host", time.monotonic() - lost_at)
        assert time.monotonic() - lost_at < KEEPALIVE_TIMEOUT_S + 5
        assert f"worker 2 ({lab.hosts[2].ip}) lost its connection" in job.text, job.text
        # the cut-off host hears no heartbeat and stops the job itself
        wait_until(lambda: ps_on_every_host(lab, job_id) == [], "the cut-off host to stop its job",
                   timeout=HEARTBEAT_TIMEOUT_S + 10)
        fault_time("link down -> cut-off host stopped its job", time.monotonic() - lost_at)
        exit_record = json.loads((lab.hosts[2].home / ".podrun" / "jobs" / job_id / "run.exit").read_text())
        assert exit_record["stop_reason"] == f"no word from the launcher for {HEARTBEAT_TIMEOUT_S}s"
    finally:
        subprocess.run(["ip", "-n", lab.hosts[2].namespace, "link", "set", "eth0", "up"], check=True)


def test_a_detached_job_whose_host_loses_its_link_stops_everywhere_with_no_launcher(home, lab, hosts_spec, fault_time):
    """The agents' watch (hub.Hub) notices a host gone silent by TCP keepalive: the others stop the
    job, and the cut-off host stops its own part, as no word comes from worker 0's agent."""
    launched = podrun("exec", "--detach", hosts_spec('run: |\n  echo "up $PODRUN_WORKER"\n  exec sleep 300\n'))
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    exit_files = [host.home / ".podrun" / "jobs" / job_id / "run.exit" for host in lab.hosts[:3]]
    lost_at = time.monotonic()
    subprocess.run(["ip", "-n", lab.hosts[2].namespace, "link", "set", "eth0", "down"], check=True)
    try:
        wait_until(lambda: ps_on_every_host(lab, job_id) == [], "every host to stop the job", timeout=60)
        fault_time("detached, link down -> every host stopped", time.monotonic() - lost_at)
        assert time.monotonic() - lost_at < KEEPALIVE_TIMEOUT_S + 15
        # each agent records the end once the job's processes are gone
        wait_until(lambda: all(path.exists() for path in exit_files), "every agent to record the end", timeout=15)
        assert json.loads(exit_files[2].read_text())["stop_reason"] == "worker 0 failed with code 255"
    finally:
        subprocess.run(["ip", "-n", lab.hosts[2].namespace, "link", "set", "eth0", "up"], check=True)
    jobs = podrun("jobs", "--json")
    listed = json.loads(jobs.stdout)
    assert [(job["state"], job["summary"]) for job in listed if job["id"] == job_id] == [
        ("failed", "worker 2 was lost (its agent, its host or the link to it)")], jobs.stderr


@repeated
def test_sshd_stopped_on_one_host_is_one_line_and_nothing_starts(home, lab, hosts_spec, fault_time, attempt, reach):
    spec = hosts_spec("run: echo started; sleep 300")
    jobs_before = [sorted((host.home / ".podrun" / "jobs").glob("*")) for host in lab.hosts]
    lab.stop_sshd(1)
    try:
        started = time.monotonic()
        result = podrun("exec", spec)
        fault_time("sshd stopped -> one-line error", time.monotonic() - started)
    finally:
        lab.start_sshd(1)
    assert result.returncode == 1
    through = f" through relay worker 0 ({lab.hosts[0].ip})" if reach == TREE else ""
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        f"podrun: error: {lab.hosts[1].ip}: cannot connect{through}: Connection refused")
    assert "started" not in result.stdout
    # no agent ran anywhere: it would have made a job directory on its host
    assert [sorted((host.home / ".podrun" / "jobs").glob("*")) for host in lab.hosts] == jobs_before


@repeated
def test_a_setup_failing_on_one_host_means_run_starts_nowhere(home, lab, hosts_spec, attempt):
    spec = hosts_spec("""
        setup: if [ "$PODRUN_WORKER" = 1 ]; then echo "no space"; exit 4; fi
        run: touch ~/ran-$PODRUN_JOB_ID
    """)
    result = podrun("exec", spec)
    assert result.returncode == 4
    job_id = job_id_in(result.stderr)
    assert f"worker 1 ({lab.hosts[1].ip}) exited with code 4 in setup" in result.stderr
    assert not any((host.home / f"ran-{job_id}").exists() for host in lab.hosts)
    assert ps_on_every_host(lab, job_id) == []


@repeated
def test_two_jobs_at_once_keep_their_code_logs_and_processes_apart(home, lab, hosts_spec, attempt):
    run = 'cat which.txt; pwd; echo "group $(ps -o pgid= $$)"; exec sleep 300'
    first, first_id = started_job(hosts_spec, run, files={"which.txt": "first\n"})
    # other code under the same name would be refused (test_rundir.py): each name has one run directory
    second, second_id = started_job(hosts_spec, run, files={"which.txt": "second\n"}, name="second")
    for job in (first, second):
        for index in range(3):
            job.wait_for(rf"^\[w{index}\] group ")
    code_dirs = {job_id: {line.split("] ", 1)[1] for line in job.lines if re.match(r"^\[w\d\] /", line)}
                 for job_id, job in ((first_id, first), (second_id, second))}
    assert len(code_dirs[first_id]) == len(code_dirs[second_id]) == 1 and code_dirs[first_id] != code_dirs[second_id]
    groups = {job_id: {line for line in job.lines if " group " in line} for job_id, job in
              ((first_id, first), (second_id, second))}
    assert not groups[first_id] & groups[second_id]
    assert "[w0] second" in second.lines and "[w0] second" not in first.lines

    stopped = podrun("stop", first_id)
    assert stopped.returncode == 0, stopped.stderr
    assert first.finish() == 143
    assert ps_on_every_host(lab, first_id) == []
    assert len(ps_on_every_host(lab, second_id)) >= 3 and second.process.poll() is None  # untouched
    assert (home / "jobs" / first_id / "w0.log").read_text().startswith("up 0\nfirst\n")
    assert (home / "jobs" / second_id / "w0.log").read_text().startswith("up 0\nsecond\n")
    second.process.send_signal(signal.SIGINT)
    assert second.finish() == 130
    assert ps_on_every_host(lab, second_id) == []


@repeated
def test_a_detached_job_is_followed_and_stopped_from_other_terminals(home, lab, hosts_spec, attempt):
    spec = hosts_spec('run: |\n  i=0; while true; do echo "tick $PODRUN_WORKER $i"; i=$((i+1)); sleep 0.05; done\n')
    launched = podrun("exec", "--detach", spec)
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    follower = Background("logs", "-f", job_id)
    follower.wait_for(r"^\[w2\] tick 2 5$")
    follower.process.send_signal(signal.SIGINT)  # the laptop lid closes
    follower.finish()
    resumed = Background("logs", "-f", job_id, "--worker", "2")
    resumed.wait_for(r"^tick 2 40$")
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    assert resumed.finish() in (0, 143)
    assert ps_on_every_host(lab, job_id) == []
    log = (home / "jobs" / job_id / "w2.log").read_text().splitlines()
    assert log == [f"tick 2 {i}" for i in range(len(log))]  # resumed where the local copy ended: no gap, no repeat
    assert log == (lab.hosts[2].home / ".podrun" / "jobs" / job_id / "output.log").read_text().splitlines()


def flood_bytes(worker: int) -> bytes:
    line = f"w{worker} %09d ".encode() + b"x" * 90 + b"\n"
    return (b"".join(line % i for i in range(1_000_000)) + b"binary \xff\xfe\x00\x1b[31m bytes\n"
            + b"no newline at the end")


@repeated
def test_100_mb_binary_and_unterminated_output_reach_the_log_and_never_mix_lines(home, lab, hosts_spec, attempt):
    script = ("import sys\nworker = sys.argv[1].encode()\nout = sys.stdout.buffer\n"
              "line = b'w' + worker + b' %09d ' + b'x' * 90 + b'\\n'\n"
              "for i in range(1_000_000):\n    out.write(line % i)\n"
              "out.write(b'binary \\xff\\xfe\\x00\\x1b[31m bytes\\n')\nout.write(b'no newline at the end')\n")
    spec = hosts_spec('run: python3 flood.py "$PODRUN_WORKER"', hosts=(0, 1), files={"flood.py": script})
    result = podrun("exec", spec, "--no-collapse", text=False, timeout=300)  # each worker's own lines, counted
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    job_id = job_id_in(result.stderr.decode())
    for index in (0, 1):
        expected, logged = flood_bytes(index), (home / "jobs" / job_id / f"w{index}.log").read_bytes()
        if logged != expected:  # where they part, not 100 MB of diff
            at = next((i for i, (a, b) in enumerate(zip(logged, expected)) if a != b), min(len(logged), len(expected)))
            raise AssertionError(f"w{index}.log: {len(logged)} bytes, {len(expected)} expected; they differ from byte "
                                 f"{at}: {logged[max(at - 120, 0):at + 120]!r} against "
                                 f"{expected[max(at - 120, 0):at + 120]!r}")
    pattern = re.compile(rb"^\[w(\d)\] (?:w(\d) \d{9} x{90}|binary .* bytes|no newline at the end)$")
    counts = [0, 0]
    for line in result.stdout.split(b"\n")[:-1] if result.stdout.endswith(b"\n") else result.stdout.split(b"\n"):
        match = pattern.match(line)
        assert match and (match[2] is None or match[1] == match[2]), line[:200]  # whole lines, one worker each
        counts[int(match[1])] += 1
    assert counts == [1_000_002, 1_000_002]


CHECKPOINT_BYTES = b"".join(bytes([chunk]) * 65536 for chunk in range(20))
# on SIGTERM, writes the checkpoint in 20 chunks over 2 s, then renames it into place and prints its digest;
# until then waits for a file telling it to fail (the fail-fast row). The handler writes with os.write: a
# SIGTERM that lands while print("up") still holds stdout's lock would make a print in it raise
# "reentrant call inside BufferedWriter" (seen once in a full run)
SAVES_A_CHECKPOINT_ON_SIGTERM = """\
import hashlib, os, signal, sys, time
job_id = os.environ["PODRUN_JOB_ID"]

def save_checkpoint(signum, frame):
    os.write(1, b"got SIGTERM, saving checkpoint\\n")
    with open(f"ckpt-{job_id}.tmp", "wb") as checkpoint:
        for chunk in range(20):
            checkpoint.write(bytes([chunk]) * 65536)
            checkpoint.flush()
            time.sleep(0.1)
    os.replace(f"ckpt-{job_id}.tmp", f"ckpt-{job_id}")
    with open(f"ckpt-{job_id}", "rb") as checkpoint:
        saved = checkpoint.read()
    os.write(1, f"checkpoint saved {len(saved)} {hashlib.sha256(saved).hexdigest()}\\n".encode())
    os._exit(0)

signal.signal(signal.SIGTERM, save_checkpoint)
print("up", flush=True)
while not os.path.exists(f"fail-{job_id}"):
    time.sleep(0.01)
sys.exit(3)
"""


@dataclass
class Placement:
    """Where the checkpointing job runs: on lab hosts, or on local workers in containers."""
    name: str
    spec: Path
    workers: int
    home_of: Callable[[int], Path]  # what worker i has as its home, seen from here
    leftovers: Callable[[str], list[str]]  # what is left of a job: processes, containers

    def run_dir(self, worker: int) -> Path:
        return self.home_of(worker) / "podrun" / "ckpt" / "run"

    def worker_log(self, worker: int, job_id: str) -> Path:
        """Every byte the worker's job printed, as its agent keeps it (attached or detached)."""
        return self.home_of(worker) / ".podrun" / "jobs" / job_id / "output.log"


@pytest.fixture(params=[pytest.param("hosts", marks=pytest.mark.lab), pytest.param("docker", marks=pytest.mark.docker)])
def placement(request, home, job_file) -> Placement:
    body = "name: ckpt\nstop_grace: 10s\nrun: python3 ckpt.py\n"
    files = {"ckpt.py": SAVES_A_CHECKPOINT_ON_SIGTERM}
    if request.param == "hosts":
        lab = request.getfixturevalue("lab")
        return Placement("hosts", request.getfixturevalue("hosts_spec")(body, files=files), 3,
                         lambda worker: lab.hosts[worker].home, lambda job_id: ps_on_every_host(lab, job_id))
    docker = request.getfixturevalue("docker")
    spec = job_file(body + f"target: {{local: {{workers: 2}}}}\ndocker: {{image: '{docker.image}'}}\n", files=files)
    return Placement("docker", spec, 2, lambda worker: home / "local" / f"w{worker}",
                     lambda job_id: docker.containers(f"podrun-{job_id}") + processes_of_job(job_id))


def started_checkpointing_job(placement: Placement) -> tuple[Background, str]:
    job = Background("exec", "--no-collapse", placement.spec)
    for index in range(placement.workers):
        job.wait_for(rf"^\[w{index}\] up$")
    return job, job_id_in(job.text)


def assert_checkpoints_complete(placement: Placement, job_id: str, stopped: range) -> None:
    """Each stopped worker got SIGTERM once and saved its whole checkpoint; nothing of the job is left."""
    assert placement.leftovers(job_id) == []
    digest = hashlib.sha256(CHECKPOINT_BYTES).hexdigest()
    for worker in stopped:
        output = placement.worker_log(worker, job_id).read_text().splitlines()
        assert output == ["up", "got SIGTERM, saving checkpoint", f"checkpoint saved {len(CHECKPOINT_BYTES)} {digest}"]
        assert (placement.run_dir(worker) / f"ckpt-{job_id}").read_bytes() == CHECKPOINT_BYTES
        assert not (placement.run_dir(worker) / f"ckpt-{job_id}.tmp").exists()


def test_a_checkpoint_saved_on_sigterm_is_complete_after_ctrl_c(home, placement, fault_time):
    job, job_id = started_checkpointing_job(placement)
    interrupted_at = time.monotonic()
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130
    fault_time(f"checkpoint on SIGTERM ({placement.name}): Ctrl-C -> saved, exit 130", time.monotonic() - interrupted_at)
    assert_checkpoints_complete(placement, job_id, range(placement.workers))


def test_a_checkpoint_saved_on_sigterm_is_complete_after_podrun_stop(home, placement, fault_time):
    launched = podrun("exec", "--detach", placement.spec)
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    logs = [placement.worker_log(worker, job_id) for worker in range(placement.workers)]
    wait_until(lambda: all(log.exists() and log.read_text() == "up\n" for log in logs), "every worker up", timeout=60)
    stopping_at = time.monotonic()
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    fault_time(f"checkpoint on SIGTERM ({placement.name}): stop -> saved", time.monotonic() - stopping_at)
    assert_checkpoints_complete(placement, job_id, range(placement.workers))


def test_a_checkpoint_saved_on_sigterm_is_complete_after_fail_fast(home, placement, fault_time):
    job, job_id = started_checkpointing_job(placement)
    failing = placement.workers - 1
    failed_at = time.monotonic()
    (placement.run_dir(failing) / f"fail-{job_id}").touch()
    assert job.finish() == 3
    fault_time(f"checkpoint on SIGTERM ({placement.name}): a worker exits 3 -> others saved, exit 3",
               time.monotonic() - failed_at)
    assert_checkpoints_complete(placement, job_id, range(failing))
    assert placement.worker_log(failing, job_id).read_text() == "up\n"
    assert not (placement.run_dir(failing) / f"ckpt-{job_id}").exists()


def preemptible_job(job_file, tmp_path: Path, restarts: int) -> tuple[Background, Path]:
    """configs/tpu-spot-restarts.yaml's job (examples/resume/train.py) on a spot v4-16 (2 lab hosts) that
    exec creates and deletes, its checkpoints in a directory that outlives the VMs (a bucket's stand-in),
    started once both workers are past step 2."""
    bucket = tmp_path / "bucket"
    spec = job_file(f"name: spot-train\n"
                    f"target: {{tpu: {{name: spot-train, accelerator_type: v4-16, spot: true}}}}\n"
                    f"ssh: {{user: root}}\nworkdir: {REPO / 'examples' / 'resume'}\n"
                    f"env: {{CHECKPOINT_DIR: '{bucket}', STEP_SECONDS: '0.1',"
                    f" PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}\n"
                    f"run: python3 train.py 40\nrestarts: {{max: {restarts}}}\ndelete_after: always\n")
    job = Background("exec", "--no-collapse", spec)
    for index in range(2):
        job.wait_for(rf"^\[w{index}\] step 2$")
    return job, bucket


def assert_nothing_left(tpu_api, lab, job_id: str) -> None:
    assert ps_on_every_host(lab, job_id) == []
    deadline = time.monotonic() + 30
    while tpu_api.queued or tpu_api.nodes:  # deletions finish on the stand-in's clock
        assert time.monotonic() < deadline, (list(tpu_api.queued), list(tpu_api.nodes))
        with tpu_api.lock:
            tpu_api._advance()
        time.sleep(0.1)


@repeated
def test_a_preempted_spot_tpu_is_created_again_and_the_job_resumes_from_its_checkpoint(
        home, tpu_api, lab, job_file, tmp_path, fault_time, attempt):
    job, bucket = preemptible_job(job_file, tmp_path, restarts=1)
    preempted_at = time.monotonic()
    tpu_api.preempt("spot-train")
    for index in range(2):
        resumed = job.wait_for(rf"^\[w{index}\] attempt 1: resuming at step \d+ of 40$", timeout=90)
        assert int(resumed.split()[-3]) >= 2
    fault_time("preempted mid-run -> TPU created again, run restarted everywhere", time.monotonic() - preempted_at)
    assert job.finish(timeout=120) == 0, job.text
    assert "preempted" in job.text and "restart 1 of 1" in job.text
    assert all(json.loads((bucket / f"worker-{index}.json").read_text()) == {"step": 40} for index in range(2))
    assert_nothing_left(tpu_api, lab, job_id_in(job.text))


@repeated
def test_a_preempted_spot_tpu_with_no_restart_left_ends_the_job_preempted_and_is_deleted(
        home, tpu_api, lab, job_file, tmp_path, fault_time, attempt):
    job, _ = preemptible_job(job_file, tmp_path, restarts=0)
    preempted_at = time.monotonic()
    tpu_api.preempt("spot-train")
    assert job.finish(timeout=90) == 75, job.text
    fault_time("preempted, no restart left -> exit 75, TPU deleted", time.monotonic() - preempted_at)
    assert "job spot-train-" in job.text and "preempted: TPU VM spot-train was preempted" in job.text
    assert_nothing_left(tpu_api, lab, job_id_in(job.text))
