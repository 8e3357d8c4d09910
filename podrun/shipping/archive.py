"""The workdir as a stream of frames, to the workers that lack it (relay.py delivers it).

One tar archive, packed while it is sent (memory stays flat whatever the workdir's size), cut into
frames (framing.py) that are zlib-compressed where that pays (a sample of each shrinks), sent once by
the launcher: the workers relay it to each other. Each unpacks it into a temporary directory, checks
its sha256 (in the end frame) and renames it into place, so a half-shipped tree is never used.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import struct
import tarfile
import threading
import zlib
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor

from podrun.errors import PodrunError
from podrun.remote import framing
from podrun.shipping import relay
from podrun.shipping.scan import Tree
from podrun.targets.base import Worker

FRAME_BYTES = 1 << 20
FRAME_HEADER = struct.Struct(framing.FRAME_HEADER)
# zlib level 6 (gzip's default) for frames whose sample shrinks below 90%: measured on 20 MB of
# Python source, level 1 sends 1.24x the bytes of level 6 for a third of the CPU, and the frames
# compress on every core at once; incompressible data (weights, archives) is sent as it is
COMPRESS_LEVEL = 6
SAMPLE_BYTES = 65536
WORTH_COMPRESSING = 0.9
# frames packed but not yet sent: all the launcher holds of the archive, whatever the workdir's size
FRAMES_AHEAD = 2 * (os.cpu_count() or 1)
STOP_CHECK_S = 0.1  # how often a packer waiting for the sender looks whether it should stop


async def ship(tree: Tree, code_dir: str, missing: list[Worker]) -> int:
    """Send the tree into `code_dir` (paths.remote_code_dir) on the workers that lack it (their agents'
    probes said so: launch/launcher.py); returns the bytes sent."""
    if not missing:
        return 0
    return await relay.deliver(shipment(tree, code_dir), missing)


def shipment(tree: Tree, directory: str, what: str = "code") -> relay.Shipment:
    """The tree, to be unpacked into `directory` (relative to each worker's root) by relay.deliver."""
    return relay.Shipment(directory, lambda: _frames(tree), what)


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
        raise PodrunError(f"cannot pack what ships: {error}") from None
    return chunks.finish()


def _frame(chunk: bytes) -> bytes:
    sample = chunk[:SAMPLE_BYTES]
    if len(zlib.compress(sample, 1)) < WORTH_COMPRESSING * len(sample):
        packed = zlib.compress(chunk, COMPRESS_LEVEL)
        if len(packed) < len(chunk):
            return FRAME_HEADER.pack(b"z", len(packed)) + packed
    return FRAME_HEADER.pack(b"r", len(chunk)) + chunk
