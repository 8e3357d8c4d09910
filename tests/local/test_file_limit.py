"""The launcher's limit on open files (podrun/file_limit.py): raised to the hard limit, and a hard limit
too low for the job refused in one line before anything starts. Each podrun runs under a real `ulimit`
set by the shell that starts it, as a user's shell would."""

from __future__ import annotations

import os
import pwd
import re
import shlex
import subprocess
import sys

import pytest

from podrun import file_limit

from helpers import REPO, job_id_in

WORKER_LINE = re.compile(r"^\[w(\d+)\] +(.*)$")  # the prefix is padded to the widest worker's


def said(stdout: str) -> set[tuple[int, str]]:
    """(worker, line) for each line the workers printed."""
    return {(int(match[1]), match[2]) for match in map(WORKER_LINE.match, stdout.splitlines()) if match}


def podrun_under(limits: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real CLI, started by a shell that first ran `limits` (such as `ulimit -Sn 256`)."""
    command = f"{limits} && exec {shlex.quote(sys.executable)} -m podrun {shlex.join(map(str, args))}"
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.mark.slow  # 200 local workers: 4-6 s here
def test_200_local_workers_run_under_a_soft_limit_of_256(home):
    # macOS's default: soft 256, a hard limit far above; each worker says which soft limit its job got
    result = podrun_under("ulimit -Sn 256", "exec", "--local", "200", "--",
                          "sh", "-c", 'echo "worker $PODRUN_WORKER ran, soft limit $(ulimit -Sn)"')
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Too many open files" not in result.stderr
    # the job meets the limit it would meet without podrun, not the one podrun raised for itself
    missing = {(index, f"worker {index} ran, soft limit 256") for index in range(200)} - said(result.stdout)
    assert not missing, f"{sorted(missing)[:5]}...: {result.stdout[-2000:]}"


def test_a_hard_limit_too_low_is_one_line_before_anything_starts(home):
    result = podrun_under("ulimit -n 64", "exec", "--local", "200", "--", "true")
    need = file_limit.needed(["local"] * 200, processes=2, files=1)
    user = pwd.getpwuid(os.getuid()).pw_name
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"podrun: error: 200 local workers need about {need:,} open files at once, but podrun may open only 64 "
        f"(hard limit: 64); raise the limit: `ulimit -n {need}` in a shell whose hard limit allows it, or raise the "
        f"hard limit: `{user} hard nofile {need}` in /etc/security/limits.conf (then log in again), or "
        f"LimitNOFILE={need} for a systemd service"]
    assert not (home / "jobs").exists() or not any((home / "jobs").iterdir())  # no job recorded
    assert not (home / "local").exists()  # no worker's directory made, nothing started


def test_a_tpu_is_not_created_for_a_job_the_hard_limit_cannot_run(home, job_file):
    # a v4-4096 has 512 workers; podrun would create it (accelerator_type), but stops before asking Google
    # anything
    spec = job_file("""
        target: {tpu: {name: big, zone: us-central2-b, project: a-project, accelerator_type: v4-4096}}
        run: python3 train.py
    """, files={"train.py": "print('training')\n"})
    need = file_limit.needed(["ssh"] * 512, processes=2, files=1)
    result = podrun_under("ulimit -n 256", "exec", spec, "--down")  # --down: nor is one deleted
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith(f"podrun: error: 512 TPU workers need about {need:,} open files at once, "
                                    f"but podrun may open only 256 (hard limit: 256); ")
    assert len(result.stderr.splitlines()) == 1  # no word from Google: nothing was asked of it


@pytest.mark.slow  # shipping to 100 local workers: ~10 s here
def test_what_podrun_counts_for_a_job_is_enough_for_its_peak(home, job_file):
    """The hard limit set to exactly what podrun says a job needs: the heaviest moment of a launch
    (every worker's agent waiting while the code ships to it through the relay) fits under it."""
    workers = 100
    spec = job_file(f"""
        target: {{local: {{workers: {workers}}}}}
        run: python3 check.py
    """, files={"check.py": "import os; print('checked', os.environ['PODRUN_WORKER'])\n"})
    need = file_limit.needed(["local"] * workers, processes=2, files=1)
    result = podrun_under(f"ulimit -n {need}", "exec", spec)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"shipped code (1 file) to {workers} workers" in result.stderr
    assert {(index, f"checked {index}") for index in range(workers)} <= said(result.stdout)


@pytest.mark.slow  # a detached job on 100 local workers, then logs and stop: ~10 s here
def test_logs_and_stop_of_a_detached_job_raise_the_limit_too(home):
    started = podrun_under("ulimit -Sn 128", "exec", "--detach", "--local", "100", "--",
                           "sh", "-c", 'echo "worker $PODRUN_WORKER up"; exec sleep 600')
    assert started.returncode == 0, started.stderr[-3000:]
    job_id = job_id_in(started.stderr)
    logs = podrun_under("ulimit -Sn 128", "logs", job_id)
    assert logs.returncode == 0, logs.stderr[-3000:]
    assert {(index, f"worker {index} up") for index in range(100)} <= said(logs.stdout)
    stopped = podrun_under("ulimit -Sn 128", "stop", job_id)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert "Too many open files" not in logs.stderr + stopped.stderr


def test_ssh_connections_raise_the_limit_and_a_low_hard_limit_is_refused(home, hosts_spec):
    spec = hosts_spec("run: echo \"host $PODRUN_WORKER ran\"\n", hosts=(0, 1, 2, 3))
    # a soft limit that the interpreter and podrun's own files take up: every connection needs one more
    result = podrun_under("ulimit -Sn 12", "exec", spec)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {(index, f"host {index} ran") for index in range(4)} <= said(result.stdout)
    need = file_limit.needed(["ssh"] * 4, processes=2, files=1)
    refused = podrun_under("ulimit -n 12", "exec", spec)
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"podrun: error: 4 SSH hosts need about {need} open files at once, "
                                     f"but podrun may open only 12 (hard limit: 12)")
    assert len(refused.stderr.splitlines()) == 1


def test_the_local_target_takes_up_to_1024_workers(home, job_file):
    spec = job_file("target: {local: {workers: 1024}}\nrun: 'true'\n")
    assert podrun_under("true", "validate", spec).returncode == 0
    spec.write_text(spec.read_text().replace("1024", "1025"))
    refused = podrun_under("true", "validate", spec)
    assert refused.returncode == 2
    assert refused.stderr == (f"podrun: error: {spec}: target.local.workers: expected a number of workers from 1 to "
                              f"1024, got 1025\n")
