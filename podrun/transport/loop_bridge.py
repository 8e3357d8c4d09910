"""A channel of another thread's event loop, used from the running one: its reads, writes and exit are
done on the loop that owns it, so that one connection (LoginShell's SSH connection to a Slurm login
node: transport/slurm.py) serves both the target's synchronous steps, in a thread of their own, and the
launch's workers, in the launch's loop.

A write is handed to the owning loop and returns at once: a connection that broke by then surfaces at
the channel's next read or wait (as ChannelLost), not at the write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from podrun.transport.base import Channel, ChannelInput, ChannelLost, ChannelOutput

T = TypeVar("T")


async def on_loop(loop: asyncio.AbstractEventLoop, work: Awaitable[T]) -> T:
    """`work` (a coroutine) run on `loop`, awaited from the running loop; cancelling the wait cancels it there."""
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))  # type: ignore[arg-type]


def _quietly(write: Callable[..., None], *args: bytes) -> None:
    try:
        write(*args)
    except (ChannelLost, OSError, RuntimeError):
        pass  # the channel is gone: its reads and wait say so


class _Input:
    def __init__(self, stream: ChannelInput, loop: asyncio.AbstractEventLoop):
        self.stream, self.loop = stream, loop

    def write(self, data: bytes) -> None:
        self.loop.call_soon_threadsafe(_quietly, self.stream.write, data)

    def write_eof(self) -> None:
        self.loop.call_soon_threadsafe(_quietly, self.stream.write_eof)

    def is_closing(self) -> bool:
        return self.stream.is_closing()

    async def drain(self) -> None:
        await on_loop(self.loop, self.stream.drain())


class _Output:
    def __init__(self, stream: ChannelOutput, loop: asyncio.AbstractEventLoop):
        self.stream, self.loop = stream, loop

    async def read(self, size: int = -1) -> bytes:
        return await on_loop(self.loop, self.stream.read(size))

    async def readline(self) -> bytes:
        return await on_loop(self.loop, self.stream.readline())


class BridgedChannel:
    """`channel`, of `loop` (another thread's), for the running loop's use."""

    def __init__(self, channel: Channel, loop: asyncio.AbstractEventLoop):
        self.channel, self.loop = channel, loop
        self.stdin = _Input(channel.stdin, loop)
        self.stdout, self.stderr = _Output(channel.stdout, loop), _Output(channel.stderr, loop)

    async def wait(self) -> int:
        return await on_loop(self.loop, self.channel.wait())
