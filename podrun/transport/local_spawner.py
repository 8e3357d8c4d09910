"""Local workers' Python scripts (the agent, the relay's receiver: transport/base.py's script_command), started
by a fork server on this machine (remote/forkserver.py) rather than each as a new interpreter.

One server per event loop, started on first use: `python -I -S -c` its source, so that what it forks is
what `python -I -S -c PROGRAM` would run. A start is a request over a socket pair (the program, its
directory, the child's three pipes); the child's exit code comes back the same way. Linux only (a
SOCK_SEQPACKET socket pair); where the server cannot start, local workers' processes are spawned as
before (transport/local.py).
"""

from __future__ import annotations

import array
import asyncio
import functools
import json
import os
import shlex
import socket
import subprocess
import weakref
from collections import deque
from typing import IO, cast

from podrun import file_limit
from podrun.remote import forkserver
from podrun.transport.base import Channel, ChannelLost, remote_source

LOAD_FROM_STDIN = f"import sys; exec(sys.stdin.buffer.read())  # {forkserver.COMMAND_MARK}"
FORKS_IN_FLIGHT = 32  # requests sent and not yet answered (transport/local.py's gate)
_servers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Spawner | None] = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=64)
def script_in(command: str, python: str) -> tuple[str, tuple[str, ...]] | None:
    """(PROGRAM, ARGS) of `exec PYTHON -I -S -c PROGRAM ARG...` as transport/base.py's script_command writes
    it (every word quoted: the agent, the relay's receiver), else None: any other command is the shell's.
    start_python's helpers (stop, logs, stacks: one per worker per command, not per step) keep their own
    interpreter, and their source on their command line, where the tests of what `ps` shows look."""
    prefix = f"exec {shlex.quote(python)} -I -S -c "
    if command.startswith(prefix):
        words = shlex.split(command[len(prefix):])
        if words and " ".join(map(shlex.quote, words)) == command[len(prefix):]:
            return words[0], tuple(words[1:])
    return None


def server_for(python: str) -> Spawner | None:
    """The running loop's fork server (started on first use); None where it cannot run here."""
    loop = asyncio.get_running_loop()
    if loop not in _servers:
        _servers[loop] = Spawner.start(python) if hasattr(socket, "SOCK_SEQPACKET") else None
    return _servers[loop]


class Spawner:
    """The launcher's end of remote/forkserver.py."""

    def __init__(self, process: subprocess.Popen, control: socket.socket):
        self.process = process  # reaped by subprocess once dropped
        self.control = control
        self.answers: deque[asyncio.Future] = deque()  # one per request sent, in order
        self.exits: dict[int, asyncio.Future] = {}
        self.writable: asyncio.Future | None = None  # while starts wait for room in the socket
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(control.fileno(), self._read)

    @classmethod
    def start(cls, python: str) -> Spawner | None:
        try:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError:
            return None
        with theirs:
            # its source on stdin: each child's command line (ps) is this short one
            command = f"exec {shlex.quote(python)} -I -S -c {shlex.quote(LOAD_FROM_STDIN)} {theirs.fileno()}"
            try:  # the soft limit on open files podrun was given, for the scripts and what they start
                process = subprocess.Popen(["/bin/sh", "-c", file_limit.local_command(command)],
                                           pass_fds=[theirs.fileno()], stdin=subprocess.PIPE,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True)
                with cast(IO[bytes], process.stdin) as source:  # asked for: not None
                    source.write(remote_source("forkserver"))
            except OSError:
                mine.close()
                return None
        mine.setblocking(False)
        return cls(process, mine)

    async def spawn(self, cwd: str, program: str, args: tuple[str, ...]) -> Channel:
        """Run the program in cwd, in a session of its own, as `python -I -S -c PROGRAM ARGS` would."""
        pipes = [os.pipe() for _ in range(3)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        mine = [pipes[0][1], pipes[1][0], pipes[2][0]]
        request = json.dumps({"cwd": cwd, "program": program, "args": list(args)}).encode()
        try:
            # requests are pipelined (FORKS_IN_FLIGHT): each answer waited for before the next request
            # made every start a round trip through a loaded machine's scheduler (15 s for 1,024 workers)
            while True:
                try:
                    self.control.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs))])
                    break
                except BlockingIOError:  # the server's queue is full: once it took some
                    await self._writable()
                except OSError as error:
                    raise ChannelLost(f"the fork server of local workers is gone ({error.strerror})") from None
            answer = self.loop.create_future()
            self.answers.append(answer)  # in the order sent: nothing is awaited between the send and this
            started = await answer
        except BaseException:
            for descriptor in mine:
                os.close(descriptor)
            raise
        finally:
            for descriptor in theirs:
                os.close(descriptor)
        if "error" in started:
            for descriptor in mine:
                os.close(descriptor)
            raise OSError(started["error"])
        return await Spawned.attached(started["pid"], mine, self._exit_of(started["pid"]))

    async def _writable(self) -> None:
        """Until the socket takes more: one watch of it for every start that waits (a second add_writer
        would replace the first's callback, and leave that start waiting for good)."""
        if self.writable is None:
            self.writable = self.loop.create_future()
            self.loop.add_writer(self.control.fileno(), self._now_writable)
        await asyncio.shield(self.writable)

    def _now_writable(self) -> None:
        self.loop.remove_writer(self.control.fileno())
        if self.writable is not None:
            self.writable.set_result(None)
            self.writable = None

    def _read(self) -> None:
        while True:
            try:
                data = self.control.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            message = json.loads(data)
            if "exited" in message:
                self._exit_of(message["exited"]).set_result(message["code"])
            elif self.answers:
                answer = self.answers.popleft()
                if not answer.cancelled():  # its start was given up: the child finds its pipes closed, and ends
                    answer.set_result(message)

    def _exit_of(self, pid: int) -> asyncio.Future:
        """The future of the child's exit code, for whichever of its start and its exit comes second to
        take: a quick child's exit can be read in the same turn as its start's answer."""
        if pid in self.exits:
            return self.exits.pop(pid)
        self.exits[pid] = self.loop.create_future()
        return self.exits[pid]

    def close(self) -> None:
        """End the server (the end of its socket), as the launcher's own end does; its children carry on."""
        self._lost()
        self.control.close()

    def _lost(self) -> None:
        """The server ended: what waits on it is told so."""
        self.loop.remove_reader(self.control.fileno())
        lost = ChannelLost("the fork server of local workers ended")
        for waiting in [*self.answers, *self.exits.values()]:
            if not waiting.done():
                waiting.set_exception(lost)
                waiting.exception()  # taken as seen: a wait() that never comes is no error to log
        self.answers.clear()


class Spawned:
    """A script the fork server started, with the shape of asyncio.subprocess.Process that Channel names."""

    def __init__(self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader, exit_code: asyncio.Future):
        self.pid = pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.exit_code = exit_code

    @classmethod
    async def attached(cls, pid: int, descriptors: list[int], exit_code: asyncio.Future) -> Spawned:
        loop = asyncio.get_running_loop()
        readers = [asyncio.StreamReader(), asyncio.StreamReader()]
        for reader, descriptor in zip(readers, descriptors[1:]):
            await loop.connect_read_pipe(functools.partial(asyncio.StreamReaderProtocol, reader),
                                         os.fdopen(descriptor, "rb", 0))
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                            os.fdopen(descriptors[0], "wb", 0))
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        return cls(pid, writer, readers[0], readers[1], exit_code)

    async def wait(self) -> int:
        return await asyncio.shield(self.exit_code)
