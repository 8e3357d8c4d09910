"""Secrets stay secret and job files stay private, on the launcher and on every host."""

from __future__ import annotations

import json
import os
import signal
import stat
import uuid

from helpers import Background, job_id_in, podrun


def files_containing(root, needle: bytes) -> list[str]:
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            try:
                with open(path, "rb") as handle:
                    if needle in handle.read():
                        found.append(path)
            except OSError:
                continue
    return found


def command_lines_containing(needle: bytes) -> list[str]:
    """What `ps -eo args` shows to any user: every process's command line, on every host (the lab's
    hosts share this machine's process table)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if needle in handle.read():
                    found.append(entry)
        except OSError:
            continue
    return found


def test_secrets_reach_the_workers_and_nothing_else(home, lab, hosts_spec, monkeypatch):
    in_spec, from_launcher = f"tok-{uuid.uuid4().hex}", f"pw-{uuid.uuid4().hex}"
    monkeypatch.setenv("FROM_LAUNCHER", from_launcher)
    spec = hosts_spec(f"""
        run: |
          echo "worker $PODRUN_WORKER holds ${{#API_TOKEN}} and ${{#FROM_LAUNCHER}} characters"
          exec sleep 300
        env: {{API_TOKEN: {in_spec}, PLAIN: visible, PATH: /usr/bin:/bin}}
        secret_env: [FROM_LAUNCHER]
    """)
    dry = podrun("exec", spec, "--dry-run")
    assert "export API_TOKEN='<secret>'" in dry.stdout and "export FROM_LAUNCHER='<secret>'" in dry.stdout
    assert "export PLAIN=visible" in dry.stdout

    job = Background("exec", spec)
    for index in range(3):
        job.wait_for(rf"^\[w{index}\] worker {index} holds 36 and 35 characters$")
    job_id = job_id_in(job.text)
    for secret in (in_spec, from_launcher):
        assert command_lines_containing(secret.encode()) == []  # never on a command line, anywhere
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130

    jobs = podrun("jobs", "--json").stdout + podrun("logs", job_id).stdout
    for secret in (in_spec, from_launcher):
        assert secret not in job.text + dry.stdout + dry.stderr + jobs
        assert files_containing(home, secret.encode()) == []
        for host in lab.hosts:  # the job's files and code copy on each worker
            assert files_containing(host.home / ".podrun", secret.encode()) == []
            assert files_containing(host.home / "podrun", secret.encode()) == []


def test_job_store_and_worker_job_directories_are_private(home, lab, hosts_spec):
    result = podrun("exec", hosts_spec("run: echo ok"))
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)

    def mode(path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(home / "jobs") == mode(home / "jobs" / job_id) == 0o700
    assert mode(home / "known_hosts") == 0o600
    job_files = sorted((home / "jobs" / job_id).iterdir())
    assert [path.name for path in job_files] == ["job.json", "w0.log", "w1.log", "w2.log"]
    assert {mode(path) for path in job_files} == {0o600}  # the job's output, like its record
    for host in lab.hosts[:3]:
        job_dir = host.home / ".podrun" / "jobs" / job_id
        assert mode(host.home / ".podrun") == mode(job_dir.parent) == mode(job_dir) == 0o700
        assert mode(job_dir / "output.log") == 0o600
        assert json.loads((job_dir / "run.exit").read_text())["code"] == 0
