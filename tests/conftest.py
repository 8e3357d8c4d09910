"""Fixtures and hooks only (the helpers test modules share are in helpers.py): a fresh PODRUN_HOME, job
specs, the lab and its supervisor host, the TPU API stand-in, what a test needs of the machine."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import settings

from helpers import LAPTOP_TOKEN, SUPERVISOR_HOST, SupervisorHost, idle_watchers, live_processes, network_of_its_own

# CI's property tests are derandomized (a fixed seed, no example database), so a run's outcome
# depends on the code alone; scripts/fuzz.py runs the same properties with random seeds and a
# budget PODRUN_FUZZ_SCALE times larger, and each failure it finds becomes an @example.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("fuzz", derandomize=False, database=None, print_blob=True)
settings.load_profile(os.environ.get("PODRUN_HYPOTHESIS_PROFILE", "ci"))


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


# seconds from an injected fault to what the fault matrix expects (tests/ssh/test_fault_matrix.py), by row
FAULT_TIMES: dict[str, list[float]] = {}


@pytest.fixture
def webhook():
    """Start a chat's incoming webhook stand-in (tests/webhook_stand_in.py): webhook(status=200, silent=False,
    address="127.0.0.1") gives (the stand-in, its URL); each is shut down after the test."""
    from webhook_stand_in import WebhookStandIn

    started = []

    def start(status: int = 200, silent: bool = False, address: str = "127.0.0.1"):
        stand_in = WebhookStandIn(status, silent)
        started.append(stand_in)
        return stand_in, stand_in.serve(address)

    yield start
    for stand_in in started:
        stand_in.shutdown()


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


# Parallel workers (pytest-xdist, `-n`) each run in a network namespace of their own, so that what one binds
# or builds on the network is its alone: its lab's bridge (tests/lab.py gives each worker a site of its own,
# for the names of its network namespaces, which are global), its stand-ins on 127.0.0.1 and the rendezvous
# port (29500) of its local jobs.
def pytest_xdist_auto_num_workers(config):
    """Two workers per core, at most 7 (a lab site each): most of a test's time is spent waiting for the
    processes, hosts and networks it started, and on 2 cores 4 workers took 8.5 minutes where 1 took 23."""
    return min(7, 2 * (os.cpu_count() or 1))


def pytest_configure(config):
    if hasattr(config, "workerinput") and os.geteuid() == 0:
        network_of_its_own()


# A shell starts its background jobs (`cmd &`, no job control) with SIGINT ignored, and an ignored signal
# stays ignored across exec: podrun would then start with Ctrl-C ignored, and every test that presses it
# (SIGINT to podrun) would wait in vain. podrun gets SIGINT as a terminal gives it, however pytest started.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# What a test needs of the machine, as markers: `lab` (root, network namespaces, a real sshd: tests/lab.py),
# `docker` (a dockerd of the session's own: tests/docker_lab.py), `gcloud` (the real gcloud CLI reading the
# TPU API stand-in), `mkdocs` (mkdocs and its Material theme: the docs extra). A fixture that needs one gives
# its marker to every test that uses it; tests that need one otherwise carry the marker themselves. Where the
# facility is missing they skip, in one line per facility; CI sets PODRUN_TESTS_REQUIRE_ALL=1, so that there
# a missing facility fails instead.
FACILITY_OF_FIXTURE = {"lab": "lab", "slurm_lab": "lab", "docker_engine": "docker"}
# Under parallel workers (`-n`), what uses something of the whole machine runs on one worker, as in a serial run:
# docker tests one dockerd's data root (tests/docker_lab.py), OS Login tests accounts in /etc/passwd and a
# program under /run (tests/oslogin_lab.py). Tests that add accounts otherwise carry xdist_group("accounts")
# themselves. The Slurm tests share one cluster a run (its daemons come up once, not on every worker).
XDIST_GROUP_OF_FIXTURE = {"os_login": "accounts", "os_login_on_lab": "accounts", "slurm_lab": "slurm"}


@functools.cache
def _missing(facility: str) -> str | None:
    """Why this machine lacks the facility, or None."""
    from docker_lab import docker_problem
    from lab import require_lab_tools

    if facility == "gcloud":
        return None if shutil.which("gcloud") else \
            "the gcloud CLI is not on PATH: https://cloud.google.com/sdk/docs/install"
    if facility == "mkdocs":
        return None if importlib.util.find_spec("mkdocs") and importlib.util.find_spec("material") else \
            "mkdocs and its Material theme are not installed: pip install '.[docs]'"
    return {"lab": require_lab_tools, "docker": docker_problem}[facility]()


@pytest.hookimpl(tryfirst=True)  # before -m selects by these markers
def pytest_collection_modifyitems(items):
    for item in items:
        for fixture, facility in FACILITY_OF_FIXTURE.items():
            if fixture in item.fixturenames:
                item.add_marker(facility)
        if item.get_closest_marker("docker"):
            item.add_marker(pytest.mark.xdist_group("docker"))
        for fixture, group in XDIST_GROUP_OF_FIXTURE.items():
            if fixture in item.fixturenames:
                item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session):
    """A worker whose scheduler would spread a group's tests over several workers stops before any runs."""
    if not (hasattr(session.config, "workerinput") and session.config.getvalue("loadgroup")):
        return
    ungrouped = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if ungrouped:
        pytest.exit(f"pytest-xdist ignored the xdist_group of {len(ungrouped)} tests ({ungrouped[0]}, ...): this pytest "
                    "and pytest-xdist do not keep groups together (pytest-dev/pytest-xdist#1386); install the test "
                    "extra's versions (pip install '.[test]')", returncode=3)


@pytest.hookimpl(tryfirst=True)  # before any fixture is set up
def pytest_runtest_setup(item):
    for facility in ("lab", "docker", "gcloud", "mkdocs"):
        if item.get_closest_marker(facility) and (problem := _missing(facility)):
            if os.environ.get("PODRUN_TESTS_REQUIRE_ALL"):
                pytest.fail(f"{problem} (.ci/run installs it)", pytrace=False)
            pytest.skip(f"{facility}: {problem}")


# the docker engine (tests/docker_lab.py), the Slurm lab (tests/slurm_lab.py) and OS Login on the lab
# (tests/oslogin_lab.py): their fixtures, registered
# for every test module
from docker_lab import docker, docker_engine  # noqa: E402, F401
from oslogin_lab import os_login, os_login_on_lab  # noqa: E402, F401
from slurm_lab import slurm_lab  # noqa: E402, F401


@pytest.fixture
def vm_metadata(lab, monkeypatch):
    """The metadata stand-in on the lab's bridge, in every lab host's SSH sessions as GCE_METADATA_HOST; the
    watch looks for jobs every 0.3 s. Afterwards no idle watch runs on any host."""
    from metadata_stand_in import MetadataStandIn

    from lab import BRIDGE_IP

    server = MetadataStandIn()
    lab.set_sshd_extra(f"SetEnv GCE_METADATA_HOST={server.serve(BRIDGE_IP)}\n")
    monkeypatch.setenv("PODRUN_IDLE_POLL_S", "0.3")
    yield server
    left = idle_watchers(lab)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    lab.set_sshd_extra("")
    server.shutdown()
    assert left == [], "an idle watch outlived its test"
