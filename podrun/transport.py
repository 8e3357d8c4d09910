"""Transports: start a shell command on one worker, with its stdin, stdout and stderr as streams.

Local workers and SSH workers differ only here; launch, sync and logs use the Transport interface.
A command runs in the worker's root: the login directory over SSH, a per-worker directory locally.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shlex
import sys
from abc import ABC, abstractmethod
from functools import cache
from importlib import resources
from typing import Protocol, cast

from podrun import paths


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

    async def start_python(self, script: str, *args: str) -> Channel:
        """Run a small standard-library script with the worker's Python."""
        return await self.start(" ".join([shlex.quote(self.python), "-I", "-S", "-c", shlex.quote(script),
                                          *map(shlex.quote, args)]))

    @abstractmethod
    def endpoint(self) -> dict:
        """What targets.transport_for() needs to reach this worker again (stored with a job)."""

    @abstractmethod
    def starting_environment(self) -> str:
        """Where a command's environment starts, before the plan's exports (for --dry-run)."""


# which of the variables a local worker inherits --dry-run shows: those that pick its python and torchrun
INHERITED_SHOWN = ("PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")


class LocalTransport(Transport):
    """A local CPU worker: a process tree on this machine, rooted in its own directory."""

    def __init__(self, root: str):
        self.root = str(root)
        self.python = sys.executable

    async def connect(self) -> None:
        paths.make_private_dir(self.root)

    def endpoint(self) -> dict:
        return {"kind": "local", "root": self.root}

    def starting_environment(self) -> str:
        shown = [f"{key}={os.environ[key]}" for key in INHERITED_SHOWN if key in os.environ]
        others = len(os.environ) - len(shown)
        return f"podrun's own environment, inherited: {' '.join(shown)} and {others} more variables"

    async def start(self, command: str) -> Channel:
        process = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", command, cwd=self.root,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)  # like a remote host: the terminal's Ctrl-C reaches podrun only
        return cast(Channel, process)  # all three pipes were asked for: none of its streams is None


# A worker-side script reads its own source from stdin, then its input. Compiling the agent took
# 4 ms of its start on every worker for every step, so the compiled code is kept in the worker's
# ~/.podrun/cache under the source's hash and the interpreter's version: the source is still sent
# every time, and a cache entry is only ever used for the exact source it was compiled from.
BOOTSTRAP = """import os,sys,marshal
b=b''
while len(b)<{size}:
 c=os.read(0,{size}-len(b))
 if not c:sys.exit('podrun: short read of a worker-side script')
 b+=c
p='.podrun/cache/{name}-%x'%sys.hexversion
try:
 with open(p,'rb') as f:code=marshal.load(f)
except Exception:
 code=compile(b,'podrun-worker-script','exec')
 try:
  for d in('.podrun','.podrun/cache'):
   if not os.path.isdir(d):os.mkdir(d,0o700)
  with open(p+'.%d'%os.getpid(),'wb') as f:marshal.dump(code,f)
  os.replace(p+'.%d'%os.getpid(),p)
 except OSError:pass
exec(code,{{'__name__':'__main__'}})"""


@cache
def script_source(name: str) -> bytes:
    """A worker-side script of this package (agent.py, relay_node.py), as sent to workers."""
    return resources.files("podrun").joinpath(name).read_bytes()


def agent_source() -> bytes:
    return script_source("agent.py")


@cache
def script_command(python: str, name: str) -> str:
    """The command that runs the worker-side script `name` (its source follows on stdin)."""
    source = script_source(name)
    cache_name = f"{name.removesuffix('.py')}-{hashlib.sha256(source).hexdigest()[:16]}"
    bootstrap = BOOTSTRAP.format(size=len(source), name=cache_name)
    # -I -S: the scripts need the standard library only; skipping site and PYTHON* variables saves
    # start-up on every worker and keeps the worker's Python settings out of them
    return f"exec {shlex.quote(python)} -I -S -c {shlex.quote(bootstrap)}"


def agent_command(python: str) -> str:
    return script_command(python, "agent.py")
