"""A command's channel carried as frames (remote/tree_frames.py) of one stream that carries many: its stdin
as INPUT and EOF frames, its stdout and stderr as what STDOUT and STDERR frames brought, its exit as EXIT's
code. The control tree's relays (tree.py) and Slurm's one step (slurm_step.py) hand their commands out as these.
"""

from __future__ import annotations

import asyncio
import contextlib

from podrun.remote import tree_frames
from podrun.transport.base import Channel, ChannelLost

HELD_MAX = 1 << 20  # bytes a command's unread output may hold before the relay's channel is read no further


class FramedOutput:
    """A command's stdout or stderr: what the far end sent, until its end."""

    def __init__(self) -> None:
        self.held = bytearray()
        self.ended = False
        self.lost: str | None = None
        self.changed = asyncio.Event()
        self.taken = asyncio.Event()

    def feed(self, data: bytes) -> None:
        self.held += data
        self.changed.set()

    def end(self, lost: str | None = None) -> None:
        self.ended, self.lost = True, self.lost or lost
        self.changed.set()

    async def _wait(self) -> None:
        while not self.held and not self.ended:
            self.changed.clear()
            await self.changed.wait()
        if not self.held and self.lost:
            raise ChannelLost(self.lost)

    async def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes, once there are any; all of them to the end with size -1 (asyncio's meaning)."""
        if size < 0:
            whole = bytearray()
            while not self.ended or self.held:
                await self._wait()
                whole += await self.read(len(self.held))
            return bytes(whole)
        await self._wait()
        size = min(size, len(self.held))
        data = bytes(self.held[:size])
        del self.held[:size]
        self.taken.set()
        return data

    async def readline(self) -> bytes:
        while b"\n" not in self.held and not self.ended:
            self.changed.clear()
            await self.changed.wait()
        if not self.held and self.lost:
            raise ChannelLost(self.lost)
        end = self.held.find(b"\n") + 1 or len(self.held)
        data = bytes(self.held[:end])
        del self.held[:end]
        self.taken.set()
        return data

    async def room(self) -> None:
        """Until the reader has taken enough that more may come."""
        while len(self.held) > HELD_MAX and not self.ended:
            self.taken.clear()
            await self.taken.wait()


class FrameOutbox:
    """The frames for the far end of one stream that carries many channels (a relay: tree.py; Slurm's fanout:
    slurm_step.py): what one turn of the loop queues goes out as one write (a `go`, a heartbeat or a stop to
    every worker on the stream is one packet, not one per worker)."""

    def __init__(self) -> None:
        self.channel: Channel | None = None  # the stream, once it is open
        self.lost: str | None = None  # why the stream is gone, once it is
        self.outgoing: list[bytes] = []  # frames queued this turn of the loop (send)

    def send(self, data: bytes) -> None:
        if self.lost is None and self.channel is not None:
            if not self.outgoing:
                asyncio.get_running_loop().call_soon(self._flush)
            self.outgoing.append(data)

    def _flush(self) -> None:
        data, self.outgoing = b"".join(self.outgoing), []
        if data and self.lost is None and self.channel is not None:
            try:
                self.channel.stdin.write(data)
            except (ChannelLost, OSError, RuntimeError) as error:
                self._lose(str(error) or "its channel closed")

    async def drain(self) -> None:
        self._flush()
        if self.lost is None and self.channel is not None:
            with contextlib.suppress(ChannelLost, OSError, RuntimeError):
                await self.channel.stdin.drain()

    def _lose(self, why: str) -> None:
        self.lost = why


class FramedInput:
    """A command's stdin: INPUT frames, then EOF."""

    def __init__(self, relay: FrameOutbox, ident: int):
        self.relay, self.ident = relay, ident
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self.relay.send(tree_frames.frames(tree_frames.INPUT, self.ident, data))

    def write_eof(self) -> None:
        if not self.closed:
            self.closed = True
            self.relay.send(tree_frames.frame(tree_frames.EOF, self.ident))

    def is_closing(self) -> bool:
        return self.closed or self.relay.lost is not None

    async def drain(self) -> None:
        await self.relay.drain()


class FramedChannel:
    """A command whose streams are frames of one stream shared with others (transport.base.Channel)."""

    def __init__(self, relay: FrameOutbox, ident: int):
        self.stdin = FramedInput(relay, ident)
        self.stdout, self.stderr = FramedOutput(), FramedOutput()
        self.exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def take(self, kind: int, payload: bytes) -> None:
        """One of its frames: output (read no further while the launcher has not taken enough of what came
        before), or its exit."""
        if kind in (tree_frames.STDOUT, tree_frames.STDERR):
            stream = self.stdout if kind == tree_frames.STDOUT else self.stderr
            stream.feed(payload)
            await stream.room()
        elif kind == tree_frames.EXIT:
            for stream in (self.stdout, self.stderr):
                stream.end()
            if not self.exited.done():
                self.exited.set_result(int(payload or b"255"))

    def lose(self, why: str) -> None:
        for stream in (self.stdout, self.stderr):
            stream.end(why)
        if not self.exited.done():
            self.exited.set_exception(ChannelLost(why))
            self.exited.exception()  # retrieved here: a channel nobody waits for is no error

    async def wait(self) -> int:
        return await asyncio.shield(self.exited)
