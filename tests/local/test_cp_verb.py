"""`podrun cp`: to and from workers with gcloud's `tpu-vm scp` conventions (:PATH, --worker, --recurse);
uploads through the relay, downloads from several workers into DEST/w<i>/, nothing half-copied."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import BLOB_BYTES, REPO, bridge_sent_bytes, lab_flags, podrun, stderr_lines_without_traceback, tree_listing


def project(root: Path) -> Path:
    """A directory with what a copy must keep: nesting, an empty directory, an executable, a link."""
    source = root / "ckpt"
    (source / "shards").mkdir(parents=True)
    (source / "empty").mkdir()
    (source / "shards" / "0.bin").write_bytes(os.urandom(100_000))
    (source / "run.sh").write_text("#!/bin/sh\necho run\n")
    (source / "run.sh").chmod(0o755)
    (source / "latest").symlink_to("shards/0.bin")
    return source


def test_a_directory_goes_to_every_local_worker_and_comes_back_from_each_into_its_own_folder(home, tmp_path):
    source = project(tmp_path)
    up = podrun("cp", "--local", "3", "--recurse", source, ":saved")
    assert up.returncode == 0, up.stderr
    assert up.stderr == "podrun: copied 1 path to 3 workers: " + up.stderr.rsplit(": ", 1)[1]
    for index in range(3):
        worker_copy = home / "local" / f"w{index}" / "saved"
        assert tree_listing(worker_copy) == tree_listing(source)
        assert (worker_copy / "empty").is_dir()
    assert not list((home / "local" / "w0" / ".podrun" / "cp").iterdir())  # the staging directory is gone
    down = podrun("cp", "--local", "3", "-r", ":saved", ":saved/run.sh", tmp_path / "back")
    assert down.returncode == 0, down.stderr
    for index in range(3):
        assert tree_listing(tmp_path / "back" / f"w{index}" / "saved") == tree_listing(source)
        assert (tmp_path / "back" / f"w{index}" / "run.sh").read_text() == "#!/bin/sh\necho run\n"
    assert not list(tmp_path.glob(".podrun-cp-*"))


def test_as_scp_a_copy_lands_inside_an_existing_directory_and_one_worker_copies_to_dest_itself(home, tmp_path):
    source = project(tmp_path)
    assert podrun("cp", "--local", "2", "-r", source, ":saved").returncode == 0
    assert podrun("cp", "--local", "2", "-r", source, ":saved").returncode == 0  # saved exists: saved/ckpt
    assert tree_listing(home / "local" / "w1" / "saved" / "ckpt") == tree_listing(source)
    (source / "run.sh").write_text("changed\n")
    assert podrun("cp", "--local", "2", source / "run.sh", ":saved/run.sh").returncode == 0  # a file replaces a file
    assert (home / "local" / "w0" / "saved" / "run.sh").read_text() == "changed\n"
    one = podrun("cp", "--local", "2", "--worker", "1", ":saved/run.sh", tmp_path / "from-w1.sh")
    assert one.returncode == 0, one.stderr
    assert (tmp_path / "from-w1.sh").read_text() == "changed\n"
    assert not (tmp_path / "w1").exists()


def test_a_copy_that_fails_leaves_the_destination_as_it_was(home, tmp_path):
    source = project(tmp_path)
    assert podrun("cp", "--local", "2", "-r", source, ":saved").returncode == 0
    failed = podrun("cp", "--local", "2", "--worker", "0", "-r", ":saved", ":missing", tmp_path / "back")
    assert failed.returncode == 1
    assert stderr_lines_without_traceback(failed.stderr) == [
        "podrun: error: worker 0 (local/w0): :missing: no such file or directory"]
    assert not (tmp_path / "back").exists() and not list(tmp_path.glob(".podrun-cp-*"))


@pytest.mark.parametrize("args, message", [
    (["--local", "2", "{src}", ":d"], "{src}: is a directory (use --recurse)"),
    (["--local", "2", "--worker", "0", ":saved", "d"], "worker 0 (local/w0): :saved: is a directory (use --recurse)"),
    (["--local", "2", "nothing-here", ":d"], "nothing-here: no such file or directory"),
    (["--local", "2", ":a", "b", ":c"], ":a b :c: expected every SRC remote (:PATH) and DEST local, or every SRC "
                                        "local and DEST remote"),
    (["--local", "2", "a", "b"], "a b: expected every SRC remote (:PATH) and DEST local, or every SRC local and "
                                 "DEST remote"),
    (["--local", "2", ":a"], "expected SRC... DEST, one side remote (written :PATH)"),
    (["--local", "2", "--worker", "7", ":a", "b"], "--worker '7': this target has workers 0 to 1"),
    (["no-such.yaml", ":a", "b"], "no-such.yaml: no such file"),
])
def test_bad_copies_are_one_line(home, tmp_path, args, message):
    source = project(tmp_path)
    assert podrun("cp", "--local", "2", "-r", source, ":saved").returncode == 0
    result = podrun("cp", *(arg.format(src=source) for arg in args))
    assert result.returncode in (1, 2)
    assert stderr_lines_without_traceback(result.stderr) == [f"podrun: error: {message.format(src=source)}"]


def test_a_spec_names_the_target(home, job_file, tmp_path):
    spec = job_file("target: {local: {workers: 2}}\nrun: echo hi\n")
    (tmp_path / "note.txt").write_text("hi\n")
    assert podrun("cp", spec, tmp_path / "note.txt", ":note.txt").returncode == 0
    assert (home / "local" / "w1" / "note.txt").read_text() == "hi\n"


def test_a_large_copy_shows_its_progress_on_a_terminal(home, tmp_path):
    (tmp_path / "big.bin").write_bytes(os.urandom(8 << 20))
    reader, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "podrun", "cp", "--local", "2", tmp_path / "big.bin", ":big.bin"],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    shown = b""
    while chunk := _read(reader):
        shown += chunk
    assert process.wait(timeout=60) == 0
    assert b"podrun: shipping files: " in shown and b" sent, " in shown and b"/2 worker(s) done" in shown
    down = subprocess.Popen([sys.executable, "-m", "podrun", "cp", "--local", "2", ":big.bin", tmp_path / "back"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=(terminal := pty.openpty())[1])
    os.close(terminal[1])
    shown = b""
    while chunk := _read(terminal[0]):
        shown += chunk
    assert down.wait(timeout=60) == 0
    assert b"podrun: copying: " in shown and b" received, " in shown


def _read(reader: int) -> bytes:
    try:
        return os.read(reader, 4096)
    except OSError:  # EIO: podrun has exited and the terminal is closed
        return b""


@pytest.mark.slow
def test_an_upload_to_ssh_hosts_leaves_the_launcher_once_and_a_download_names_each_host(home, lab, tmp_path):
    source = project(tmp_path)
    (source / "weights.bin").write_bytes(os.urandom(BLOB_BYTES))  # incompressible
    sent_before = bridge_sent_bytes()
    up = podrun("cp", *lab_flags(lab, (0, 1, 2)), "-r", source, ":~/saved")
    sent = bridge_sent_bytes() - sent_before
    assert up.returncode == 0, up.stderr
    for index in range(3):
        assert tree_listing(lab.hosts[index].home / "saved") == tree_listing(source)
    assert BLOB_BYTES < sent < 1.5 * BLOB_BYTES, sent  # one copy leaves this machine, not three
    for index in range(3):
        lab.run(index, f"echo {index} > /root/saved/who")
    down = podrun("cp", *lab_flags(lab, (0, 1, 2)), "--worker", "1-2", "-r", ":saved/who", ":~/saved/shards",
                  tmp_path / "back")
    assert down.returncode == 0, down.stderr
    assert sorted(os.listdir(tmp_path / "back")) == ["w1", "w2"]
    for index in (1, 2):
        assert (tmp_path / "back" / f"w{index}" / "who").read_text() == f"{index}\n"
        assert tree_listing(tmp_path / "back" / f"w{index}" / "shards") == tree_listing(source / "shards")


@pytest.mark.slow
def test_cp_reaches_every_worker_of_a_tpu(home, tpu_api, lab, tmp_path):
    assert podrun("create", "v4-32", "--name", "copies").returncode == 0
    (tmp_path / "config.json").write_text("{}\n")
    assert podrun("cp", "--tpu", "copies", tmp_path / "config.json", ":config.json").returncode == 0
    for index in range(4):
        assert (lab.hosts[index].home / "config.json").read_text() == "{}\n"
    back = podrun("cp", "--tpu", "copies", "--worker", "3", ":config.json", tmp_path / "back.json")
    assert back.returncode == 0, back.stderr
    assert (tmp_path / "back.json").read_text() == "{}\n"
