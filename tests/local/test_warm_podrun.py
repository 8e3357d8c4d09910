"""The warm podrun of a supervisor host (supervisor/warm.py), on this machine: the laptop's command for it
run by `sh -c` as sshd runs it. A command it forks is the command the podrun runs itself: the same output,
exit code, environment and directory; a podrun rewritten since it loaded is not served, nor one of another
version; it ends after its idle seconds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from podrun import __version__
from podrun.errors import UsageError
from podrun.supervisor import warm

from helpers import REPO, wait_until

JOB_ID = re.compile(r"job-\d{8}-\d{6}-[0-9a-f]{4}")
SPEC = "target: {local: {workers: 1}}\nworkdir: code\nsecret_env: [WARM_TOKEN]\nrun: 'true'\n"


@pytest.fixture
def host(monkeypatch):
    """A PODRUN_HOME short enough for the warm podrun's socket (sun_path: 108 bytes), a podrun that notes each
    command it runs itself (its first argument) in `commands`, and a directory with a spec in it."""
    root = Path(tempfile.mkdtemp(prefix="pw", dir="/tmp"))
    monkeypatch.setenv("PODRUN_HOME", str(root / "h"))
    podrun = root / "podrun"
    podrun.write_text(f'#!/bin/sh\necho "$1" >> {root / "commands"}\nPYTHONPATH={REPO} exec {sys.executable} '
                      f'-m podrun "$@"\n')
    podrun.chmod(0o755)
    (root / "job.yaml").write_text(SPEC)
    (root / "code").mkdir()
    yield root
    for pid in served_by(root):
        os.kill(pid, 9)
    shutil.rmtree(root, ignore_errors=True)


def served_by(root: Path) -> list[int]:
    """The live warm podruns under `root`'s PODRUN_HOME: the pid each wrote in its lock file."""
    found = [lock.read_text().strip() for lock in (root / "h" / "warm").glob("*.lock")]
    return [int(pid) for pid in found if pid.isdigit() and alive(int(pid))]


def alive(pid: int) -> bool:
    """Running (not a zombie: this machine's init may leave them unreaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def run(root: Path, argv: list[str], **environ: str) -> subprocess.CompletedProcess:
    """`podrun ARGV` through the laptop's command for the warm podrun, in `root`, as sshd would run it."""
    return subprocess.run(["sh", "-c", warm.command(str(root / "podrun"), argv)], cwd=root, capture_output=True,
                          text=True, timeout=60, env={**os.environ, **environ})


def commands(root: Path) -> list[str]:
    """What the podrun ran itself since last asked."""
    path = root / "commands"
    said = path.read_text().split() if path.exists() else []
    path.unlink(missing_ok=True)
    return said


def test_a_command_the_warm_podrun_forks_is_the_command_the_podrun_runs(host):
    cold = run(host, ["exec", "job.yaml", "--dry-run"], WARM_TOKEN="a")
    assert cold.returncode == 0, cold.stderr
    assert sorted(commands(host)) == ["_warm", "exec"]  # the first ran itself, and started the warm one
    wait_until(lambda: served_by(host), "the warm podrun to serve")
    # its own directory, environment and stdio: the relative spec found, the secret taken from it
    warmed = run(host, ["exec", "job.yaml", "--dry-run"], WARM_TOKEN="a")
    assert (warmed.returncode, JOB_ID.sub("ID", warmed.stdout), warmed.stderr) == (
        0, JOB_ID.sub("ID", cold.stdout), cold.stderr)
    refused = run(host, ["exec", "job.yaml", "--dry-run"])
    assert (refused.returncode, refused.stdout, refused.stderr) == (
        2, "", "podrun: error: job.yaml: secret_env.0: WARM_TOKEN is neither set in env nor in podrun's "
               "environment; export it first\n")
    assert commands(host) == []  # neither ran a podrun of its own
    # its stdin and stdout: `_supervise` reads the version wanted, answers its own, and takes no job
    answered = subprocess.run(["sh", "-c", warm.command(str(host / "podrun"), ["_supervise"])],
                              input=b"podrun 0.0.9\n{}\n", cwd=host, capture_output=True, timeout=60)
    assert (answered.returncode, answered.stdout, answered.stderr) == (
        2, f"@podrun:version=podrun {__version__}\n".encode(), b"")
    assert commands(host) == []


def test_a_podrun_rewritten_since_the_warm_one_loaded_runs_itself_and_the_warm_one_ends(host):
    assert run(host, ["--version"]).stdout == f"podrun {__version__}\n"
    wait_until(lambda: served_by(host), "the warm podrun to serve")
    [first] = served_by(host)
    commands(host)
    podrun = host / "podrun"
    podrun.write_text(podrun.read_text().replace("exec ", "WARM_REWRITTEN=1 exec ", 1))
    assert run(host, ["--version"]).stdout == f"podrun {__version__}\n"
    assert sorted(commands(host)) == ["--version", "_warm"]
    wait_until(lambda: not alive(first), "the warm podrun of the old podrun to end")
    wait_until(lambda: served_by(host), "a warm podrun of the new one")
    run(host, ["--version"])
    assert commands(host) == []


def test_a_warm_podrun_ends_after_its_idle_seconds_and_off_starts_none(host, monkeypatch):
    monkeypatch.setenv(warm.SETTING, "1")
    run(host, ["--version"])
    wait_until(lambda: served_by(host), "the warm podrun to serve")
    [pid] = served_by(host)
    wait_until(lambda: not alive(pid), "the warm podrun to end, idle", timeout=20)
    assert list((host / "h" / "warm").glob("*.sock")) == []
    monkeypatch.setenv(warm.SETTING, "off")
    commands(host)
    assert run(host, ["--version"]).returncode == 0
    assert commands(host) == ["--version"]
    assert "python3" not in warm.command("podrun", ["jobs"])


@pytest.mark.parametrize("setting", ["0", "soon", "-5"])
def test_a_bad_warm_setting_is_one_line(monkeypatch, setting):
    monkeypatch.setenv(warm.SETTING, setting)
    with pytest.raises(UsageError) as refused:
        warm.idle_s()
    assert str(refused.value) == (f"PODRUN_SUPERVISOR_WARM={setting}: expected a number of seconds a warm podrun "
                                  "waits for a command on a supervisor host, or off")
