"""Install on first use (issue 28): the podrun a supervisor host runs is exactly this podrun's version,
taken from the host's login PATH, from ~/.podrun/venv, or installed there from this podrun's own wheel
with the host's python3 and pip.

Lab hosts reach no package index: the host's pip.conf points pip at a directory of podrun's requirements
as wheels, which this machine's pip downloads once per session.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import hashlib
import shutil
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import pytest

from podrun import __version__
from podrun.errors import PodrunError
from podrun.supervisor.install import podrun_on_host, run_script
from podrun.supervisor.wheel import build_wheel
from podrun.transport.past_login import MARK
from podrun.transport.ssh import SshTransport

from helpers import on_the_machines_network, podrun

ROOT = Path(__file__).resolve().parents[2]
HOST = 3  # a lab host the other tests leave alone
VENV_PODRUN = "/root/.podrun/venv/bin/podrun"  # as the host sees its home
OLD_PODRUN = "#!/bin/sh\necho 'podrun 0.0.9'\n"
# Debian's python3 without its python3-venv package: `-m venv DIR` makes DIR/bin/python, then fails at ensurepip
NO_VENV_PYTHON = """#!/bin/sh
mkdir -p "$3/bin" && ln -s /usr/bin/python3 "$3/bin/python"
echo 'The virtual environment was not created successfully because ensurepip is not'
echo 'available.  On Debian/Ubuntu systems, you need to install the python3-venv'
echo 'package using the following command.'
echo
echo '    apt install python3.11-venv'
exit 1
"""
PUT_THERE = (".podrun", ".config", ".local", ".profile", "python3-calls")  # what these tests put in the host's home


def requirements_of(wheel: str) -> list[str]:
    metadata = zipfile.ZipFile(wheel).read(f"podrun-{__version__}.dist-info/METADATA").decode()
    return [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]


@pytest.fixture(scope="session")
def requirement_wheels(tmp_path_factory, lab) -> Path:
    """podrun's requirements as wheels for the lab host's python3, by this machine's pip and its index."""
    directory = tmp_path_factory.mktemp("requirement_wheels")
    python = lab.run(HOST, "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'").stdout.strip()
    requirements = requirements_of(build_wheel(str(tmp_path_factory.mktemp("podrun_wheel"))))
    subprocess.run(on_the_machines_network([sys.executable, "-m", "pip", "download", "-qq", "--only-binary=:all:",
                                            "--python-version", python, "--dest", str(directory), *requirements]),
                   check=True, timeout=300)
    return directory


@pytest.fixture
def host_home(lab, home, requirement_wheels):
    """The lab host's home, with a pip.conf that finds podrun's requirements there and no index; what the
    test put there is removed after it."""
    home_there = lab.hosts[HOST].home
    pip_conf = home_there / ".config/pip/pip.conf"
    pip_conf.parent.mkdir(parents=True)
    pip_conf.write_text(f"[global]\nno-index = true\nfind-links = {requirement_wheels}\n")
    yield home_there
    for name in PUT_THERE:
        path = home_there / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def podrun_there(lab, configured: str | None = None) -> str:
    async def find() -> str:
        transport = SshTransport(lab.hosts[HOST].ip, 22, "root", str(lab.client_key), True)
        await transport.connect()
        try:
            return await podrun_on_host(transport, lab.hosts[HOST].ip, configured)
        finally:
            await transport.close()

    return asyncio.run(find())


def said(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("podrun:")]


def put_on_login_path(home_there: Path, name: str, script: str) -> None:
    """A program in ~/.local/bin, which ~/.profile puts on the login PATH (as pip install --user does)."""
    path = home_there / ".local/bin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    path.chmod(0o755)
    (home_there / ".profile").write_text('PATH="$HOME/.local/bin:$PATH"\necho a profile that talks\n')


def test_the_wheel_holds_this_podrun_with_its_requirements_and_is_built_once_in_place_of_older_ones(tmp_path):
    tomllib = pytest.importorskip("tomllib")
    earlier = tmp_path / "podrun-0.0.9-0123456789abcdef/podrun-0.0.9-py3-none-any.whl"  # an older podrun's
    earlier.parent.mkdir()
    earlier.write_bytes(b"PK")
    path = build_wheel(str(tmp_path))
    assert [entry.name for entry in tmp_path.iterdir()] == [Path(path).parent.name]
    wheel = zipfile.ZipFile(path)
    dist_info = f"podrun-{__version__}.dist-info"
    with open(ROOT / "pyproject.toml", "rb") as file:
        assert requirements_of(path) == tomllib.load(file)["project"]["dependencies"]
    assert f"Version: {__version__}" in wheel.read(f"{dist_info}/METADATA").decode().splitlines()
    assert "podrun = podrun.cli:run" in wheel.read(f"{dist_info}/entry_points.txt").decode().splitlines()
    modules = sorted(str(module.relative_to(ROOT)) for module in (ROOT / "podrun").rglob("*.py"))
    assert sorted(name for name in wheel.namelist() if not name.startswith(dist_info)) == modules
    for line in wheel.read(f"{dist_info}/RECORD").decode().splitlines()[:-1]:
        name, digest, size = line.split(",")
        data = wheel.read(name)
        assert (digest, int(size)) == ("sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest())
                                       .rstrip(b"=").decode(), len(data))
    built_at = Path(path).stat().st_mtime_ns
    assert build_wheel(str(tmp_path)) == path and Path(path).stat().st_mtime_ns == built_at


# a podrun run elsewhere builds its wheel and prints its METADATA, or its one line
BUILD_A_WHEEL = """import sys, zipfile
import podrun
from podrun.errors import PodrunError
from podrun.supervisor.wheel import build_wheel
try:
    print(zipfile.ZipFile(build_wheel(sys.argv[1])).read(f"podrun-{podrun.__version__}.dist-info/METADATA").decode())
except PodrunError as error:
    sys.exit(str(error))
"""


def test_podrun_outside_its_checkout_takes_its_requirements_from_its_installed_metadata_or_says_it_cannot(tmp_path):
    copy = tmp_path / "elsewhere"
    shutil.copytree(ROOT / "podrun", copy / "podrun", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"}
    neither = subprocess.run([sys.executable, "-S", "-c", BUILD_A_WHEEL, str(tmp_path / "w1")], env=env, cwd=tmp_path,
                             capture_output=True, text=True)  # no site-packages: no installed podrun
    assert (neither.returncode, neither.stdout) == (1, "")
    assert neither.stderr == (f"cannot tell the requirements of this podrun ({__version__}, in {copy / 'podrun'}) to "
                              f"install it on the supervisor host: it is neither a checkout with its pyproject.toml "
                              f"nor an installed distribution of that version; install it (pip install "
                              f"PATH_OF_THE_CHECKOUT)\n")
    try:
        installed_version = metadata.version("podrun")
    except metadata.PackageNotFoundError:
        installed_version = None
    if installed_version != __version__:
        pytest.skip(f"the suite's Python has no install of podrun {__version__} to read (pip install -e .)")
    installed = subprocess.run([sys.executable, "-c", BUILD_A_WHEEL, str(tmp_path / "w2")], env=env, cwd=tmp_path,
                               capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    assert [line.removeprefix("Requires-Dist: ") for line in installed.stdout.splitlines()
            if line.startswith("Requires-Dist: ")] == [
        requirement for requirement in metadata.requires("podrun") or [] if "extra ==" not in requirement]


@pytest.mark.lab
@pytest.mark.slow
def test_a_host_without_podrun_gets_this_one_in_its_venv_with_one_line_and_only_once(lab, host_home, capsys):
    assert podrun_there(lab) == VENV_PODRUN
    assert said(capsys) == [f"podrun: supervisor {lab.hosts[HOST].ip}: no podrun {__version__} on its login PATH "
                            f"(it has none); installing this podrun ({__version__}) into ~/.podrun/venv with its "
                            f"python3 and pip"]
    assert lab.run(HOST, f"{VENV_PODRUN} --version").stdout == f"podrun {__version__}\n"
    installed = next((host_home / ".podrun/venv/lib").glob(f"python3*/site-packages/podrun-{__version__}.dist-info"))
    installed_at = installed.stat().st_mtime_ns

    assert podrun_there(lab) == VENV_PODRUN
    assert said(capsys) == []
    assert installed.stat().st_mtime_ns == installed_at


@pytest.mark.lab
@pytest.mark.slow
def test_a_host_with_other_versions_on_its_login_path_and_in_its_venv_gets_this_one_in_the_venv_with_one_line(
        lab, host_home, capsys):
    put_on_login_path(host_home, "podrun", OLD_PODRUN)
    older_in_venv = host_home / ".podrun/venv/bin/podrun"  # as a podrun 0.0.8 installed there would answer
    older_in_venv.parent.mkdir(parents=True)
    older_in_venv.write_text(OLD_PODRUN.replace("0.0.9", "0.0.8"))
    older_in_venv.chmod(0o755)
    assert podrun_there(lab) == VENV_PODRUN
    assert said(capsys) == [f"podrun: supervisor {lab.hosts[HOST].ip}: no podrun {__version__} on its login PATH "
                            f"(it has podrun 0.0.9 at /root/.local/bin/podrun) nor in ~/.podrun/venv (it has podrun "
                            f"0.0.8 at {VENV_PODRUN}); installing this podrun ({__version__}) into ~/.podrun/venv with "
                            f"its python3 and pip"]
    assert lab.run(HOST, f"{VENV_PODRUN} --version").stdout == f"podrun {__version__}\n"

    assert podrun_there(lab) == VENV_PODRUN
    assert said(capsys) == [f"podrun: supervisor {lab.hosts[HOST].ip}: its login PATH has podrun 0.0.9 "
                            f"at /root/.local/bin/podrun; using podrun {__version__} from ~/.podrun/venv"]


@pytest.mark.lab
def test_a_configured_podrun_of_this_version_is_used_and_one_of_another_or_none_is_one_line(lab, host_home, capsys):
    put_on_login_path(host_home, "podrun-mine", OLD_PODRUN.replace("0.0.9", __version__))
    assert podrun_there(lab, "podrun-mine") == "/root/.local/bin/podrun-mine"
    put_on_login_path(host_home, "podrun", OLD_PODRUN)
    with pytest.raises(PodrunError) as error:
        podrun_there(lab, "~/.local/bin/podrun")
    assert str(error.value) == (f"supervisor {lab.hosts[HOST].ip}: supervisor.podrun ~/.local/bin/podrun: "
                                f"podrun 0.0.9 at /root/.local/bin/podrun there, and this podrun is {__version__}; "
                                f"install podrun {__version__} there, or leave supervisor.podrun out and podrun "
                                f"installs itself into ~/.podrun/venv on that host")
    with pytest.raises(PodrunError, match=r"supervisor.podrun /opt/nowhere/podrun: not found there, and this podrun"):
        podrun_there(lab, "/opt/nowhere/podrun")
    assert said(capsys) == []
    assert not (host_home / ".podrun").exists()


@pytest.mark.lab
@pytest.mark.slow
def test_a_host_that_reaches_no_index_is_one_line_with_pips_cause(lab, host_home, capsys):
    shutil.rmtree(host_home / ".config")
    with pytest.raises(PodrunError) as error:
        podrun_there(lab)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"supervisor {lab.hosts[HOST].ip}: cannot install podrun {__version__} into "
                              f"~/.podrun/venv: pip: No matching distribution found for ")
    assert message.endswith("; give the host a package index for pip (pip.conf, PIP_INDEX_URL, find-links) or "
                            f"install podrun {__version__} there and set supervisor.podrun")
    assert len(said(capsys)) == 1  # the install it tried


@pytest.mark.lab
def test_a_host_whose_python3_makes_no_venv_is_one_line_with_its_words(lab, host_home, capsys):
    put_on_login_path(host_home, "python3", NO_VENV_PYTHON)
    with pytest.raises(PodrunError) as error:
        podrun_there(lab)
    assert str(error.value) == (
        f"supervisor {lab.hosts[HOST].ip}: cannot install podrun {__version__} into ~/.podrun/venv: python3 -m venv: "
        f"The virtual environment was not created successfully because ensurepip is not available. On Debian/Ubuntu "
        f"systems, you need to install the python3-venv package using the following command. apt install "
        f"python3.11-venv; give it a python3 with its venv module or install podrun {__version__} there and set "
        f"supervisor.podrun")
    assert not (host_home / ".podrun/venv").exists()


@pytest.mark.slow
def test_exec_through_a_supervisor_without_podrun_installs_it_there_once_and_runs_the_job(lab, host_home, hosts_spec):
    supervisor_line = f"supervisor: {{host: root@{lab.hosts[HOST].ip}}}\n"
    spec = hosts_spec(f"run: 'echo ran on $PODRUN_WORKER'\n{supervisor_line}", hosts=(0, 1))
    first = podrun("exec", spec)
    assert first.returncode == 0, first.stderr
    assert f"installing this podrun ({__version__}) into ~/.podrun/venv" in first.stderr
    assert sorted(line for line in first.stdout.splitlines() if "ran on" in line) == ["[w0] ran on 0", "[w1] ran on 1"]
    again = podrun("exec", spec)
    assert again.returncode == 0 and "installing" not in again.stderr, again.stderr


COUNTING_PYTHON3 = """#!/bin/sh
echo "$*" >> "$HOME/python3-calls"
exec /usr/bin/python3 "$@"
"""


def podruns_there_at_once(lab, count: int) -> list[str]:
    async def find_all() -> list[str]:
        transports = [SshTransport(lab.hosts[HOST].ip, 22, "root", str(lab.client_key), True) for _ in range(count)]
        try:
            await asyncio.gather(*(transport.connect() for transport in transports))
            return await asyncio.gather(*(podrun_on_host(transport, lab.hosts[HOST].ip, None) for transport in transports))
        finally:
            await asyncio.gather(*(transport.close() for transport in transports))

    return asyncio.run(find_all())


@pytest.mark.lab
@pytest.mark.slow
def test_two_first_handovers_at_once_to_a_fresh_host_install_once_and_both_get_it(lab, host_home):
    put_on_login_path(host_home, "python3", COUNTING_PYTHON3)  # counts the venvs made
    assert podruns_there_at_once(lab, 2) == [VENV_PODRUN, VENV_PODRUN]
    assert [line for line in (host_home / "python3-calls").read_text().splitlines() if line.startswith("-m venv")] == [
        "-m venv /root/.podrun/venv"]
    assert lab.run(HOST, f"{VENV_PODRUN} --version").stdout == f"podrun {__version__}\n"
    assert not list((host_home / ".podrun").glob("install.*[0-9]"))  # neither left its wheel behind


@pytest.mark.lab
def test_an_install_that_waits_past_its_bound_for_another_is_one_line(lab, host_home, monkeypatch):
    (host_home / ".podrun").mkdir()
    monkeypatch.setenv("PODRUN_SUPERVISOR_INSTALL_WAIT", "1")
    with open(host_home / ".podrun/install.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another handover's install, as flock(1) there holds it
        with pytest.raises(PodrunError) as error:
            podrun_there(lab)
    assert str(error.value) == (f"supervisor {lab.hosts[HOST].ip}: cannot install podrun {__version__} into "
                                f"~/.podrun/venv: another install there held ~/.podrun/install.lock for 1s; "
                                f"PODRUN_SUPERVISOR_INSTALL_WAIT sets the seconds to wait")
    assert not (host_home / ".podrun/venv").exists()


@pytest.mark.lab
def test_a_host_whose_login_waits_fails_the_version_check_within_its_bound_in_one_line(lab, host_home, monkeypatch):
    (host_home / ".profile").write_text("sleep 20\n")  # as a login that waits for an answer
    monkeypatch.setenv("PODRUN_SUPERVISOR_CHECK_TIMEOUT", "1")
    started = time.monotonic()
    with pytest.raises(PodrunError) as error:
        podrun_there(lab)
    assert time.monotonic() - started < 10
    assert str(error.value) == (f"supervisor {lab.hosts[HOST].ip}: no answer within 1s to podrun's version check "
                                f"there (does its login shell wait for input? try `ssh {lab.hosts[HOST].ip} true`); "
                                f"PODRUN_SUPERVISOR_CHECK_TIMEOUT sets the seconds")


@pytest.mark.slow
def test_two_execs_at_once_through_a_fresh_supervisor_both_run_and_install_it_once(lab, host_home, hosts_spec):
    put_on_login_path(host_home, "python3", COUNTING_PYTHON3)
    spec = hosts_spec(f"run: 'echo ran on $PODRUN_WORKER'\nsupervisor: {{host: root@{lab.hosts[HOST].ip}}}\n",
                      hosts=(0, 1))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: podrun("exec", spec), range(2)))
    for result in results:
        assert result.returncode == 0, result.stderr
        assert sorted(line for line in result.stdout.splitlines() if "ran on" in line) == [
            "[w0] ran on 0", "[w1] ran on 1"]
    assert [line for line in (host_home / "python3-calls").read_text().splitlines() if line.startswith("-m venv")] == [
        "-m venv /root/.podrun/venv"]


@pytest.mark.lab
def test_a_script_that_ends_before_it_reads_its_input_is_read_not_a_broken_connection(lab, home):
    """The probe reads nothing, and an install can fail before it read the wheel: what either said is its
    answer, never `the connection broke` (seen once when the probe ended before podrun sent its end of input)."""
    async def run() -> dict[str, str]:
        transport = SshTransport(lab.hosts[HOST].ip, 22, "root", str(lab.client_key), True)
        await transport.connect()
        try:
            return await run_script(transport, lab.hosts[HOST].ip, f"printf '{MARK}failed=receive\\n'",
                                     b"wheel" * 2_000_000)
        finally:
            await transport.close()

    assert asyncio.run(run())["failed"] == "receive"
