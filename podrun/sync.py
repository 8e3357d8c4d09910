"""Ship the workdir to every worker, into a directory named by its content hash.

Files follow .gitignore and .podrunignore (gitignore syntax, in any directory); .git never ships.
A worker that already has the hash gets nothing: one round trip. The others get one uncompressed
tar stream (compression costs more CPU than it saves on the links podrun runs over), unpacked into a
temporary directory and renamed into place, so a half-shipped tree is never used.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import shlex
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

from podrun import paths
from podrun.errors import PodrunError
from podrun.targets import Worker, naming_lost_connections

IGNORE_FILES = (".gitignore", ".podrunignore")
HASH_LENGTH = 16


@dataclass(frozen=True)
class Tree:
    root: Path
    files: list[str]  # relative POSIX paths, sorted
    digest: str


def scan(workdir: str | Path) -> Tree:
    root = Path(workdir)
    files = _collect(root)
    return Tree(root, files, _digest(root, files))


async def ship(tree: Tree, name: str, workers: list[Worker]) -> list[int]:
    """Make the tree present on every worker; returns the indexes of the workers it was sent to."""
    code_dir = paths.remote_code_dir(name, tree.digest)
    present = await asyncio.gather(*(_has(worker, code_dir) for worker in workers))
    missing = [worker for worker, has in zip(workers, present) if not has]
    if missing:
        archive = _tar(tree)
        await asyncio.gather(*(_send(worker, code_dir, archive) for worker in missing))
    return [worker.index for worker in missing]


async def _has(worker: Worker, code_dir: str) -> bool:
    async with naming_lost_connections(worker, "while shipping code"):
        channel = await worker.transport.start(f"test -d {shlex.quote(code_dir)}")
        channel.stdin.write_eof()
        return await channel.wait() == 0


async def _send(worker: Worker, code_dir: str, archive: bytes) -> None:
    quoted = shlex.quote(code_dir)
    # the temporary name is unique per shipment; if another job renamed the same tree into place
    # first, ours is simply dropped (same hash, same content)
    script = (f"set -e; tmp={quoted}.tmp.$$; mkdir -p \"$tmp\"; tar -x -f - -C \"$tmp\"; "
              f"mv -T \"$tmp\" {quoted} 2>/dev/null || rm -rf \"$tmp\"")
    async with naming_lost_connections(worker, "while shipping code"):
        channel = await worker.transport.start(script)
        channel.stdin.write(archive)
        await channel.stdin.drain()
        channel.stdin.write_eof()
        errors, code = await asyncio.gather(channel.stderr.read(), channel.wait())
    if code != 0:
        detail = errors.decode(errors="replace").strip().splitlines()
        raise PodrunError(f"worker {worker.index} ({worker.address}): shipping the workdir failed: "
                          f"{detail[-1] if detail else f'exit code {code}'}")


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


def _digest(root: Path, files: list[str]) -> str:
    digest = hashlib.sha256()
    for relative in files:
        path = root / relative
        info = path.lstat()
        digest.update(relative.encode() + b"\0")
        if stat.S_ISLNK(info.st_mode):
            digest.update(b"link\0" + os.readlink(path).encode())
        else:
            digest.update(b"exec\0" if info.st_mode & 0o111 else b"file\0")
            with open(path, "rb") as handle:
                digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()[:HASH_LENGTH]


def _tar(tree: Tree) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for relative in tree.files:
            archive.add(tree.root / relative, arcname=relative, recursive=False)
    return buffer.getvalue()
