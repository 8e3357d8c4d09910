"""`docker:` jobs in real containers (tests/docker_lab.py): their output and exit codes reach the user,
and once podrun says the job failed or stopped, its containers are gone, even those whose process
ignores SIGTERM (as a container's PID 1 does unless it handles it)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from helpers import Background, job_id_in, podrun, processes_of_job, wait_until

STOP_GRACE_S = 2
REPORT = """\
import os, sys
worker = os.environ["PODRUN_WORKER"]
print(f"worker {worker} sees /etc/os-release: {os.path.exists('/etc/os-release')}", flush=True)
sys.exit(5 if worker == "1" else 0)
"""
# every worker ignores SIGTERM, prints "up" and its directory, and exits 3 once a file named `fail` appears there
STUBBORN = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("up", os.getcwd(), flush=True)
while not os.path.exists("fail"):
    time.sleep(0.01)
print("failing", flush=True)
sys.exit(3)
"""


def docker_spec(job_file, docker, script: str):
    return job_file(f"""
        target: {{local: {{workers: 2}}}}
        docker: {{image: "{docker.image}"}}
        stop_grace: {STOP_GRACE_S}s
        run: python3 script.py
    """, files={"script.py": script})


def leftovers(docker, job_id: str) -> list[str]:
    """The job's containers (`docker ps -a`) and processes (by their environment) that still exist."""
    return docker.containers(f"podrun-{job_id}") + processes_of_job(job_id)


def test_a_docker_job_runs_in_its_container_streams_its_output_and_exits_with_its_code(home, docker, job_file):
    result = podrun("exec", docker_spec(job_file, docker, REPORT))
    assert result.returncode == 5, result.stderr
    job_id = job_id_in(result.stderr)
    # this machine has /etc/os-release, the test image has not
    assert sorted(result.stdout.splitlines()) == [f"[w{i}] worker {i} sees /etc/os-release: False" for i in (0, 1)]
    assert "podrun: worker 1 (local/w1) exited with code 5 in run" in result.stderr.splitlines()
    assert leftovers(docker, job_id) == []


def started_stubborn_job(docker, job_file) -> tuple[Background, str, list[Path]]:
    """The job running in its containers, and each worker's directory (as the container and this machine see it)."""
    job = Background("exec", docker_spec(job_file, docker, STUBBORN))
    run_dirs = [Path(job.wait_for(rf"^\[w{index}\] up ").split(" ", 2)[2]) for index in (0, 1)]
    return job, job_id_in(job.text), run_dirs


def test_fail_fast_returns_only_once_the_other_workers_container_is_gone(home, docker, job_file):
    job, job_id, run_dirs = started_stubborn_job(docker, job_file)
    assert len(docker.containers(f"podrun-{job_id}")) == 2
    (run_dirs[1] / "fail").touch()
    assert job.finish() == 3
    assert leftovers(docker, job_id) == []  # at the moment podrun exits, not later
    assert "every other worker was stopped" in job.text


def test_ctrl_c_returns_only_once_every_container_is_gone(home, docker, job_file):
    job, job_id, _ = started_stubborn_job(docker, job_file)
    interrupted_at = time.monotonic()
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130
    assert leftovers(docker, job_id) == []
    # SIGTERM is ignored: docker stop waits the whole grace period, then kills
    assert STOP_GRACE_S <= time.monotonic() - interrupted_at < STOP_GRACE_S + 3


def test_stop_of_a_detached_job_returns_only_once_every_container_is_gone(home, docker, job_file):
    launched = podrun("exec", "--detach", docker_spec(job_file, docker, STUBBORN))
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    job_logs = [home / "local" / f"w{index}" / ".podrun" / "jobs" / job_id / "output.log" for index in (0, 1)]
    wait_until(lambda: all(log.exists() and log.read_text().startswith("up ") for log in job_logs), "both workers up",
               timeout=60)
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    assert leftovers(docker, job_id) == []
    assert stopped.stdout.strip() == f"podrun: job {job_id} is stopped"



def test_stacks_of_a_docker_job_dump_its_containers_python_processes(home, docker, job_file):
    """The container's processes are the docker daemon's children, not the agent's: stacks finds them by
    the container's name, and the host's py-spy dumps them."""
    job, job_id, _ = started_stubborn_job(docker, job_file)
    shown = podrun("stacks", job_id, "--all")
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("<module> (script.py:5)") == 2, shown.stdout  # each container's python, by py-spy
    assert leftovers(docker, job_id) == []
