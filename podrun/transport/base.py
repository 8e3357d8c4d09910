"""Transports: start a shell command on one worker, with its stdin, stdout and stderr as streams.

Local workers and SSH workers differ only here (local.py, ssh.py); the rest uses this interface.
A command runs in the worker's root: the login directory over SSH, a per-worker directory locally.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shlex
import weakref
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from functools import cache, partial
from importlib import resources
from typing import Protocol

from podrun.errors import PodrunError


class ChannelLost(Exception):
    """The connection under a channel broke (the worker's host, or the link to it, went away)."""


class SessionRefused(PodrunError):
    """The host refused one more channel on a connection (sshd's MaxSessions: 10 by default)."""


class ChannelInput(Protocol):
    def write(self, data: bytes, /) -> None: ...

    def write_eof(self) -> None: ...

    def is_closing(self) -> bool: ...

    async def drain(self) -> None: ...


class ChannelOutput(Protocol):
    async def read(self, size: int = -1, /) -> bytes: ...

    async def readline(self) -> bytes: ...


class Channel(Protocol):
    """A command running on a worker (asyncio.subprocess.Process has this shape).
    `stdin.write_eof()` ends its input; the command itself goes on. Reads, writes and wait()
    raise ChannelLost when the connection breaks."""

    @property
    def stdin(self) -> ChannelInput: ...

    @property
    def stdout(self) -> ChannelOutput: ...

    @property
    def stderr(self) -> ChannelOutput: ...

    async def wait(self) -> int: ...


class Transport(ABC):
    python: str  # the interpreter that runs the agent on the worker
    root: str  # the directory commands start in, as shown to the user
    # whether its connection outlives the attempt that opened it, for the next attempt on the same worker
    # (launch/attempt_loop.py); the others are closed at each attempt's end
    reusable = False

    def is_open(self) -> bool:
        """Whether a connection a past attempt opened is there still (reusable transports only)."""
        return False

    async def connect_unless_open(self) -> None:
        if not self.is_open():
            await self.connect()

    async def connect(self) -> None:
        """Open what start() needs (one connection per worker per job)."""

    @abstractmethod
    async def start(self, command: str) -> Channel:
        """Start `command` (a shell string) in the worker's root."""

    async def close(self) -> None:
        """Close the connection; the worker side stops what it ran unless it was detached."""

    async def start_python(self, name: str, *args: str, unlisted: Sequence[str] | None = None) -> Channel:
        """Run the worker-side script podrun/remote/`name`.py with the worker's Python, from the worker's
        cache where it has it (BOOTSTRAP). With `unlisted`, those arguments are its whole input, a line each:
        a command line is there for every user of the worker to see (`ps`), and a job's id or directory is
        not theirs to know."""
        arguments = "".join(" " + shlex.quote(arg) for arg in args)
        with_source = script_command(self.python, name) + arguments
        if self.may_have(cache_name(name)):
            cached = script_command(self.python, name, cached=True) + arguments
            channel: Channel = ScriptChannel(await self.start_script(name, cached),
                                             partial(self.start_script, name, with_source), script_source(name))
        else:
            channel = await self.start_script(name, with_source)
            channel.stdin.write(script_source(name))
        if unlisted is not None:
            channel.stdin.write("".join(line + "\n" for line in unlisted).encode())
            channel.stdin.write_eof()
        return channel

    async def start_script(self, name: str, command: str) -> Channel:
        """Start `command`, which runs the worker-side script `name` (start_python's)."""
        return await self.start(command)

    def may_have(self, entry: str) -> bool:
        """Whether the worker may have the cache entry `entry` (BOOTSTRAP) for some Python; where it cannot, a
        script starts with its source at once, sparing the start that would only say it lacks it."""
        return True

    def path_here(self, relative: str) -> str | None:
        """Where `relative`, under the worker's root, is on the launcher's own machine (a local worker's
        root is a directory here: shipping/relay.py copies the code there); None where it is not."""
        return None

    @abstractmethod
    def endpoint(self) -> dict:
        """What transport.transport_for() needs to reach this worker again (stored with a job)."""

    @abstractmethod
    def interactive(self, command: str | None, terminal: bool) -> tuple[list[str], str | None]:
        """What gives the user a shell on this worker (or runs `command` there) at their own terminal
        (`podrun ssh`; `terminal`: stdin is one): a program's argv, and the directory it starts in
        (None: any)."""

    @abstractmethod
    def starting_environment(self) -> str:
        """Where a command's environment starts, before the plan's exports (for --dry-run)."""


# A worker-side script starts from the worker's cache: ~/.podrun/cache/<name>-<hash>-<hexversion>.v2 holds
# the compiled code of the script and of the modules it imports, named by the hash of their sources and the
# interpreter's version. The launcher sends only this bootstrap (cached_command). Where the worker has the
# entry, the bootstrap says `podrun-script cached` on stderr and runs it: nothing more is sent, and the
# launcher waits for nothing. Where it has not, it says `podrun-script uncached`, reads its input to the end
# and exits, and the launcher starts the script again with its source ahead of the same input
# (script_command: `size` bytes of source on stdin, compiled and stored for the next time; ScriptChannel).
# An entry is used only where the worker's user owns it, nobody else may write it, and its header names it
# and the length and CRC-32 of the code that follows: a truncated, corrupted or renamed entry is compiled
# again from the source sent. The previous format (no .v2, no header) is left alone.
BOOTSTRAP = """import os,sys,marshal
def m(k):
 for q,x in k[:-1]:
  u=type(sys)('podrun_remote_'+q);exec(x,u.__dict__);sys.modules[u.__name__]=u
 return k[-1][1]
def c(n,z):
 import binascii
 p='.podrun/cache/%s-%x.v2'%(n,sys.hexversion);h=('podrun-cache %s '%p[14:]).encode();b=b''
 while len(b)<z:
  r=os.read(0,z-len(b))
  if not r:sys.exit('podrun: short read of a worker-side script')
  b+=r
 k=None
 try:
  f=os.open(p,os.O_RDONLY|os.O_NOFOLLOW)
  with open(f,'rb') as g:s=os.fstat(f);d=g.read()
  e=d.index(b'\\n')+1;w=d[e:]
  if s.st_uid==os.getuid() and not s.st_mode&0o22 and d[:e]==h+b'%d %d\\n'%(len(w),binascii.crc32(w)):
   k=marshal.loads(w)
 except Exception:pass
 if k:
  if not z:os.write(2,b'podrun-script cached\\n')
  return m(k)
 if not z:
  os.write(2,b'podrun-script uncached\\n')
  while os.read(0,65536):pass
  os._exit(0)
 k=[];i=0
 while i<z:
  j=b.index(b'\\n',i);q,l=b[i:j].decode().split();i=j+1+int(l);k.append((q,compile(b[j+1:i],q,'exec')))
 w=marshal.dumps(k)
 try:
  for d in('.podrun','.podrun/cache'):
   if not os.path.isdir(d):os.mkdir(d,0o700)
  t=p+'.%d'%os.getpid()
  with open(os.open(t,os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o600),'wb') as g:
   g.write(h+b'%d %d\\n'%(len(w),binascii.crc32(w))+w)
  os.replace(t,p)
 except OSError:pass
 return m(k)
exec(c('{name}',{size}),{{'__name__':'__main__'}})"""
CACHED, UNCACHED = b"podrun-script cached\n", b"podrun-script uncached\n"  # what BOOTSTRAP says on stderr
CACHE_DIR = ".podrun/cache"  # BOOTSTRAP's, in the worker's root


# The modules of podrun/remote/ a worker-side script imports: a worker, which has no podrun package, gets
# them with the script, each as a module of its own, "podrun_remote_<name>" (`type(sys)` is the module
# type), compiled into the script's cache entry (compiling checkout.py afresh would cost every agent 1.3 ms).
# They are read from the script's own `from podrun.remote import ...` line (what the launcher, tests and
# type checks import), so the list is written once, in the script.
REMOTE_IMPORT = "from podrun.remote import "


@cache
def script_modules(name: str) -> tuple[str, ...]:
    """The modules the script `name` imports, each after the ones it imports itself."""
    found: list[str] = []
    for line in remote_source(name).decode().splitlines():
        if line.strip().startswith(REMOTE_IMPORT):
            for module in line.strip().removeprefix(REMOTE_IMPORT).split(","):
                for needed in (*script_modules(module.strip()), module.strip()):
                    if needed not in found:
                        found.append(needed)
    return tuple(found)


@cache
def remote_source(name: str) -> bytes:
    """The source of podrun/remote/`name`.py."""
    return resources.files("podrun.remote").joinpath(f"{name}.py").read_bytes()


@cache
def script_source(name: str) -> bytes:
    """What script_command's bootstrap reads on stdin: each module the script `name` imports, then the
    script, each as `NAME SIZE`, a newline and its source."""
    return b"".join(b"%s %d\n" % (part.encode(), len(remote_source(part))) + remote_source(part)
                    for part in (*script_modules(name), name))


@cache
def cache_name(name: str) -> str:
    """The name of the worker-side script `name`'s cache entries (BOOTSTRAP), before the Python's version."""
    return f"{name}-{hashlib.sha256(script_source(name)).hexdigest()[:16]}"


@cache
def script_command(python: str, name: str, cached: bool = False) -> str:
    """The command that runs the worker-side script `name`: its source follows on stdin, or with `cached`,
    the worker runs it from its cache or says it lacks it (BOOTSTRAP)."""
    bootstrap = BOOTSTRAP.format(size=0 if cached else len(script_source(name)), name=cache_name(name))
    # -I -S: the scripts need the standard library only; skipping site and PYTHON* variables saves
    # start-up on every worker and keeps the worker's Python settings out of them
    return f"exec {shlex.quote(python)} -I -S -c {shlex.quote(bootstrap)}"


def agent_source() -> bytes:
    return script_source("agent")


def agent_command(python: str) -> str:
    return script_command(python, "agent")


class ScriptChannel:
    """A worker-side script started from the worker's cache (BOOTSTRAP), as a Channel. What is written to
    its stdin is also kept until the bootstrap says whether the worker has the script; where it has not,
    `uncached()` starts the script again with its source, the kept input follows, and the streams and
    exit are that one's. Reads wait for the bootstrap's word, which comes before anything the script
    writes; writes, and so the script's first report, wait for nothing. What a login printed ahead of
    the word stays in stderr."""

    def __init__(self, channel: Channel, uncached: Callable[[], Awaitable[Channel]], source: bytes):
        self.channel = channel
        self.stdin: ChannelInput = self
        self.stdout: ChannelOutput = _SettledOutput(self, "stdout")
        self.stderr: ChannelOutput = _SettledOutput(self, "stderr")
        self.kept: list[bytes | None] | None = []  # the input so far, None for its end; None once settled
        self.login = b""  # stderr before the bootstrap's word
        self.settled = asyncio.ensure_future(self._settle(uncached, source))

    async def _settle(self, uncached: Callable[[], Awaitable[Channel]], source: bytes) -> None:
        try:
            if await self._word() == UNCACHED:
                cached, self.channel = self.channel, await uncached()
                self.login = b""  # that one's login prints again
                self.channel.stdin.write(source)
                for data in self.kept or []:
                    if data is None:
                        self.channel.stdin.write_eof()
                    else:
                        self.channel.stdin.write(data)
                if None not in (self.kept or []):
                    with contextlib.suppress(ChannelLost, OSError, RuntimeError):
                        cached.stdin.write_eof()  # that bootstrap reads its input to the end
        finally:
            self.kept = None
        self.stdin, self.stdout = self.channel.stdin, self.channel.stdout  # no more indirection
        if not self.login:
            self.stderr = self.channel.stderr

    async def _word(self) -> bytes:
        """CACHED or UNCACHED, or b"" where the channel ended (or broke) without either: no bootstrap ran
        (no such python, a login that refused), and what it printed is the caller's to read."""
        try:
            while line := await self.channel.stderr.readline():
                for word in (UNCACHED, CACHED):
                    if line.endswith(word):  # a login's last line may lack its newline
                        self.login += line[:-len(word)]
                        return word
                self.login += line
        except ChannelLost:
            pass  # the reads raise it again
        return b""

    def write(self, data: bytes, /) -> None:
        if self.kept is not None:
            self.kept.append(data)
        self.channel.stdin.write(data)

    def write_eof(self) -> None:
        if self.kept is not None:
            self.kept.append(None)
        self.channel.stdin.write_eof()

    def is_closing(self) -> bool:
        return self.channel.stdin.is_closing()

    async def drain(self) -> None:
        await self.channel.stdin.drain()

    async def wait(self) -> int:
        await self.settled
        return await self.channel.wait()


class _SettledOutput:
    """ScriptChannel's stdout or stderr until its bootstrap's word: the stream of the channel that runs
    the script, stderr after what the login printed."""

    def __init__(self, owner: ScriptChannel, name: str):
        self.owner = owner
        self.name = name

    async def read(self, size: int = -1, /) -> bytes:
        await self.owner.settled
        stream, login = getattr(self.owner.channel, self.name), self._login()
        if not login:
            return await stream.read(size)
        taken = login if size < 0 else login[:size]
        self.owner.login = login[len(taken):]
        return taken + (await stream.read() if size < 0 else b"")

    async def readline(self) -> bytes:
        await self.owner.settled
        if not (login := self._login()):
            return await getattr(self.owner.channel, self.name).readline()
        line, newline, self.owner.login = login.partition(b"\n")
        return line + newline

    def _login(self) -> bytes:
        return self.owner.login if self.name == "stderr" else b""


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = \
    weakref.WeakKeyDictionary()


def loop_gate(name: str, size: int) -> asyncio.Semaphore:
    """The running event loop's one semaphore called `name` (made with `size` places on first use): what
    all of a launch's workers share, such as the SSH handshakes in flight or the local processes being spawned."""
    gates = _gates.setdefault(asyncio.get_running_loop(), {})
    if name not in gates:
        gates[name] = asyncio.Semaphore(size)
    return gates[name]
