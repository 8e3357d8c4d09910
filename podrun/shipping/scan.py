"""What ships from a workdir, and the content hash that names its code directory on the workers.

The files are what git would list (ignore.py), less what .podrunignore excludes; each file's sha256
is remembered by its stat signature (digests.py). The scan looks at sizes first: past a threshold it
stops before reading any file, unless asked, naming what weighs most.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from podrun.errors import PodrunError
from podrun.output import counted, size_text
from podrun.shipping import ignore
from podrun.shipping.digests import FileDigests

HASH_LENGTH = 16
# past either, a workdir is shipped only when asked (exec --allow-large-workdir): a spec saved
# beside virtualenvs and downloads would otherwise be read, hashed and sent whole, for minutes
LARGE_WORKDIR_BYTES = 1 << 30
LARGE_WORKDIR_FILES = 50_000
HEAVIEST_SHOWN = 3


class WorkdirTooLarge(PodrunError):
    """The workdir holds more than podrun ships without being asked; says what weighs most."""


@dataclass(frozen=True)
class Tree:
    root: Path
    files: list[str]  # relative POSIX paths, sorted
    digest: str


def scan(workdir: str | Path, remember: bool = True, allow_large: bool = False) -> Tree:
    """The files that ship and their content hash; `remember` keeps their digests for the next
    scan (digests.py), which --dry-run does not: it writes nothing. A large workdir raises
    WorkdirTooLarge before any file is read, unless `allow_large`."""
    root = Path(workdir)
    files = ignore.shipped_files(root)
    infos = [os.lstat(root / relative) for relative in files]
    if not allow_large:
        _refuse_if_large(files, infos)
    return Tree(root, files, _digest(root, files, infos, remember))


def _refuse_if_large(files: list[str], infos: list[os.stat_result]) -> None:
    total = sum(info.st_size for info in infos)
    if total <= LARGE_WORKDIR_BYTES and len(files) <= LARGE_WORKDIR_FILES:
        return
    weights: dict[str, list[int]] = {}  # top-level entry: [bytes, files]
    for relative, info in zip(files, infos):
        top, slash, _ = relative.partition("/")
        weight = weights.setdefault(top + slash, [0, 0])
        weight[0] += info.st_size
        weight[1] += 1
    heaviest = sorted(weights.items(), key=lambda item: item[1], reverse=True)[:HEAVIEST_SHOWN]
    shown = ", ".join(f"{name} {size_text(size)} in {counted(count, 'file')}" for name, (size, count) in heaviest)
    raise WorkdirTooLarge(
        f"{size_text(total)} in {counted(len(files), 'file')} would ship (podrun asks first past "
        f"{size_text(LARGE_WORKDIR_BYTES)} or {LARGE_WORKDIR_FILES:,} files); the heaviest: {shown}; "
        f"exclude what the job does not need in .podrunignore, point workdir: at the code, "
        f"or pass --allow-large-workdir")


def _digest(root: Path, files: list[str], infos: list[os.stat_result], remember: bool) -> str:
    file_digests = FileDigests(str(root))
    digest = hashlib.sha256()
    for relative, info in zip(files, infos):
        path = os.path.join(root, relative)
        digest.update(relative.encode() + b"\0")
        if stat.S_ISLNK(info.st_mode):
            digest.update(b"link\0" + os.readlink(path).encode())
        else:
            digest.update(b"exec\0" if info.st_mode & 0o111 else b"file\0")
            digest.update(file_digests.of(relative, path, info))
    if remember:
        file_digests.save()
    return digest.hexdigest()[:HASH_LENGTH]
