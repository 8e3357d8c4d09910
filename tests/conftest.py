"""Helpers: run the real podrun CLI, find a job's processes, wait for output lines (never sleeps)."""

from __future__ import annotations

import ast
import contextlib
import fcntl
import functools
import json
import os
import queue
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import settings

# CI's property tests are derandomized (a fixed seed, no example database), so a run's outcome
# depends on the code alone; scripts/fuzz.py runs the same properties with random seeds and a
# budget PODRUN_FUZZ_SCALE times larger, and each failure it finds becomes an @example.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("fuzz", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("PODRUN_HYPOTHESIS_PROFILE", "ci"))
FUZZ_SCALE = int(os.environ.get("PODRUN_FUZZ_SCALE", "1"))


def examples(count: int) -> int:
    """A property's number of examples: `count` in CI, more under scripts/fuzz.py."""
    return count * FUZZ_SCALE


REPO = Path(__file__).resolve().parents[1]
JOB_ID_LINE = re.compile(r"^podrun: job (\S+): ", re.MULTILINE)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh PODRUN_HOME for the test, also seen by the podrun subprocesses."""
    path = tmp_path / "podrun-home"
    monkeypatch.setenv("PODRUN_HOME", str(path))
    # as with an activated virtualenv: the workers find this interpreter's torchrun
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return path


@pytest.fixture
def job_file(tmp_path):
    """Write a job spec and its workdir `code/` (with optional files); returns the spec's path.
    The spec gets `workdir: code` unless it names a workdir itself."""

    def write(spec: str, files: dict[str, str] | None = None, name: str = "job") -> Path:
        workdir = tmp_path / "code"
        workdir.mkdir(exist_ok=True)
        for relative, content in (files or {}).items():
            (workdir / relative).parent.mkdir(parents=True, exist_ok=True)
            (workdir / relative).write_text(content)
        path = tmp_path / f"{name}.yaml"
        spec = textwrap.dedent(spec)
        path.write_text(spec if "workdir:" in spec else spec.rstrip("\n") + "\nworkdir: code\n")
        return path

    return write


def podrun(*args: str, timeout: float = 120, text: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run the real CLI to completion, capturing its output (as bytes when text=False)."""
    return subprocess.run([sys.executable, "-m", "podrun", *map(str, args)], capture_output=True, text=text,
                          timeout=timeout, cwd=REPO, **kwargs)


IMPORT_PROBE = """
import sys
sys.argv = ["podrun", *{args!r}]
from podrun.cli import main
main()
packages = {packages!r}
print("IMPORTED", sorted(name for name in sys.modules if any(name == p or name.startswith(p + ".") for p in packages)))
"""


def modules_imported_by(args: list[str], packages: tuple[str, ...]) -> list[str]:
    """The modules of `packages` (names like "google" or "google.cloud.tpu_v2") that `podrun ARGS`
    imports, run to its end in a fresh interpreter."""
    probe = subprocess.run([sys.executable, "-c", IMPORT_PROBE.format(args=list(map(str, args)), packages=packages)],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    imported = [line for line in probe.stdout.splitlines() if line.startswith("IMPORTED ")]
    assert imported, probe.stderr
    return ast.literal_eval(imported[-1].removeprefix("IMPORTED "))


def run_in_terminal(args: list, rows: int, columns: int, timeout: float = 120,
                    interrupt_after: bytes | None = None, answer: bytes | None = None) -> tuple[int, bytes]:
    """Run podrun with a real pseudo-terminal as its stdin, stdout and stderr (sending it SIGINT once it
    wrote `interrupt_after`, if given; typing `answer` and Enter when it asks `[y/N]`); returns its
    exit code and all it wrote to the terminal."""
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    process = subprocess.Popen([sys.executable, "-m", "podrun", *map(str, args)], cwd=REPO,
                               stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    written = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if interrupt_after is not None and interrupt_after in written:
            process.send_signal(signal.SIGINT)
            interrupt_after = None
        if select.select([controller], [], [], 0.1)[0]:
            try:
                written += os.read(controller, 65536)
            except OSError:  # EIO: nothing has the terminal open any more
                break
            if answer is not None and written.endswith(b"[y/N] "):
                os.write(controller, answer + b"\n")
        elif process.poll() is not None:
            break
    os.close(controller)
    return process.wait(timeout=10), bytes(written)


def job_id_in(stderr: str) -> str:
    match = JOB_ID_LINE.search(stderr)
    assert match, f"no job id announced in:\n{stderr}"
    return match.group(1)


def live_processes() -> list[tuple[int, str, list[bytes]]]:
    """Every live (not zombie) process, the lab hosts' too (they share this machine's pid namespace):
    (pid, its command line, its environment's entries)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z":
            found.append((int(entry), command, environ))
    return found


def processes_of_job(job_id: str) -> list[str]:
    """Every live process whose environment carries PODRUN_JOB_ID=job_id (what `ps e` shows)."""
    marker = f"PODRUN_JOB_ID={job_id}".encode()
    return [f"{pid} {command}" for pid, command, environ in live_processes() if marker in environ]


def wait_until(condition, what: str, timeout: float = 15) -> float:
    """Poll a condition the system under test will make true (not a sleep standing in for it);
    returns the seconds it took."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def crashed(output: str) -> bool:
    """Whether podrun ended in a traceback, or caught one as an internal error (cli.main)."""
    return "Traceback" in output or "podrun: internal error:" in output


def stderr_lines_without_traceback(stderr: str) -> list[str]:
    assert not crashed(stderr), stderr
    return [line for line in stderr.splitlines() if line.strip()]


class Background:
    """podrun running in the background; its output lines arrive in a queue as they are printed."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen([sys.executable, "-m", "podrun", *map(str, args)], cwd=REPO,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        """The first line, printed so far or until `timeout`, that matches `pattern`; fails if the output
        ends or time runs out first."""
        for line in self.lines:
            if re.search(pattern, line):
                return line
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} within {timeout}s; got:\n"
                                     + "\n".join(self.lines)) from None
            if line is None:
                raise AssertionError(f"output ended before {pattern!r}; got:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if re.search(pattern, line):
                return line

    def finish(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout=timeout)
        while (line := self._queue.get(timeout=timeout)) is not None:
            self.lines.append(line)
        return code

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """Four real SSH hosts (tests/lab.py), shared by the session; torn down even after failures."""
    from lab import Lab

    with Lab(4, tmp_path_factory.mktemp("lab")) as the_lab:
        yield the_lab


@pytest.fixture
def hosts_spec(lab, job_file):
    """A job spec on lab hosts (by index), with the lab's key and this interpreter's bin on PATH."""

    def write(body: str, hosts=(0, 1, 2), files: dict[str, str] | None = None) -> Path:
        entries = ", ".join(lab.hosts[i].ip for i in hosts)
        header = (f"target: {{hosts: [{entries}]}}\n"
                  f"ssh: {{user: root, identity_file: {lab.client_key}}}\n")
        spec = textwrap.dedent(body)
        if "\nenv:" not in "\n" + spec:
            spec += f"\nenv: {{PATH: '{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin'}}\n"
        return job_file(header + spec, files=files)

    return write


@pytest.fixture
def tpu_api(lab, tmp_path, monkeypatch):
    """The Cloud TPU API stand-in (tests/tpu_stand_in.py) with the lab's hosts as capacity, and gcloud's
    settings pointing at it (as a user's shell would: project, zone, endpoint, token). Like a TPU VM's
    guest agent, it installs a node's `ssh-keys` metadata for root on the node's hosts."""
    yield from _tpu_api_for_the_user(lab, tmp_path, monkeypatch, "127.0.0.1", range(len(lab.hosts)))


# the lab host that plays a supervisor (the `supervisor` fixture); `tpu_api_on_lab` never hands it out
SUPERVISOR_HOST = 3
LAPTOP_TOKEN = "stand-in-token"  # what the test process's gcloud settings hold
SUPERVISOR_TOKEN = "supervisor-token"  # what the supervisor host's own gcloud configuration holds


@pytest.fixture
def tpu_api_on_lab(lab, tmp_path, monkeypatch):
    """The `tpu_api` stand-in served on the lab's bridge (tests/lab.py BRIDGE_IP), which lab hosts reach
    too: the URL in the laptop's (this process's) gcloud settings is the one a supervisor host can use.
    Every lab host but SUPERVISOR_HOST is capacity, also when a preempted node is created again. Each
    request's sender is kept (`received`, `callers()`: this machine sends from BRIDGE_IP, a lab host from
    its own address)."""
    from lab import BRIDGE_IP

    capacity = [host.index for host in lab.hosts if host.index != SUPERVISOR_HOST]
    yield from _tpu_api_for_the_user(lab, tmp_path, monkeypatch, BRIDGE_IP, capacity)


def _tpu_api_for_the_user(lab, tmp_path, monkeypatch, address: str, capacity):
    from tpu_stand_in import TpuStandIn

    stand_in = TpuStandIn.on_lab(lab, operation_delay_s=0.3, capacity=list(capacity))
    url = stand_in.serve(address)
    (tmp_path / "token").write_text(LAPTOP_TOKEN + "\n")
    user_home = tmp_path / "user-home"
    user_home.mkdir()
    for name, value in {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": f"{url}/",
                        "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{url}/compute/v1/",
                        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
                        "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(tmp_path / "token"),
                        "CLOUDSDK_CORE_PROJECT": "podrun-test", "CLOUDSDK_COMPUTE_ZONE": "us-central2-b",
                        "HOME": str(user_home), "USER": "root", "NO_GCE_CHECK": "True"}.items():
        monkeypatch.setenv(name, value)
    yield stand_in
    stand_in.shutdown()
    for host in lab.hosts:
        lab.authorize(host.index)


class SupervisorHost:
    """Lab host SUPERVISOR_HOST set up as a user sets up a supervisor: its own gcloud configuration in its
    home (`[auth] access_token_file` with a token of its own, SUPERVISOR_TOKEN, and nothing else: the
    project, zone and API endpoint are the laptop's to send) and this checkout's podrun at `podrun`, a
    wrapper on a path the host sees (lab hosts share this machine's files but /root). `spec` is the spec
    line that hands a job to it; a spec's `ssh:` with the lab's key reaches it. Its podrun keeps its jobs
    in `home`/.podrun/jobs/ID (`job_dir`), as podrun on any host does."""

    def __init__(self, lab, tmp_path: Path):
        host = lab.hosts[SUPERVISOR_HOST]
        self.index, self.ip, self.home = host.index, host.ip, host.home
        gcloud = self.home / ".config" / "gcloud"
        (gcloud / "configurations").mkdir(parents=True, exist_ok=True)
        (gcloud / "token").write_text(SUPERVISOR_TOKEN + "\n")
        (gcloud / "active_config").write_text("default\n")
        (gcloud / "configurations" / "config_default").write_text("[auth]\naccess_token_file = /root/.config/gcloud/token\n")
        self.podrun = tmp_path / "podrun-on-supervisor"
        self.podrun.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m podrun \"$@\"\n")
        self.podrun.chmod(0o755)

    @property
    def address(self) -> str:
        return f"root@{self.ip}"

    @property
    def spec(self) -> str:
        return f"supervisor: {{host: {self.address}, podrun: {self.podrun}}}\n"

    def job_dir(self, job_id: str) -> Path:
        return self.home / ".podrun" / "jobs" / job_id

    def record(self, job_id: str) -> dict:
        return json.loads((self.job_dir(job_id) / "job.json").read_text())


@pytest.fixture
def supervisor(lab, tmp_path):
    """A SupervisorHost; afterwards its sshd is up again, nothing a test started runs there any more, no
    worker of a job it kept a record of runs on any host, and its home holds neither gcloud settings nor
    podrun's jobs."""
    host = SupervisorHost(lab, tmp_path)
    yield host
    jobs = host.home / ".podrun" / "jobs"
    markers = {f"PODRUN_JOB_ID={job.name}".encode() for job in jobs.iterdir()} if jobs.is_dir() else set()
    for pid, _, environ in live_processes():
        if markers.intersection(environ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    lab_host = lab.hosts[SUPERVISOR_HOST]
    if lab_host.sshd.poll() is not None:
        lab.start_sshd(SUPERVISOR_HOST)
    pids = subprocess.run(["ip", "netns", "pids", lab_host.namespace], capture_output=True, text=True).stdout.split()
    for pid in set(map(int, pids)) - {lab_host.sshd.pid}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(host.home / ".podrun", ignore_errors=True)
    shutil.rmtree(host.home / ".config" / "gcloud", ignore_errors=True)


# seconds from an injected fault to what the fault matrix expects (tests/test_fault_matrix.py), by row
FAULT_TIMES: dict[str, list[float]] = {}


@pytest.fixture
def fault_time():
    def record(row: str, seconds: float) -> None:
        FAULT_TIMES.setdefault(row, []).append(seconds)

    return record


def pytest_terminal_summary(terminalreporter):
    if FAULT_TIMES:
        terminalreporter.write_line("fault matrix: seconds from the fault to the expected outcome (min / median / max)")
        for row, times in FAULT_TIMES.items():
            ordered = sorted(times)
            terminalreporter.write_line(f"  {row}: {ordered[0]:.2f} / {ordered[len(ordered) // 2]:.2f} / "
                                        f"{ordered[-1]:.2f} s over {len(times)} runs")


# A shell starts its background jobs (`cmd &`, no job control) with SIGINT ignored, and an ignored signal
# stays ignored across exec: podrun would then start with Ctrl-C ignored, and every test that presses it
# (SIGINT to podrun) would wait in vain. podrun gets SIGINT as a terminal gives it, however pytest started.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# What a test needs of the machine, as markers: `lab` (root, network namespaces, a real sshd: tests/lab.py),
# `docker` (a dockerd of the session's own: tests/docker_lab.py), `gcloud` (the real gcloud CLI reading the
# TPU API stand-in). A fixture that needs one gives its marker to every test that uses it; tests that need
# one otherwise carry the marker themselves. Where the facility is missing they skip, in one line per
# facility; CI sets PODRUN_TESTS_REQUIRE_ALL=1, so that there a missing facility fails instead.
FACILITY_OF_FIXTURE = {"lab": "lab", "slurm_lab": "lab", "docker_engine": "docker"}


@functools.cache
def missing(facility: str) -> str | None:
    """Why this machine lacks the facility, or None."""
    from docker_lab import docker_problem
    from lab import require_lab_tools

    if facility == "gcloud":
        return None if shutil.which("gcloud") else \
            "the gcloud CLI is not on PATH: https://cloud.google.com/sdk/docs/install"
    return {"lab": require_lab_tools, "docker": docker_problem}[facility]()


@pytest.hookimpl(tryfirst=True)  # before -m selects by these markers
def pytest_collection_modifyitems(items):
    for item in items:
        for fixture, facility in FACILITY_OF_FIXTURE.items():
            if fixture in item.fixturenames:
                item.add_marker(facility)


@pytest.hookimpl(tryfirst=True)  # before any fixture is set up
def pytest_runtest_setup(item):
    for facility in ("lab", "docker", "gcloud"):
        if item.get_closest_marker(facility) and (problem := missing(facility)):
            if os.environ.get("PODRUN_TESTS_REQUIRE_ALL"):
                pytest.fail(f"{problem} (.ci/run installs it)", pytrace=False)
            pytest.skip(f"{facility}: {problem}")


# the docker engine (tests/docker_lab.py), the Slurm lab (tests/slurm_lab.py) and OS Login on the lab
# (tests/oslogin_lab.py): their fixtures, registered
# for every test module
from docker_lab import docker, docker_engine  # noqa: E402, F401
from oslogin_lab import os_login, os_login_on_lab  # noqa: E402, F401
from slurm_lab import slurm_lab  # noqa: E402, F401
