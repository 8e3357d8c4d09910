"""Hostile files (issue 27, items 5 to 8): what a worker sends down with `podrun cp` (setuid bits,
foreign owners, device nodes, names that read as tar options), what is unpacked as root on a worker
(uploads, shipped code), a user's directory with an all-hex name beside run/, and a job's symbolic
links in run/. Real copies and jobs on local workers, as root (the tests run as root: as any other
user, tar drops owners and setuid bits on its own)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from helpers import podrun, stderr_lines_without_traceback

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="what tar keeps differs only as root")

FOREIGN_UID = 4242


def worker_dir(home: Path, index: int = 0) -> Path:
    path = home / "local" / f"w{index}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def foreign_setuid_file(path: Path) -> Path:
    path.write_text("#!/bin/sh\nid\n")
    os.chown(path, FOREIGN_UID, FOREIGN_UID)
    path.chmod(0o4755)
    return path


def assert_owned_by_us_without_special_bits(path: Path) -> None:
    info = path.lstat()
    assert (info.st_uid, info.st_gid) == (os.getuid(), os.getgid()), path
    assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX), oct(info.st_mode)


def test_a_download_as_root_keeps_no_setuid_bit_or_foreign_owner(home, tmp_path):
    sent = worker_dir(home) / "out"
    sent.mkdir()
    foreign_setuid_file(sent / "tool")
    os.chown(sent, FOREIGN_UID, FOREIGN_UID)
    sent.chmod(0o3777)  # setgid and sticky, writable by all
    copied = podrun("cp", "--local", "1", "-r", ":out", tmp_path / "back")
    assert copied.returncode == 0, copied.stderr
    assert_owned_by_us_without_special_bits(tmp_path / "back")
    assert_owned_by_us_without_special_bits(tmp_path / "back" / "tool")
    assert stat.S_IMODE((tmp_path / "back" / "tool").stat().st_mode) == 0o755 & ~current_umask()
    assert stat.S_IMODE((tmp_path / "back").stat().st_mode) == 0o777 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_download_holding_device_nodes_or_fifos_is_refused_naming_them(home, tmp_path):
    sent = worker_dir(home) / "out"
    (sent / "deep").mkdir(parents=True)
    (sent / "data.txt").write_text("data\n")
    os.mknod(sent / "deep" / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mkfifo(sent / "pipe")
    copied = podrun("cp", "--local", "1", "-r", ":out", tmp_path / "back")
    assert copied.returncode == 1
    assert stderr_lines_without_traceback(copied.stderr) == [
        "podrun: error: worker 0 (local/w0): :out/deep/null is a character device, :out/pipe is a fifo: "
        "podrun cp copies files, directories and symbolic links only"]
    assert not (tmp_path / "back").exists() and not list(tmp_path.glob(".podrun-cp-*"))


def test_an_upload_holding_a_fifo_is_refused_before_connecting(home, tmp_path):
    (tmp_path / "up").mkdir()
    os.mkfifo(tmp_path / "up" / "pipe")
    copied = podrun("cp", "--local", "1", "-r", tmp_path / "up", ":up")
    assert copied.returncode == 2, copied.stderr
    assert stderr_lines_without_traceback(copied.stderr) == [
        f"podrun: error: {tmp_path}/up/pipe is a fifo: podrun cp copies files, directories and symbolic links only"]
    assert not (worker_dir(home) / "up").exists()


def test_remote_names_that_read_as_tar_options_are_copied_as_names(home, tmp_path):
    """Before: tar on the worker took them for options, and ran the command at its first checkpoint."""
    names = ["--checkpoint=1", "--checkpoint-action=exec=touch pwned", "data.txt"]
    for name in names:
        (worker_dir(home) / name).write_text(f"{name}\n")
    (tmp_path / "back").mkdir()
    copied = podrun("cp", "--local", "1", *(f":{name}" for name in names), tmp_path / "back")
    assert not list(tmp_path.rglob("pwned"))
    assert copied.returncode == 0, copied.stderr
    assert sorted(path.name for path in (tmp_path / "back").iterdir()) == sorted(names)
    assert all((tmp_path / "back" / name).read_text() == f"{name}\n" for name in names)


@pytest.mark.slow
def test_uploads_and_shipped_code_unpacked_as_root_on_a_worker_keep_no_foreign_owner_or_setuid(home, tmp_path,
                                                                                               job_file):
    tool = foreign_setuid_file(tmp_path / "tool")
    copied = podrun("cp", "--local", "1", tool, ":tool")
    assert copied.returncode == 0, copied.stderr
    assert_owned_by_us_without_special_bits(worker_dir(home) / "tool")

    spec = job_file("run: ls -n tool\n", files={"tool": ""})
    foreign_setuid_file(spec.parent / "code" / "tool")
    ran = podrun("exec", spec)
    assert ran.returncode == 0, ran.stderr
    for index in (0, 1):
        name_dir = worker_dir(home, index) / "podrun" / "job"
        (version,) = [path for path in name_dir.iterdir() if path.is_dir() and path.name != "run"]
        assert_owned_by_us_without_special_bits(version / "tool")
        assert_owned_by_us_without_special_bits(name_dir / "run" / "tool")


@pytest.mark.slow
def test_disk_free_keeps_a_users_directory_whose_name_looks_like_a_code_version(home, job_file):
    spec = job_file("run: cat version.txt\n", files={"version.txt": "v1\n"})
    assert podrun("exec", spec).returncode == 0
    (spec.parent / "code" / "version.txt").write_text("v2\n")
    assert podrun("exec", spec).returncode == 0
    name_dir = worker_dir(home) / "podrun" / "job"
    for user_dir in ("2024", "cafe"):
        (name_dir / user_dir).mkdir()
        (name_dir / user_dir / "results.csv").write_text("mine\n")
    freed = podrun("disk", spec, "--free")
    assert freed.returncode == 0, freed.stderr
    assert "1 version, 0 jobs:" in freed.stdout.splitlines()[1]  # the old version, and only that
    for user_dir in ("2024", "cafe"):
        assert (name_dir / user_dir / "results.csv").read_text() == "mine\n"
    shown = podrun("disk", spec)
    assert shown.stdout.splitlines()[1].split()[2:4] == ["1", "version,"]


@pytest.mark.slow
def test_a_jobs_symbolic_link_in_the_run_dir_is_never_followed_out_of_it(home, tmp_path, job_file):
    """A job replaced run/src/ by a link to a directory elsewhere. Before: the next checkout replaced the
    file there by the code's, and the one after (code without it) deleted it."""
    spec = job_file("run: cat src/a.py\n", files={"src/a.py": "code\n"})
    assert podrun("exec", spec).returncode == 0
    outside = []
    for index in (0, 1):
        elsewhere = tmp_path / f"elsewhere{index}"
        elsewhere.mkdir()
        (elsewhere / "a.py").write_text("mine\n")
        outside.append(elsewhere)
        link_in_place_of(worker_dir(home, index) / "podrun" / "job" / "run" / "src", elsewhere)

    again = podrun("exec", spec)
    assert again.returncode == 0, again.stderr
    assert "[w0-1] code" in again.stdout.splitlines()
    for index, elsewhere in enumerate(outside):
        run_src = worker_dir(home, index) / "podrun" / "job" / "run" / "src"
        assert run_src.is_dir() and not run_src.is_symlink()  # the link itself gave way
        assert (elsewhere / "a.py").read_text() == "mine\n" and (elsewhere / "a.py").stat().st_nlink == 1
        link_in_place_of(run_src, elsewhere)

    code = spec.parent / "code" / "src"
    (code / "a.py").unlink()
    (code / "b.py").write_text("other code\n")
    spec.write_text(spec.read_text().replace("src/a.py", "src/b.py"))
    last = podrun("exec", spec)
    assert last.returncode == 0, last.stderr
    assert "[w0-1] other code" in last.stdout.splitlines()
    for elsewhere in outside:
        assert sorted(path.name for path in elsewhere.iterdir()) == ["a.py"]
        assert (elsewhere / "a.py").read_text() == "mine\n"


def link_in_place_of(directory: Path, target: Path) -> None:
    shutil.rmtree(directory)
    directory.symlink_to(target)
