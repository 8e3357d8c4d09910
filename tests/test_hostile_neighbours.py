"""Other users on a shared machine (issue 37, part 6: "Root through stacks" and "Modes"): a process that
copies a root job's PODRUN_JOB_ID and PODRUN_WORKER gets no program of its own run as root by `podrun
stacks` or a stall's dump, and is not dumped; the job's id and directory are on no command line that
`ps` shows; and PODRUN_HOME with what podrun makes in it is the user's only (0700) under umask 022, even
where an older run left it open."""

from __future__ import annotations

import stat
from pathlib import Path

from conftest import job_id_in, podrun


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


def test_the_supervisors_podrun_home_and_supervised_folder_are_private_even_if_left_open(home, lab, hosts_spec,
                                                                                         supervisor):
    there = supervisor.home / ".podrun"
    for folder in (there, there / "supervised"):  # as a run before 0700 left them
        folder.mkdir(mode=0o755, exist_ok=True)
        folder.chmod(0o755)
    result = podrun("exec", hosts_spec(f"run: echo ok\n{supervisor.spec}", hosts=(0,)))
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)
    assert [folder for folder in (there, there / "supervised", there / "supervised" / job_id, there / "jobs")
            if not private(folder)] == []

