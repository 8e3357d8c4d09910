"""Other users on a shared machine (issue 37, part 6: "Root through stacks" and "Modes"): a process that
copies a root job's PODRUN_JOB_ID and PODRUN_WORKER gets no program of its own run as root by `podrun
stacks` or a stall's dump, and is not dumped; the job's id and directory are on no command line that
`ps` shows; and PODRUN_HOME with what podrun makes in it is the user's only (0700) under umask 022, even
where an older run left it open."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from podrun.remote import stacks
from podrun.transport.base import cache_name

from helpers import Background, job_id_in, podrun, processes_of_job, wait_until

STALLED = 124
# prints until the file named by its argument exists (the test's strangers are in place by then), then
# hangs where a rank stuck in a collective would
HANG = """\
import os, sys, time

def hang_in_collective():
    time.sleep(600)

print("up", flush=True)
while not os.path.exists(sys.argv[1]):
    print("waiting", flush=True)
    time.sleep(0.1)
hang_in_collective()
"""
STRANGER_SAYS = "a stranger's py-spy ran"
# a stranger is an account made for the test: with parallel workers, on the one that adds accounts (conftest.py)
ADDS_AN_ACCOUNT = pytest.mark.xdist_group("accounts")


class Strangers:
    """For each worker of a job, two Python processes that are not the job's but carry its PODRUN_JOB_ID and
    PODRUN_WORKER, each with a `py-spy` of its own first on its PATH (it notes who ran it in `ran`): one of
    another local user, made for the test, and one of root outside the job's process tree."""

    def __init__(self, job_id: str, workers: int):
        if os.geteuid() != 0:
            pytest.skip("the launcher runs as root here only: the case is a root job's")
        self.user = f"podrun-nb-{uuid.uuid4().hex[:8]}"
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", self.user],
                       check=True)
        account = pwd.getpwnam(self.user)
        self.folder = Path(tempfile.mkdtemp(prefix="podrun-stranger-"))
        os.chown(self.folder, account.pw_uid, account.pw_gid)
        self.folder.chmod(0o755)
        self.ran = self.folder / "ran"
        py_spy = self.folder / "py-spy"
        py_spy.write_text(f"#!/bin/sh\nid -u >> {self.ran}\necho \"{STRANGER_SAYS}, as uid $(id -u)\"\n")
        py_spy.chmod(0o755)
        self.processes = []
        for worker in range(workers):
            env = {"PATH": f"{self.folder}:/usr/bin:/bin", "PODRUN_JOB_ID": job_id, "PODRUN_WORKER": str(worker)}
            for who in ({"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}, {}):
                self.processes.append(subprocess.Popen(["/usr/bin/python3", "-c", "import time; time.sleep(600)"],
                                                       env=env, cwd="/", start_new_session=True, **who))

    @property
    def pids(self) -> set[int]:
        return {process.pid for process in self.processes}

    def check_untouched(self, *texts: str) -> None:
        """No stranger's py-spy ran, and none of the texts shows a stranger's process."""
        assert not self.ran.exists(), f"a stranger's py-spy ran as uid {self.ran.read_text().split()}"
        for text in texts:
            assert STRANGER_SAYS not in text
            assert not [pid for pid in self.pids if f"=== pid {pid} (" in text], text

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
        subprocess.run(["userdel", self.user], check=True)
        shutil.rmtree(self.folder)


@contextlib.contextmanager
def strangers(job_id: str, workers: int):
    made = Strangers(job_id, workers)
    try:
        yield made
    finally:
        made.close()


def job_processes_but(job_id: str, strangers_: Strangers) -> list[str]:
    return [line for line in processes_of_job(job_id) if int(line.split()[0]) not in strangers_.pids]


def stacks_of(home: Path, job_id: str, dump: int = 1) -> dict[str, str]:
    folder = home / "jobs" / job_id / "stacks" / str(dump)
    return {path.name: path.read_text() for path in sorted(folder.iterdir())}


@pytest.mark.slow
@ADDS_AN_ACCOUNT
def test_podrun_stacks_as_root_dumps_the_jobs_own_processes_only_and_runs_no_strangers_py_spy(home, job_file,
                                                                                              tmp_path):
    released = tmp_path / "released"
    released.touch()
    spec = job_file(f"run: python3 hang.py {released}\ntarget: {{local: {{workers: 2}}}}\n", {"hang.py": HANG})
    job_id = job_id_in(podrun("exec", "--detach", spec).stderr)
    try:
        wait_until(lambda: podrun("logs", "--no-collapse", job_id).stdout.count("] up\n") == 2, "both workers' first line")
        with strangers(job_id, 2) as others:
            shown = podrun("stacks", "--all")
            assert shown.returncode == 0, shown.stderr
            others.check_untouched(shown.stdout, *stacks_of(home, job_id).values())
        for worker in ("0", "1"):  # the job's own processes, by the real py-spy (on the job's PATH)
            section = shown.stdout.split(f"── worker {worker} (")[1].split("── worker")[0]
            assert "python3 hang.py" in section and "py-spy dump --pid" in section, shown.stdout
            assert "hang_in_collective (hang.py:4)" in section, shown.stdout
    finally:
        podrun("stop", job_id)
    assert not processes_of_job(job_id)


@ADDS_AN_ACCOUNT
def test_on_ssh_hosts_as_root_podrun_stacks_runs_no_strangers_py_spy(home, lab, hosts_spec, tmp_path):
    released = tmp_path / "released"  # the lab's hosts share this machine's files but /root
    released.touch()
    spec = hosts_spec(f"run: python3 hang.py {released}\n", hosts=(0, 1), files={"hang.py": HANG})
    job_id = job_id_in(podrun("exec", "--detach", spec).stderr)
    try:
        wait_until(lambda: podrun("logs", "--no-collapse", job_id).stdout.count("] up\n") == 2, "both workers' first line")
        with strangers(job_id, 2) as others:
            shown = podrun("stacks", job_id, "--all")
            assert shown.returncode == 0, shown.stderr
            others.check_untouched(shown.stdout)
        assert shown.stdout.count("hang_in_collective (hang.py:4)") == 2, shown.stdout
    finally:
        podrun("stop", job_id)
    assert not processes_of_job(job_id)


@pytest.mark.slow
@ADDS_AN_ACCOUNT
def test_a_stalls_dump_as_root_leaves_strangers_alone(home, job_file, tmp_path):
    released = tmp_path / "released"
    spec = job_file(f"run: python3 hang.py {released}\nstall: 2s\nstop_grace: 1s\ntarget: {{local: {{workers: 2}}}}\n",
                    {"hang.py": HANG})
    job_id = job_id_in(podrun("exec", "--detach", spec).stderr)
    with strangers(job_id, 2) as others:
        released.touch()  # the job goes silent only now: the stall's dump finds the strangers there
        wait_until(lambda: not job_processes_but(job_id, others), "the job's agents to stop it on its stall", timeout=30)
        followed = podrun("logs", "-f", job_id)
        assert followed.returncode == STALLED, followed.stderr
        saved = stacks_of(home, job_id)
        others.check_untouched(*saved.values())
    assert "hang_in_collective (hang.py:4)" in saved["w1.txt"] and "hang_in_collective (hang.py:4)" in saved["w0.txt"]


def test_a_py_spy_record_another_user_owns_or_could_write_is_not_used(tmp_path):
    """The record the agent made is 0600 in a 0700 folder; one that is not so was not written by it alone."""
    record = tmp_path / "run.py-spy"
    record.write_text("/opt/tools/py-spy\n")
    record.chmod(0o600)
    assert stacks.recorded_py_spy(str(record)) == "/opt/tools/py-spy"
    record.chmod(0o620)
    assert stacks.recorded_py_spy(str(record)) is None
    record.chmod(0o600)
    if os.geteuid() == 0:  # only root gives a file away
        os.chown(record, 65534, 65534)
        assert stacks.recorded_py_spy(str(record)) is None
        os.chown(record, 0, 0)
    record.write_text("")  # no py-spy on the job's PATH as it started
    assert stacks.recorded_py_spy(str(record)) is None


def command_lines_naming(text: str, but: set[int]) -> list[str]:
    """`ps -eo pid,args` lines that hold text, of every process but those in `but`."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args and int(entry) not in but:
            found.append(f"{entry} {args[:300]}")
    return found


def helper_running(name: str) -> bool:
    """Whether a process runs podrun/remote/`name`.py (its bootstrap on its command line names its cache entry)."""
    return bool(command_lines_naming(cache_name(name), but=set()))


@pytest.mark.slow
def test_the_follower_stopper_and_stacks_helpers_take_the_job_on_stdin_not_on_a_command_line(home, job_file,
                                                                                             tmp_path):
    """The user ran `podrun stop JOB_ID` themselves: that command line is theirs; its helpers' are podrun's."""
    released, dumping = tmp_path / "released", tmp_path / "dumping"
    released.touch()
    job_bin = tmp_path / "job-bin"  # the job's own py-spy, first on its PATH: it dumps once the test has looked
    job_bin.mkdir()
    (job_bin / "py-spy").write_text(f"#!/bin/sh\ntouch {dumping}\nwhile [ ! -e {tmp_path}/looked ]; do sleep 0.05; done\n"
                                    "echo \"the job's own py-spy\"\n")
    (job_bin / "py-spy").chmod(0o755)
    spec = job_file(f"run: trap '' TERM; exec python3 hang.py {released}\nstop_grace: 2s\n"
                    f"env: {{PATH: '{job_bin}:{os.environ['PATH']}'}}\ntarget: {{local: {{workers: 2}}}}\n",
                    {"hang.py": HANG})
    job_id = job_id_in(podrun("exec", "--detach", spec).stderr)
    follower = Background("logs", "-f")
    try:
        wait_until(lambda: helper_running("log_follower"), "the log followers")
        assert command_lines_naming(job_id, but=set()) == []
        stacks = Background("stacks", "--all")
        wait_until(dumping.exists, "the stacks helper to start the job's py-spy")
        assert helper_running("stacks")
        assert command_lines_naming(job_id, but=set()) == []
        (tmp_path / "looked").touch()
        assert stacks.finish() == 0, stacks.text
        assert "the job's own py-spy" in stacks.text
    finally:
        (tmp_path / "looked").touch()
        stop = Background("stop", job_id)  # SIGTERM is ignored: each stopper waits out the grace period
        wait_until(lambda: helper_running("detached_stopper"), "the stoppers")
        assert command_lines_naming(job_id, but={stop.process.pid}) == []
        assert stop.finish() == 0, stop.text
        assert follower.finish() != 0
    assert not processes_of_job(job_id)


def private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) == 0o700


def test_podrun_home_and_the_folders_podrun_makes_in_it_are_private_under_umask_022_even_if_left_open(
        home, job_file):
    for folder in (home, home / "jobs", home / "local", home / "local" / "w0"):  # as a run before 0700 left them
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
    result = podrun("exec", job_file("run: echo ok\ntarget: {local: {workers: 2}}\n"), umask=0o022)
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)
    made = [home, home / "jobs", home / "jobs" / job_id, home / "local", home / "local" / "w0", home / "local" / "w1"]
    assert [folder for folder in made if not private(folder)] == []


def test_a_fresh_podrun_home_under_umask_022_is_private_from_the_first_run(tmp_path, job_file, monkeypatch):
    home = tmp_path / "deep" / "podrun-home"  # its parent is made too: the user's to open, not podrun's
    monkeypatch.setenv("PODRUN_HOME", str(home))
    result = podrun("exec", job_file("run: echo ok\ntarget: {local: {workers: 1}}\n"), umask=0o022)
    assert result.returncode == 0, result.stderr
    assert private(home) and private(home / "local")


def test_a_shared_folder_named_as_podrun_home_is_left_as_it_is(tmp_path, job_file, monkeypatch):
    shared = tmp_path / "shared"  # as /tmp: everyone's, sticky
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("PODRUN_HOME", str(shared))
    result = podrun("exec", job_file("run: echo ok\ntarget: {local: {workers: 1}}\n"), umask=0o022)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert private(shared / "jobs") and private(shared / "local")


def test_the_supervisors_podrun_home_and_job_folders_are_private_even_if_left_open(home, lab, hosts_spec, supervisor):
    there = supervisor.home / ".podrun"
    for folder in (there, there / "jobs"):  # as a run before 0700 left them
        folder.mkdir(mode=0o755, exist_ok=True)
        folder.chmod(0o755)
    result = podrun("exec", hosts_spec(f"run: echo ok\n{supervisor.spec}", hosts=(0,)))
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)
    # the job's console (what its launcher there printed) lives in its folder, and goes with it
    assert [folder for folder in (there, there / "jobs", there / "jobs" / job_id, there / "jobs" / job_id / "console")
            if not private(folder)] == []

