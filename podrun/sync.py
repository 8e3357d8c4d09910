"""Ship the workdir to every worker, into a directory named by its content hash.

Files follow .gitignore and .podrunignore (gitignore syntax, in any directory); .git never ships. A
worker that already has the hash gets nothing (its agent says so, before the first step starts). The
others get one tar archive, cut into frames that are zlib-compressed where that pays (a sample of
each shrinks), which the launcher sends once: the workers relay it to each other (relay.py). Each
unpacks it into a temporary directory, checks its sha256 and renames it into place, so a
half-shipped tree is never used.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import struct
import tarfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from podrun import paths, relay
from podrun.digests import FileDigests
from podrun.targets import Worker

IGNORE_FILES = (".gitignore", ".podrunignore")
HASH_LENGTH = 16
FRAME_BYTES = 1 << 20
FRAME_HEADER = struct.Struct(">cI")  # kind, payload length: relay_node.py reads it
# zlib level 6 (gzip's default) for frames whose sample shrinks below 90%: measured on 20 MB of
# Python source, level 1 sends 1.24x the bytes of level 6 for a third of the CPU, and the frames
# compress on every core at once; incompressible data (weights, archives) is sent as it is
COMPRESS_LEVEL = 6
SAMPLE_BYTES = 65536
WORTH_COMPRESSING = 0.9


@dataclass(frozen=True)
class Tree:
    root: Path
    files: list[str]  # relative POSIX paths, sorted
    digest: str


def scan(workdir: str | Path, remember: bool = True) -> Tree:
    """The files that ship and their content hash; `remember` keeps their digests for the next
    scan (digests.py), which --dry-run does not: it writes nothing."""
    root = Path(workdir)
    files = _collect(root)
    return Tree(root, files, _digest(root, files, remember))


async def ship(tree: Tree, name: str, missing: list[Worker]) -> None:
    """Send the tree to the workers that lack it (their agents' probes said so: launch.py)."""
    if missing:
        archive = _tar(tree)
        shipment = relay.Shipment(paths.remote_code_dir(name, tree.digest), hashlib.sha256(archive).hexdigest(),
                                  _frames(archive))
        await relay.deliver(shipment, missing)


def _collect(root: Path) -> list[str]:
    import pathspec  # only `exec` needs it

    rules: list[tuple[str, pathspec.PathSpec]] = []  # (directory relative to root, its rules)
    files = []
    for directory, dirnames, filenames in os.walk(root):
        relative_dir = os.path.relpath(directory, root)
        relative_dir = "" if relative_dir == "." else relative_dir + "/"
        for ignore_file in IGNORE_FILES:
            path = os.path.join(directory, ignore_file)
            if os.path.isfile(path):
                with open(path) as handle:
                    rules.append((relative_dir, pathspec.GitIgnoreSpec.from_lines(handle)))

        def ignored(relative: str) -> bool:
            return any(relative.startswith(base) and spec.match_file(relative[len(base):])
                       for base, spec in rules)

        dirnames[:] = sorted(d for d in dirnames if d != ".git" and not ignored(f"{relative_dir}{d}/"))
        files += [relative_dir + f for f in sorted(filenames) if not ignored(relative_dir + f)]
    return files


def _digest(root: Path, files: list[str], remember: bool) -> str:
    file_digests = FileDigests(str(root))
    digest = hashlib.sha256()
    for relative in files:
        path = os.path.join(root, relative)
        info = os.lstat(path)
        digest.update(relative.encode() + b"\0")
        if stat.S_ISLNK(info.st_mode):
            digest.update(b"link\0" + os.readlink(path).encode())
        else:
            digest.update(b"exec\0" if info.st_mode & 0o111 else b"file\0")
            digest.update(file_digests.of(relative, path, info))
    if remember:
        file_digests.save()
    return digest.hexdigest()[:HASH_LENGTH]


def _tar(tree: Tree) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for relative in tree.files:
            archive.add(tree.root / relative, arcname=relative, recursive=False)
    return buffer.getvalue()


def _frames(archive: bytes) -> list[bytes]:
    chunks = [archive[start:start + FRAME_BYTES] for start in range(0, len(archive), FRAME_BYTES)]
    with ThreadPoolExecutor(os.cpu_count()) as pool:  # zlib releases the GIL
        frames = list(pool.map(_frame, chunks))
    return frames + [FRAME_HEADER.pack(b"e", 0)]


def _frame(chunk: bytes) -> bytes:
    sample = chunk[:SAMPLE_BYTES]
    if len(zlib.compress(sample, 1)) < WORTH_COMPRESSING * len(sample):
        packed = zlib.compress(chunk, COMPRESS_LEVEL)
        if len(packed) < len(chunk):
            return FRAME_HEADER.pack(b"z", len(packed)) + packed
    return FRAME_HEADER.pack(b"r", len(chunk)) + chunk
