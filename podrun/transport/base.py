"""Transports: start a shell command on one worker, with its stdin, stdout and stderr as streams.

Local workers and SSH workers differ only here (local.py, ssh.py); the rest uses this interface.
A command runs in the worker's root: the login directory over SSH, a per-worker directory locally.
"""

from __future__ import annotations

import asyncio
import hashlib
import shlex
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Protocol


class ChannelLost(Exception):
    """The connection under a channel broke (the worker's host, or the link to it, went away)."""


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

    async def connect(self) -> None:
        """Open what start() needs (one connection per worker per job)."""

    @abstractmethod
    async def start(self, command: str) -> Channel:
        """Start `command` (a shell string) in the worker's root."""

    async def close(self) -> None:
        """Close the connection; the worker side stops what it ran unless it was detached."""

    async def start_python(self, name: str, *args: str, unlisted: Sequence[str] | None = None) -> Channel:
        """Run the small worker-side script podrun/remote/`name`.py with the worker's Python. With
        `unlisted`, those arguments are its whole input, a line each: a command line is there for every
        user of the worker to see (`ps`), and a job's id or directory is not theirs to know."""
        script = (UNCACHED_COMPILE if script_modules(name) else "") + script_source(name).decode()
        channel = await self.start(" ".join([shlex.quote(self.python), "-I", "-S", "-c", shlex.quote(script),
                                             *map(shlex.quote, args)]))
        if unlisted is not None:
            channel.stdin.write("".join(line + "\n" for line in unlisted).encode())
            channel.stdin.write_eof()
        return channel

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


# A worker-side script reads its own source from stdin, then its input. Compiling the agent took
# 4 ms of its start on every worker for every step, so compiled code is kept in the worker's
# ~/.podrun/cache under the source's hash and the interpreter's version (`c`): the source is still
# sent every time, and a cache entry is only ever used for the exact source it was compiled from.
# The script gets `c` as _podrun_compiled, for the modules sent ahead of it (MODULE_LOADER).
BOOTSTRAP = """import os,sys,marshal
def c(n,s):
 p='.podrun/cache/%s-%x'%(n,sys.hexversion)
 try:
  with open(p,'rb') as f:return marshal.load(f)
 except Exception:pass
 k=compile(s,n,'exec')
 try:
  for d in('.podrun','.podrun/cache'):
   if not os.path.isdir(d):os.mkdir(d,0o700)
  with open(p+'.%d'%os.getpid(),'wb') as f:marshal.dump(k,f)
  os.replace(p+'.%d'%os.getpid(),p)
 except OSError:pass
 return k
b=b''
while len(b)<{size}:
 r=os.read(0,{size}-len(b))
 if not r:sys.exit('podrun: short read of a worker-side script')
 b+=r
exec(c('{name}',b),{{'__name__':'__main__','_podrun_compiled':c}})"""


# The modules of podrun/remote/ a worker-side script imports: a worker, which has no podrun package, gets
# them ahead of the script, each as a module of its own, "podrun_remote_<name>" (`type(sys)` is the module
# type), compiled once per worker and interpreter by BOOTSTRAP's cache (compiling checkout.py afresh would
# cost every agent 1.3 ms). They are read from the script's own `from podrun.remote import ...` line (what
# the launcher, tests and type checks import), so the list is written once, in the script.
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


# what BOOTSTRAP's cache is to a script started with its source on the command line (start_python)
UNCACHED_COMPILE = "_podrun_compiled = lambda name, source: compile(source, name, 'exec')\n"
MODULE_LOADER = """import sys
def _podrun_module(name, cache_name, source):
    module = type(sys)('podrun_remote_' + name)
    exec(_podrun_compiled(cache_name, source), module.__dict__)
    sys.modules[module.__name__] = module
"""


@cache
def remote_source(name: str) -> bytes:
    """The source of podrun/remote/`name`.py."""
    return resources.files("podrun.remote").joinpath(f"{name}.py").read_bytes()


@cache
def script_source(name: str) -> bytes:
    """A worker-side script run through BOOTSTRAP (agent, relay_node), as sent over stdin."""
    modules = script_modules(name)
    prelude = MODULE_LOADER + "".join(map(_module_load, modules)) if modules else ""
    return prelude.encode() + remote_source(name)


def _module_load(module: str) -> str:
    """The line of a script's prelude that loads podrun/remote/`module`.py (see MODULE_LOADER)."""
    source = remote_source(module)
    cache_name = f"{module}-{hashlib.sha256(source).hexdigest()[:16]}"
    return f"_podrun_module({module!r}, {cache_name!r}, {source.decode()!r})\n"


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = \
    weakref.WeakKeyDictionary()


def loop_gate(name: str, size: int) -> asyncio.Semaphore:
    """The running event loop's one semaphore called `name` (made with `size` places on first use): what
    all of a launch's workers share, such as the SSH handshakes in flight or the local processes being spawned."""
    gates = _gates.setdefault(asyncio.get_running_loop(), {})
    if name not in gates:
        gates[name] = asyncio.Semaphore(size)
    return gates[name]


def agent_source() -> bytes:
    return script_source("agent")


@cache
def script_command(python: str, name: str) -> str:
    """The command that runs the worker-side script `name` (its source follows on stdin)."""
    source = script_source(name)
    cache_name = f"{name}-{hashlib.sha256(source).hexdigest()[:16]}"
    bootstrap = BOOTSTRAP.format(size=len(source), name=cache_name)
    # -I -S: the scripts need the standard library only; skipping site and PYTHON* variables saves
    # start-up on every worker and keeps the worker's Python settings out of them
    return f"exec {shlex.quote(python)} -I -S -c {shlex.quote(bootstrap)}"


def agent_command(python: str) -> str:
    return script_command(python, "agent")
