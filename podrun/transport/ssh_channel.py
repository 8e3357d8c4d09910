"""A command's channel on an SSH connection (ssh.py): its streams and its exit, every connection failure
surfacing as ChannelLost, in a few words (`reason`)."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from podrun.transport.base import ChannelLost

if TYPE_CHECKING:
    import asyncssh
else:
    from podrun.transport.ssh_library import asyncssh


class _Reader:
    """An SSH stream whose connection failures surface as ChannelLost."""

    def __init__(self, stream: asyncssh.SSHReader):
        self.stream = stream

    async def read(self, size: int = -1) -> bytes:
        return await _or_lost(self.stream.read(size))

    async def readline(self) -> bytes:
        return await _or_lost(self.stream.readline())


class _Writer:
    """An SSH channel's stdin whose connection failures surface as ChannelLost, as its reads' do."""

    def __init__(self, stream: asyncssh.SSHWriter):
        self.stream = stream

    def write(self, data: bytes) -> None:
        _or_lost_now(self.stream.write, data)

    def write_eof(self) -> None:
        _or_lost_now(self.stream.write_eof)

    def is_closing(self) -> bool:
        return self.stream.is_closing()

    async def drain(self) -> None:
        await _or_lost(self.stream.drain())


class SshChannel:
    def __init__(self, process: asyncssh.SSHClientProcess):
        self.process = process
        self.stdin = _Writer(process.stdin)
        self.stdout, self.stderr = _Reader(process.stdout), _Reader(process.stderr)

    async def wait(self) -> int:
        completed = await _or_lost(self.process.wait())
        if completed.returncode is None:  # the channel closed without an exit status
            raise ChannelLost("the connection closed before the command reported its exit")
        return completed.returncode


async def _or_lost(awaitable):
    try:
        return await awaitable
    except (OSError, asyncssh.Error) as error:
        raise ChannelLost(reason(error)) from None


def _or_lost_now(call, *args):
    try:
        return call(*args)
    except (OSError, asyncssh.Error) as error:
        raise ChannelLost(reason(error)) from None


def reason(error: BaseException) -> str:
    """A failed connection or channel in a few words, for the one line that names the host."""
    if isinstance(error, socket.gaierror):  # its errno is getaddrinfo's, which os.strerror does not know
        return f"the name does not resolve ({error.strerror})"
    if isinstance(error, OSError) and error.errno:  # asyncio words it "Connect call failed (...)"
        return os.strerror(error.errno)
    text = getattr(error, "reason", None) or str(error) or type(error).__name__
    return text.rstrip(".")

