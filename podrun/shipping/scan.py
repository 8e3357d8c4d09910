"""What ships from a workdir, and the content hash that names its code directory on the workers.

The files are what git would list (ignore.py), less what .podrunignore excludes; each file's sha256
is remembered by its stat signature (digests.py). The scan looks at sizes first: past a threshold, it
goes on only if its caller says so (exec asks on a terminal), naming what weighs most, before reading
any file.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from podrun.errors import PodrunError
from podrun.output import counted, size_text
from podrun.shipping import ignore
from podrun.shipping.digests import FileDigests

HASH_LENGTH = 16
# past either, a workdir is shipped only when the user says so (on a terminal, or with exec
# --allow-large-workdir): a spec saved beside virtualenvs and downloads would otherwise be read,
# hashed and sent whole, for minutes
LARGE_WORKDIR_BYTES = 1 << 30
LARGE_WORKDIR_FILES = 50_000
LIMITS = f"{LARGE_WORKDIR_BYTES >> 30} GiB or {LARGE_WORKDIR_FILES:,} files"
HEAVIEST_SHOWN = 3


class WorkdirTooLarge(PodrunError):
    """The workdir holds more than podrun ships without being asked; `found` says how much, and what
    holds the most of what was too much (bytes, or files)."""

    def __init__(self, found: str):
        super().__init__(f"{found}; exclude what the job does not need in .podrunignore, point workdir: at the "
                         f"code, or pass --allow-large-workdir")
        self.found = found


def refuse(too_large: WorkdirTooLarge) -> bool:
    return False


@dataclass(frozen=True)
class Tree:
    root: Path
    files: list[str]  # relative POSIX paths, sorted
    digest: str


def scan(workdir: str | Path, remember: bool = True,
         ship_large: Callable[[WorkdirTooLarge], bool] = refuse, left_home: str | None = None) -> Tree:
    """The files that ship and their content hash; `remember` keeps their digests for the next
    scan (digests.py), which --dry-run does not: it writes nothing. A large workdir raises
    WorkdirTooLarge before any file is read, unless `ship_large`, told how large, says to go on.
    `left_home`: a relative path that never ships (the spec being run: its env may hold secrets)."""
    root = Path(workdir)
    listed = [relative for relative in ignore.shipped_files(root) if relative != left_home]
    found = [(relative, info) for relative in listed if (info := _lstat(root / relative))]  # gone since listed: not shipped
    files, infos = [relative for relative, _ in found], [info for _, info in found]
    too_large = _too_large(files, infos)
    if too_large and not ship_large(too_large):
        raise too_large
    return Tree(root, files, _digest(root, files, infos, remember))


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _too_large(files: list[str], infos: list[os.stat_result]) -> WorkdirTooLarge | None:
    """None, or what is too large and where: the top-level entries that weigh most, or, when only the
    file count is over its limit, those that hold the most files."""
    total = sum(info.st_size for info in infos)
    if total <= LARGE_WORKDIR_BYTES and len(files) <= LARGE_WORKDIR_FILES:
        return None
    weights: dict[str, tuple[int, int]] = {}  # top-level entry: (bytes, files)
    for relative, info in zip(files, infos):
        top, slash, _ = relative.partition("/")
        size, count = weights.get(top + slash, (0, 0))
        weights[top + slash] = (size + info.st_size, count + 1)
    by_files = total <= LARGE_WORKDIR_BYTES
    most = sorted(weights.items(), key=lambda item: item[1][::-1] if by_files else item[1], reverse=True)
    shown = ", ".join(f"{name} {size_text(size)} in {counted(count, 'file')}"
                      for name, (size, count) in most[:HEAVIEST_SHOWN])
    return WorkdirTooLarge(f"{size_text(total)} in {counted(len(files), 'file')} would ship (more than {LIMITS}); "
                           f"{'the most files' if by_files else 'the heaviest'}: {shown}")


def _digest(root: Path, files: list[str], infos: list[os.stat_result], remember: bool) -> str:
    file_digests = FileDigests(str(root))
    digest = hashlib.sha256()
    for relative, info in zip(files, infos):
        path = os.path.join(root, relative)
        digest.update(os.fsencode(relative) + b"\0")
        try:
            if stat.S_ISLNK(info.st_mode):
                digest.update(b"link\0" + os.fsencode(os.readlink(path)))
            else:
                digest.update(b"exec\0" if info.st_mode & 0o111 else b"file\0")
                digest.update(file_digests.of(relative, path, info))
        except FileNotFoundError:
            raise PodrunError(f"{path}: removed while podrun read the workdir {root}; nothing was shipped, "
                              f"run again once it stays put") from None
    if remember:
        file_digests.save()
    return digest.hexdigest()[:HASH_LENGTH]
