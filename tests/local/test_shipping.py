"""Shipping the workdir to local workers through the relay receivers (relay.py, relay_node.py): tar's
warnings never block a receiver, tar's failures are named, a big workdir streams in flat memory, and
an interrupt stops the shipment at once, leaving nothing on the workers."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, Background, podrun, wait_until

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


@pytest.mark.slow
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
    result = podrun("exec", spec, "--no-collapse", timeout=60)  # the old receivers hung here for good
    assert result.returncode == 0, result.stderr
    for index in range(2):
        assert [line for line in result.stdout.splitlines() if line.startswith(f"[w{index}] ")] == [
            f"[w{index}] {FUTURE_FILES}", f"[w{index}] NUMBER = 42"]
    assert f"shipped code ({FUTURE_FILES:,} files) to 2 workers" in result.stderr
    assert processes_under(home) == []


@pytest.mark.lab  # mounts a file system: needs root
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
         'mount -t tmpfs -o size=1m podrun-test "$1" && shift && exec "$@"', "sh", str(full_disk),
         sys.executable, "-m", "podrun", "exec", str(spec)],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 1, result.stderr
    # tar's own last lines; which words it finds for a full disk depends on how full it was
    assert re.fullmatch(
        r"podrun: error: worker 1 \(local/w1\): shipping code failed: tar could not unpack the code: "
        r"tar: weights\.bin: (Cannot write: No space left on device|Wrote only \d+ of \d+ bytes); "
        r"tar: Exiting with failure status due to previous errors", result.stderr.splitlines()[-1]), result.stderr
    assert "ran" not in result.stdout
    wait_until(lambda: processes_under(home) == [], "every receiver and tar to exit")
    assert partial_trees(home) == []


def test_shipping_shows_its_progress_on_one_redrawn_line_of_a_terminal(home, job_file):
    spec = job_file("""
        target: {local: {workers: 2}}
        run: "true"
    """, files={f"pkg/module_{index}.py": f"VALUE = {index}\n" * 100_000 for index in range(3)})
    controller, terminal = pty.openpty()
    with subprocess.Popen([sys.executable, "-m", "podrun", "exec", str(spec)], cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=terminal) as launcher:
        os.close(terminal)
        shown = b""
        with contextlib.suppress(OSError):  # EIO once podrun, the last writer, has gone
            while chunk := os.read(controller, 65536):
                shown += chunk
    os.close(controller)
    assert launcher.returncode == 0, shown
    drawn = re.findall(rb"\r\x1b\[K([^\r\n]*)", shown)
    size = rb"\d+(\.\d)? (bytes|KB|MB)"
    progress = rb"podrun: shipping code: " + size + rb" sent, " + size + rb"/s, [0-2]/2 worker\(s\) done"
    assert re.fullmatch(progress, drawn[0]), drawn
    # the line is cleared for what follows
    assert drawn[-1].startswith(b"podrun: shipped code (3 files) to 2 workers: "), drawn


SPARSE_FILES = 3
SPARSE_FILE_BYTES = 700 * 1024 * 1024  # 2.1 GB in all: more than the launcher may hold in memory
PEAK_RSS_LIMIT_KB = 300 * 1024
# packed this far into the first file, the receivers are unpacking it: the launcher runs at most a
# few frames and its pipe ahead of them (~130 MB of zeros, which compress 1000:1)
SHIPPING_BYTES = 400 * 1024 * 1024
# prints, as stderr's last line, the peak RSS in KB of the largest process under it: podrun, or one
# of its local workers' receivers and tars
PEAK_RSS = """import resource, subprocess, sys
code = subprocess.call(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(code)"""


@pytest.fixture(scope="module")
def sparse_workdir(tmp_path_factory) -> Path:
    """Big files that cost no disk: holes, which read as zeros."""
    workdir = tmp_path_factory.mktemp("sparse")
    for index in range(SPARSE_FILES):
        with open(workdir / f"shard{index}.bin", "wb") as handle:
            os.truncate(handle.fileno(), SPARSE_FILE_BYTES)
    return workdir


@pytest.mark.slow
def test_a_workdir_of_gigabytes_streams_to_the_workers_in_flat_memory(home, job_file, sparse_workdir):
    spec = job_file(f"""
        target: {{local: {{workers: 2}}}}
        workdir: {sparse_workdir}
        run: stat -c '%s %n' shard*.bin
    """)
    try:
        result = subprocess.run([sys.executable, "-c", PEAK_RSS, sys.executable, "-m", "podrun", "exec", str(spec),
                                 "--allow-large-workdir", "--no-collapse"], capture_output=True, text=True, timeout=240,
                                cwd=REPO)
        assert result.returncode == 0, result.stderr
        for worker in range(2):
            assert [line for line in result.stdout.splitlines() if line.startswith(f"[w{worker}] ")] == [
                f"[w{worker}] {SPARSE_FILE_BYTES} shard{index}.bin" for index in range(SPARSE_FILES)]
        assert "\r" not in result.stderr  # no progress line in a pipe
        peak_kb = int(result.stderr.splitlines()[-1])
        assert peak_kb < PEAK_RSS_LIMIT_KB, f"peak RSS {peak_kb / 1024:.0f} MB for a 2.1 GB workdir"
    finally:
        shutil.rmtree(home / "local", ignore_errors=True)  # 4.2 GB unpacked on the two workers


def read_positions(pid: int, directory: Path) -> dict[str, int]:
    """How far process `pid` has read each file of `directory` it has open (/proc/PID/fdinfo)."""
    positions = {}
    for descriptor in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if (target := os.readlink(f"/proc/{pid}/fd/{descriptor}")).startswith(str(directory)):
                fdinfo = Path(f"/proc/{pid}/fdinfo/{descriptor}").read_text()
                positions[os.path.basename(target)] = int(fdinfo.split("pos:", 1)[1].split()[0])
    return positions


@pytest.mark.slow
def test_ctrl_c_while_packing_and_shipping_stops_within_a_second_and_leaves_nothing(home, job_file, sparse_workdir):
    spec = job_file(f"""
        target: {{local: {{workers: 2}}}}
        workdir: {sparse_workdir}
        run: echo ran
    """)
    launcher = Background("exec", spec, "--allow-large-workdir")
    launcher.wait_for(r"^podrun: job \S+: 2 local workers")  # the workdir is scanned: packing is next
    wait_until(lambda: read_positions(launcher.process.pid, sparse_workdir).get("shard0.bin", 0) > SHIPPING_BYTES,
               "podrun to pack the first file", timeout=60)
    receiving = partial_trees(home)
    interrupted_at = time.monotonic()
    launcher.process.send_signal(signal.SIGINT)
    code = launcher.finish()
    stop_latency = time.monotonic() - interrupted_at
    assert code == 130, launcher.text
    assert stop_latency < 2, f"podrun took {stop_latency:.2f}s to stop"
    assert receiving, "no receiver was unpacking when interrupted"
    wait_until(lambda: processes_under(home) == [], "every receiver and tar to exit", timeout=5)
    assert partial_trees(home) == []
    assert "ran" not in launcher.text
