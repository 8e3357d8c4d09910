"""Shipping the workdir to local workers through the relay receivers (relay.py, relay_node.py): tar's
warnings never block a receiver, tar's failures are named, a big workdir streams in flat memory, and
an interrupt stops the shipment at once, leaving nothing on the workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, podrun, wait_until

FUTURE_FILES = 1_500  # GNU tar warns ~100 bytes per file: more than a pipe's 64 KiB
TEN_YEARS_S = 10 * 365 * 86400


def processes_under(home: Path) -> list[str]:
    """Every live process whose working directory is under `home`: the local workers' receivers,
    their tar, agents and jobs all start in a worker's root there."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(str(home)):
            found.append(f"{entry} {command[:120]}")
    return found


def partial_trees(home: Path) -> list[Path]:
    """Receivers' temporary directories (podrun/<name>/<hash>.tmp.<pid>) on the local workers."""
    return list(home.glob("local/w*/podrun/*/*.tmp.*"))


def test_a_workdir_whose_mtimes_are_in_the_workers_future_ships_despite_tars_warnings(home, job_file):
    spec = job_file("""
        target: {local: {workers: 2}}
        run: ls pkg | wc -l && cat pkg/module_0042.py
    """)
    future = time.time() + TEN_YEARS_S  # a laptop's clock ahead of the pod's
    package = spec.parent / "code" / "pkg"
    package.mkdir()
    for index in range(FUTURE_FILES):
        path = package / f"module_{index:04d}.py"
        path.write_text(f"NUMBER = {index}\n")
        os.utime(path, (future, future))
    result = podrun("exec", spec, timeout=60)  # the old receivers hung here for good
    assert result.returncode == 0, result.stderr
    for index in range(2):
        assert [line for line in result.stdout.splitlines() if line.startswith(f"[w{index}] ")] == [
            f"[w{index}] {FUTURE_FILES}", f"[w{index}] NUMBER = 42"]
    assert f"shipped code ({FUTURE_FILES} files) to 2 worker(s)" in result.stderr
    assert processes_under(home) == []


def test_a_worker_whose_disk_is_full_is_named_with_tars_own_words_and_nothing_is_left(home, job_file):
    spec = job_file("""
        target: {local: {workers: 2}}
        run: echo ran
    """)
    (spec.parent / "code" / "weights.bin").write_bytes(os.urandom(3_000_000))
    full_disk = home / "local" / "w1" / "podrun"
    full_disk.mkdir(parents=True)
    # worker 1's code lives on a 1 MB file system, in a mount namespace of podrun's own: gone with it
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f'mount -t tmpfs -o size=1m podrun-test "$1" && shift && exec "$@"', "sh", str(full_disk),
         sys.executable, "-m", "podrun", "exec", str(spec)],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "podrun: error: worker 1 (local/w1): shipping the workdir failed: tar could not unpack the code: "
        "tar: weights.bin: Cannot write: No space left on device; "
        "tar: Exiting with failure status due to previous errors")
    assert "ran" not in result.stdout
    wait_until(lambda: processes_under(home) == [], "every receiver and tar to exit")
    assert partial_trees(home) == []
