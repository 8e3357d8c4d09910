"""A transport whose channels speak the agent protocol (remote/agent.py's docstring) in-process, for unit
tests of the launcher's logic: no processes, no network. What users rely on is checked in the lab with
the real agent; this fake only lets the launcher's state machine be driven and watched quickly.

Each channel runs a FakeAgent: its worker has the agent cached; it reads the framed step, reports its probe
and waits for "go" in a job's first step, then starts, writes its scripted lines, and exits with its
scripted code, or runs until it hears "stop" (then it exits as if killed by SIGTERM).
"""

from __future__ import annotations

import asyncio
import json
import marshal
from collections.abc import Callable
from dataclasses import dataclass, field

from podrun.transport.base import CACHED, ChannelLost, Transport

STOPPED_CODE, STOPPED_SIGNAL = 143, "SIGTERM"  # what the real agent reports after a stop: 128 + SIGTERM


@dataclass
class Script:
    """What one worker's agent does, per step ("setup", "run")."""

    codes: dict[str, int] = field(default_factory=dict)  # the step's exit code; 0 if not named
    lines: dict[str, list[str]] = field(default_factory=dict)  # printed once the step started
    held: set[str] = field(default_factory=set)  # steps that run until stopped
    stopped_code: int = STOPPED_CODE  # how a held step exits when stopped
    probe_held: bool = False  # the probe report never comes
    code_present: bool = True  # the probe says the code is there already
    lost_in: str | None = None  # "probe" or a step: the connection breaks there
    connect_error: Exception | None = None
    connect_held: bool = False  # connect() never returns


class Changes:
    """Lets a test wait for a condition on the fakes without sleeping: every change pokes it."""

    def __init__(self):
        self.poked = asyncio.Event()

    def poke(self) -> None:
        self.poked.set()

    async def until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            self.poked.clear()
            await self.poked.wait()


class FakeOutput:
    """A channel's stdout or stderr: whole chunks in, b"" at the end (again on every later read)."""

    def __init__(self):
        self.chunks: asyncio.Queue[bytes | ChannelLost] = asyncio.Queue()
        self.ended: bytes | ChannelLost | None = None

    async def read(self, size: int = -1) -> bytes:
        return await self.readline()

    async def readline(self) -> bytes:
        item = self.ended if self.ended is not None else await self.chunks.get()
        if isinstance(item, ChannelLost):
            self.ended = item
            raise item
        if not item:
            self.ended = item
        return item


class FakeAgent:
    """One channel: the launcher writes its stdin, reads its stdout/stderr and waits for it."""

    def __init__(self, index: int, script: Script, changes: Changes):
        self.index = index
        self.script = script
        self.changes = changes
        self.stdout, self.stderr = FakeOutput(), FakeOutput()
        self.stdin = self  # write/write_eof/drain/is_closing below
        self.received = b""
        self.config: dict | None = None
        self.heard: list[str] = []  # the control lines it received, "" for a heartbeat
        self.events: list[dict] = []  # what it reported
        self.commands: asyncio.Queue[str | None] = asyncio.Queue()  # None: end of input
        self.config_arrived = asyncio.Event()
        self.lost: ChannelLost | None = None
        self.code: int | None = None
        self.done = asyncio.Event()
        self.task = asyncio.ensure_future(self._live())
        self.stderr.chunks.put_nowait(CACHED)  # as the agent's bootstrap says where the worker has it cached

    # stdin
    def write(self, data: bytes) -> None:
        if self.lost:
            raise self.lost
        self.received += data
        if self.config is None:
            size, newline, rest = self.received.partition(b"\n")
            if not newline or len(rest) < int(size):
                return
            self.config = marshal.loads(rest[:int(size)])
            self.received = rest[int(size):]
            self.config_arrived.set()
        *lines, self.received = self.received.split(b"\n")
        for line in lines:
            self.heard.append(line.decode())
            self.commands.put_nowait(line.decode())
        self.changes.poke()

    def write_eof(self) -> None:
        self.commands.put_nowait(None)

    def is_closing(self) -> bool:
        return self.done.is_set()

    async def drain(self) -> None:
        if self.lost:
            raise self.lost

    async def wait(self) -> int:
        await self.done.wait()
        if self.lost:
            raise self.lost
        assert self.code is not None
        return self.code

    @property
    def step(self) -> str | None:
        return self.config["step"] if self.config else None

    def started(self) -> bool:
        return any(event["event"] in ("started", "detached") for event in self.events)

    async def _live(self) -> None:
        await self.config_arrived.wait()
        assert self.config is not None
        step, script = self.config["step"], self.script
        watch = self.config.get("watch")
        if watch and watch["worker"] == watch["hub_worker"]:
            self._emit(event="hub", port=40000 + self.index)
        if "probe" in self.config:
            self._emit(event="hello")  # as agent.py: first, before its checks
            if script.lost_in == "probe":
                return self._lose()
            if not script.probe_held:
                self._emit(event="probe", code=int(script.code_present), holders="")
        if "probe" in self.config or watch:
            if await self._next_of("go", "stop") != "go":
                return self._exit(0)  # told not to start, or the launcher is gone: no report
        if self.config["detach"]:
            self._emit(event="detached", pid=1000 + self.index)
            return self._exit(0)
        self._emit(event="started", pid=1000 + self.index)
        for line in script.lines.get(step, []):
            self.stdout.chunks.put_nowait(line.encode() + b"\n")
        if script.lost_in == step:
            return self._lose()
        if step in script.held:
            await self._next_of("stop")
            code, signal = script.stopped_code, STOPPED_SIGNAL if script.stopped_code == STOPPED_CODE else None
        else:
            code, signal = script.codes.get(step, 0), None
        self._emit(event="exited", code=code, signal=signal)
        self._exit(code)

    async def _next_of(self, *words: str) -> str | None:
        """The first of `words` (or "stop") that arrives; None at the end of input."""
        while (command := await self.commands.get()) is not None:
            if command.split(" ")[0] in (*words, "stop"):
                return command.split(" ")[0]
        return None

    def _emit(self, **event) -> None:
        self.events.append(event)
        self.stderr.chunks.put_nowait(json.dumps(event).encode() + b"\n")
        self.changes.poke()

    def _exit(self, code: int) -> None:
        self.code = code
        for stream in (self.stdout, self.stderr):
            stream.chunks.put_nowait(b"")
        self.done.set()
        self.changes.poke()

    def _lose(self) -> None:
        self.lost = ChannelLost("connection reset by peer")
        for stream in (self.stdout, self.stderr):
            stream.chunks.put_nowait(self.lost)
        self.done.set()
        self.changes.poke()


class FakeTransport(Transport):
    """One worker; every start() is an agent (launch starts only agents on it while nothing ships)."""

    python = "python3"

    def __init__(self, index: int, script: Script, changes: Changes):
        self.index = index
        self.root = f"/home/fake{index}"
        self.script = script
        self.changes = changes
        self.connected = False
        self.connecting = False
        self.closed = False
        self.agents: list[FakeAgent] = []

    async def connect(self) -> None:
        self.connecting = True
        self.changes.poke()
        if self.script.connect_error:
            raise self.script.connect_error
        if self.script.connect_held:
            await asyncio.Event().wait()
        self.connected = True

    async def start(self, command: str) -> FakeAgent:  # type: ignore[override]
        assert self.connected, "started before connect()"
        assert "agent" in command, f"only agents run on a fake worker, not {command!r}"
        agent = FakeAgent(self.index, self.script, self.changes)
        self.agents.append(agent)
        self.changes.poke()
        return agent

    async def close(self) -> None:
        self.closed = True
        for agent in self.agents:
            agent.write_eof()  # as a closed connection: the agents stop what they ran

    def endpoint(self) -> dict:
        return {"kind": "fake", "index": self.index}

    def interactive(self, command: str | None, terminal: bool):
        raise AssertionError("a fake worker has no shell")

    def starting_environment(self) -> str:
        return "a fake worker's"

    def agent(self, step: str) -> FakeAgent | None:
        return next((agent for agent in self.agents if agent.step == step), None)
