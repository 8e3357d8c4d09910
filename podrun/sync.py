"""Ship the workdir to every worker, into a directory named by its content hash.

What ships is what git would list (ignore.py: .gitignore rules), less what .podrunignore excludes. A
worker that already has the hash gets nothing (its agent says so, before the first step starts). The
others get one tar archive, packed while it is sent (memory stays flat whatever the workdir's size),
cut into frames that are zlib-compressed where that pays (a sample of each shrinks), which the
launcher sends once: the workers relay it to each other (relay.py). Each unpacks it into a
temporary directory, checks its sha256 and renames it into place, so a half-shipped tree is never
used.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import struct
import tarfile
import threading
import zlib
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from podrun import ignore, paths, relay
from podrun.digests import FileDigests
from podrun.errors import PodrunError
from podrun.output import counted, size_text
from podrun.targets import Worker

HASH_LENGTH = 16
FRAME_BYTES = 1 << 20
FRAME_HEADER = struct.Struct(">cI")  # kind, payload length: relay_node.py reads it
# zlib level 6 (gzip's default) for frames whose sample shrinks below 90%: measured on 20 MB of
# Python source, level 1 sends 1.24x the bytes of level 6 for a third of the CPU, and the frames
# compress on every core at once; incompressible data (weights, archives) is sent as it is
COMPRESS_LEVEL = 6
SAMPLE_BYTES = 65536
WORTH_COMPRESSING = 0.9
# frames packed but not yet sent: all the launcher holds of the archive, whatever the workdir's size
FRAMES_AHEAD = 2 * (os.cpu_count() or 1)
STOP_CHECK_S = 0.1  # how often a packer waiting for the sender looks whether it should stop


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


async def ship(tree: Tree, name: str, missing: list[Worker]) -> int:
    """Send the tree to the workers that lack it (their agents' probes said so: launch.py); returns
    the bytes sent."""
    if not missing:
        return 0
    return await relay.deliver(relay.Shipment(paths.remote_code_dir(name, tree.digest), lambda: _frames(tree)),
                               missing)


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


async def _frames(tree: Tree) -> AsyncGenerator[bytes, None]:
    """The tree as relay_node.py's frames: packed in a thread, compressed on every core (zlib releases
    the GIL) at most FRAMES_AHEAD frames ahead of the sender; the end frame carries the archive's
    sha256. Closing the stream stops the packing within STOP_CHECK_S or one read of a file."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Queue = asyncio.Queue()  # frames being compressed, in order; then the sha256 or an error
    slots = threading.Semaphore(FRAMES_AHEAD)
    stop = threading.Event()
    pool = ThreadPoolExecutor(os.cpu_count())

    def compress(chunk: bytes) -> None:  # in the packing thread
        while not slots.acquire(timeout=STOP_CHECK_S):
            if stop.is_set():
                raise _Stopped
        loop.call_soon_threadsafe(ready.put_nowait, pool.submit(_frame, chunk))

    def pack() -> None:
        try:
            outcome: str | Exception = _tar(tree, _Chunks(compress, stop))
        except _Stopped:
            return
        except Exception as error:  # raised where the frames are sent
            outcome = error
        loop.call_soon_threadsafe(ready.put_nowait, outcome)

    packing = loop.run_in_executor(None, pack)
    try:
        while not isinstance(item := await ready.get(), str):
            if isinstance(item, Exception):
                raise item
            frame = await asyncio.wrap_future(item)
            slots.release()
            yield frame
        yield FRAME_HEADER.pack(b"e", len(item)) + item.encode()
    finally:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        await packing


class _Stopped(Exception):
    """The sender closed the stream (an interrupt, or no worker left to take it): packing ends."""


class _Chunks:
    """Where tarfile writes: the archive, hashed and cut into FRAME_BYTES chunks handed on as each
    fills. A write after `stop` ends the packing: tarfile writes between files and after every read
    of a big one."""

    def __init__(self, hand_on: Callable[[bytes], None], stop: threading.Event):
        self.hand_on = hand_on
        self.stop = stop
        self.pending = bytearray()
        self.written = 0
        self.sha256 = hashlib.sha256()

    def write(self, data: bytes) -> int:
        if self.stop.is_set():
            raise _Stopped
        self.sha256.update(data)
        self.pending += data
        self.written += len(data)
        while len(self.pending) >= FRAME_BYTES:
            self.hand_on(bytes(self.pending[:FRAME_BYTES]))
            del self.pending[:FRAME_BYTES]
        return len(data)

    def tell(self) -> int:  # tarfile asks where it starts
        return self.written

    def finish(self) -> str:
        """Hands on the last chunk; returns the archive's sha256."""
        if self.pending:
            self.hand_on(bytes(self.pending))
        return self.sha256.hexdigest()


def _tar(tree: Tree, chunks: _Chunks) -> str:
    """Pack the tree into `chunks` (PAX format, files read a frame's worth at a time); returns the
    archive's sha256."""
    try:
        with tarfile.open(fileobj=chunks, mode="w", format=tarfile.PAX_FORMAT,  # type: ignore[call-overload]
                          copybufsize=FRAME_BYTES) as archive:
            for relative in tree.files:
                archive.add(tree.root / relative, arcname=relative, recursive=False)
    except OSError as error:
        raise PodrunError(f"cannot pack the workdir: {error}") from None
    return chunks.finish()


def _frame(chunk: bytes) -> bytes:
    sample = chunk[:SAMPLE_BYTES]
    if len(zlib.compress(sample, 1)) < WORTH_COMPRESSING * len(sample):
        packed = zlib.compress(chunk, COMPRESS_LEVEL)
        if len(packed) < len(chunk):
            return FRAME_HEADER.pack(b"z", len(packed)) + packed
    return FRAME_HEADER.pack(b"r", len(chunk)) + chunk
