"""A real docker engine for the tests (docs/design.md: How it is tested): a dockerd of the test
session's own, and the test image `podrun-test`, built from this machine's files since no registry is
reachable.

The daemon listens on a socket of its own (DOCKER_HOST, set for each test by the `docker` fixture and so
seen by local workers' agents): it never meets a dockerd that runs here for other reasons, and is
stopped when the session ends. It runs with --iptables=false and --bridge=none: podrun's containers use
--net=host, and dockerd's iptables rules would set FORWARD to DROP, cutting the lab's hosts apart.
Its data root persists in DATA_ROOT, so the image is built once per content; a second test session
running at the same time gets a throwaway data root instead (one dockerd per data root).
The image holds a shell (dash as /bin/sh), sleep, this machine's python3 with its standard library,
and the libraries `ldd` names for them, streamed as a tar archive into `docker import - podrun-test:HASH`.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

IMAGE = "podrun-test"
DATA_ROOT = Path("/var/lib/podrun-test-docker")
SYSTEM_PYTHON = os.path.realpath("/usr/bin/python3")  # the distribution's: /usr/bin/python3.11 on Debian 12
PYTHON_LIB = f"/usr/lib/{os.path.basename(SYSTEM_PYTHON)}"
PROGRAMS = ("/usr/bin/dash", "/usr/bin/sleep", SYSTEM_PYTHON)
# names in the image -> their targets: the merged /usr layout of Debian 12, which ldd's paths assume
LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "usr/bin/sh": "dash",
         "usr/bin/python3": os.path.basename(SYSTEM_PYTHON)}
EMPTY_DIRS = {"tmp": 0o1777, "proc": 0o555, "sys": 0o555, "dev": 0o755, "etc": 0o755, "usr/bin": 0o755,
              "usr/lib64": 0o755}
START_TIMEOUT_S = 30


@dataclass
class DockerEngine:
    host: str  # DOCKER_HOST
    image: str = ""

    def docker(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "DOCKER_HOST": self.host})

    def containers(self, name_part: str) -> list[str]:
        """`docker ps -a` of the containers whose name holds `name_part`: "NAME STATUS" lines."""
        listing = self.docker("ps", "-a", "--filter", f"name={name_part}", "--format", "{{.Names}} {{.Status}}")
        assert listing.returncode == 0, listing.stderr
        return listing.stdout.splitlines()


def docker_problem() -> str | None:
    """Why a docker engine cannot run here, or None."""
    if os.geteuid() != 0:
        return "dockerd needs root"
    for tool in ("docker", "dockerd", "containerd", "runc", "ldd"):
        if shutil.which(tool) is None:
            return f"the docker tests need {tool}: apt-get install docker.io"
    if not os.path.isdir(PYTHON_LIB):
        return f"the test image needs /usr/bin/python3 and its standard library in {PYTHON_LIB}: apt-get install python3"
    return None


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory):
    """The session's dockerd, with the test image built; stopped at the end of the session. Its tests skip
    where docker_problem() names something missing (conftest.pytest_runtest_setup)."""
    state_dir = tmp_path_factory.mktemp("docker")
    with _data_root(state_dir) as data_root:
        exec_root = Path(f"/run/podrun-test-docker-{os.getpid()}")  # short: a socket path has 108 bytes at most
        engine = DockerEngine(f"unix://{exec_root}/docker.sock")
        daemon = _start_dockerd(data_root, exec_root, state_dir / "dockerd.log")
        try:
            _wait_until_answering(engine, daemon, state_dir / "dockerd.log")
            engine.image = _image(engine)
            _check_runs_python(engine)
            yield engine
        finally:
            _stop(daemon)
            _remove(exec_root)


@pytest.fixture
def docker(docker_engine, monkeypatch) -> DockerEngine:
    """The session's docker engine, which podrun and its local workers reach through DOCKER_HOST."""
    monkeypatch.setenv("DOCKER_HOST", docker_engine.host)
    return docker_engine


@contextlib.contextmanager
def _data_root(fallback: Path) -> Iterator[Path]:
    """DATA_ROOT, locked for the session; a fresh one under `fallback` while another session holds it."""
    DATA_ROOT.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{DATA_ROOT}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield fallback / "data"
        else:
            yield DATA_ROOT


def _start_dockerd(data_root: Path, exec_root: Path, log: Path) -> subprocess.Popen:
    exec_root.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as log_file:
        return subprocess.Popen(
            ["dockerd", "--iptables=false", "--ip-masq=false", "--bridge=none", f"--data-root={data_root}",
             f"--exec-root={exec_root}", f"--pidfile={exec_root}/docker.pid", f"--host=unix://{exec_root}/docker.sock"],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_until_answering(engine: DockerEngine, daemon: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while engine.docker("info", "--format", "{{.ServerVersion}}", timeout=START_TIMEOUT_S).returncode != 0:
        if daemon.poll() is not None or time.monotonic() > deadline:
            last_lines = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            pytest.fail(f"dockerd did not start (see {log}): {last_lines[0]}", pytrace=False)
        time.sleep(0.05)


def _stop(daemon: subprocess.Popen) -> None:
    daemon.terminate()  # dockerd stops its containers and its containerd, then exits
    try:
        daemon.wait(timeout=30)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


def _remove(exec_root: Path) -> None:
    """Remove the daemon's runtime directory, with what it leaves mounted there (its netns/default)."""
    with open("/proc/self/mounts") as mounts:
        mount_points = [line.split()[1] for line in mounts if line.split()[1].startswith(f"{exec_root}/")]
    for mount_point in reversed(mount_points):
        subprocess.run(["umount", mount_point], capture_output=True)
    shutil.rmtree(exec_root, ignore_errors=True)


def _image(engine: DockerEngine) -> str:
    """The test image's tag, podrun-test:<hash of its files>; imported only when the daemon lacks it."""
    files = _image_files()
    digest = hashlib.sha256(repr(sorted((name, os.stat(source).st_size, os.stat(source).st_mtime_ns)
                                        for name, source in files.items())).encode()).hexdigest()[:16]
    tag = f"{IMAGE}:{digest}"
    if engine.docker("image", "inspect", tag).returncode != 0:
        imported = subprocess.run(["docker", "import", "-", tag], input=_rootfs_tar(files), capture_output=True,
                                  env={**os.environ, "DOCKER_HOST": engine.host}, timeout=300)
        if imported.returncode != 0:
            pytest.fail(f"docker import of the test image failed: {imported.stderr.decode().strip()}", pytrace=False)
    return tag


def _check_runs_python(engine: DockerEngine) -> None:
    ran = engine.docker("run", "--rm", "--net=host", engine.image, "python3", "-c", "print(1)")
    if ran.stdout != "1\n":
        pytest.fail(f"the test image {engine.image} does not run python3: {(ran.stderr or ran.stdout).strip()}",
                    pytrace=False)


def _image_files() -> dict[str, str]:
    """The image's regular files: name in the image -> file on this machine (symbolic links resolved)."""
    files = {path.lstrip("/"): path for path in PROGRAMS}
    for root, _, names in os.walk(PYTHON_LIB):
        for name in names:
            if os.path.exists(path := os.path.join(root, name)):  # not a dangling link
                files[path.lstrip("/")] = path
    libraries = _libraries_of([*PROGRAMS, *glob.glob(f"{PYTHON_LIB}/lib-dynload/*.so")])
    # under its own name (the loader's is fixed in every binary), in its directory's real place
    files.update({os.path.join(os.path.realpath(os.path.dirname(library)), os.path.basename(library)).lstrip("/"):
                  library for library in libraries})
    return files


def _libraries_of(binaries: list[str]) -> set[str]:
    """What the dynamic linker loads for these binaries: each path `ldd` prints (the loader included)."""
    listing = subprocess.run(["ldd", *binaries], capture_output=True, text=True).stdout
    return {word for word in listing.split() if word.startswith("/") and not word.endswith(":")}


def _rootfs_tar(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, mode in EMPTY_DIRS.items():
            entry = tarfile.TarInfo(name)
            entry.type, entry.mode = tarfile.DIRTYPE, mode
            tar.addfile(entry)
        for name, target in LINKS.items():
            entry = tarfile.TarInfo(name)
            entry.type, entry.linkname = tarfile.SYMTYPE, target
            tar.addfile(entry)
        for name, source in sorted(files.items()):
            tar.add(os.path.realpath(source), arcname=name, recursive=False)
    return buffer.getvalue()
