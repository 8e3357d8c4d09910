"""The workdir's digest names the code directory on every worker: it must change with any edit, and
an unchanged workdir must not be read again to find that out (podrun/shipping/digests.py)."""

from __future__ import annotations

import json
import os

import pytest

from podrun.shipping import digests
from podrun.shipping.scan import scan


@pytest.fixture
def workdir(tmp_path, home):
    root = tmp_path / "code"
    root.mkdir()
    for index in range(20):
        (root / f"module{index}.py").write_text(f"VALUE = {index}\n" * 100)
    return root


@pytest.fixture
def hashed(monkeypatch):
    """The files digests.py reads to hash them, in order."""
    read: list[str] = []
    real_sha256 = digests._sha256
    monkeypatch.setattr(digests, "_sha256", lambda path: read.append(os.path.basename(path)) or real_sha256(path))
    return read


def remember_everything(monkeypatch):
    """As if every file had last changed long before the scan (see digests.RACY_S)."""
    monkeypatch.setattr(digests, "RACY_S", -60.0)


def test_an_unchanged_workdir_is_not_read_again(workdir, hashed, monkeypatch):
    remember_everything(monkeypatch)
    first = scan(workdir).digest
    assert len(hashed) == 20
    hashed.clear()
    assert scan(workdir).digest == first
    assert hashed == []


def test_a_same_size_edit_with_its_mtime_set_back_changes_the_digest(workdir, hashed, monkeypatch):
    remember_everything(monkeypatch)
    first = scan(workdir).digest
    target = workdir / "module3.py"
    before = target.stat()
    target.write_text(target.read_text().replace("3", "4"))  # same size
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # as `touch -r` or a careless tool would
    hashed.clear()
    second = scan(workdir).digest
    assert hashed == ["module3.py"]  # its ctime moved: nothing can set that back
    assert second != first
    (workdir / "module3.py").write_text(target.read_text().replace("4", "3"))
    assert scan(workdir).digest == first


def test_files_changed_just_before_the_scan_are_hashed_again_next_time(workdir, hashed):
    scan(workdir)  # every file was written within RACY_S: none is remembered
    hashed.clear()
    scan(workdir)
    assert len(hashed) == 20


def test_added_removed_and_mode_changed_files_change_the_digest(workdir, monkeypatch):
    remember_everything(monkeypatch)
    digests_seen = {scan(workdir).digest}
    (workdir / "new.py").write_text("NEW = 1\n")
    digests_seen.add(scan(workdir).digest)
    (workdir / "module0.py").unlink()
    digests_seen.add(scan(workdir).digest)
    (workdir / "module1.py").chmod(0o755)
    digests_seen.add(scan(workdir).digest)
    assert len(digests_seen) == 4


def test_a_broken_cache_file_means_hashing_everything(workdir, hashed, monkeypatch, home):
    remember_everything(monkeypatch)
    first = scan(workdir).digest
    [cache_file] = (home / "cache" / "digests").iterdir()
    assert oct(cache_file.stat().st_mode & 0o777) == "0o600"
    for broken in ("{not json", json.dumps([1, 2]), json.dumps({"module1.py": 7, "module2.py": ["x"]})):
        cache_file.write_text(broken)
        hashed.clear()
        assert scan(workdir).digest == first
        assert len(hashed) == 20


def test_two_workdirs_do_not_share_digests(tmp_path, home, monkeypatch):
    remember_everything(monkeypatch)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(f"print('{name}')\n")
    assert scan(tmp_path / "a").digest != scan(tmp_path / "b").digest


def test_a_file_removed_while_the_workdir_is_scanned_is_not_shipped_nor_a_crash(workdir, monkeypatch):
    from podrun.errors import PodrunError
    from podrun.shipping import ignore

    listed = ignore.shipped_files

    def listed_then_removed(root):
        files = listed(root)
        (workdir / "module3.py").unlink()  # gone between the listing and its lstat, as a temp dir's files go
        return files

    monkeypatch.setattr(ignore, "shipped_files", listed_then_removed)
    shipped = scan(workdir).files
    assert "module3.py" not in shipped and "module4.py" in shipped
    monkeypatch.setattr(ignore, "shipped_files", listed)
    monkeypatch.setattr(digests, "_sha256", lambda path: (_ for _ in ()).throw(FileNotFoundError(path)))
    (workdir / "module5.py").write_text("changed\n")  # its digest is read again, and it is gone by then
    with pytest.raises(PodrunError, match=r"code/module\d+\.py: removed while podrun read the workdir"):
        scan(workdir)
