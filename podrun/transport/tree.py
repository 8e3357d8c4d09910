"""A control tree: SSH workers reached through a relay worker rather than over a connection of the launcher's.

The launcher connects to each relay worker (its own SshTransport, with the launcher's ssh-agent forwarded)
and starts remote/tree_relay.py there beside its other commands. The relay opens the connections to the
workers behind it (OpenSSH, one per worker per job) and carries their commands' streams back, framed
(remote/tree_frames.py), over that one channel. So the launcher does one handshake per relay, and per
worker behind one only reads and writes frames: the handshakes' CPU runs on the relays, in parallel.

To the rest of podrun a worker behind a relay is a Transport like any other (TreeTransport): its channels
have the same streams and exits; a relay that is lost is a ChannelLost for each of its workers' commands,
naming the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import marshal

from podrun.errors import PodrunError
from podrun.remote import tree_frames
from podrun.transport import key_agent, known_hosts
from podrun.transport.base import Channel, ChannelLost, Transport
from podrun.transport.framed_channel import FramedChannel, FrameOutbox
from podrun.transport.ssh import SshTransport


class SharedAgent:
    """The agent every relay of a launch forwards (key_agent.py): made for the first, closed after the last."""

    def __init__(self, identity_file: str | None, relays: int):
        self.identity_file, self.users = identity_file, relays
        self.made: asyncio.Future[tuple[str, key_agent.KeyAgent | None]] | None = None

    async def socket(self) -> str:
        if self.made is None:
            self.made = asyncio.ensure_future(key_agent.agent_for(self.identity_file))
        return (await asyncio.shield(self.made))[0]

    async def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.made is not None and self.made.done() and not self.made.exception():
            agent = self.made.result()[1]
            if agent:
                await agent.close()


class Relay(FrameOutbox):
    """The launcher's end of one relay worker's tree_relay.py: its channel, and the workers behind it."""

    def __init__(self, head: SshTransport, name: str, agent: SharedAgent):
        super().__init__()
        self.head, self.name = head, name  # name: "worker 3 (10.0.0.3)", for the errors of those behind it
        self.agent = agent
        self.opening: asyncio.Future[None] | None = None
        self.ids = itertools.count(1)
        self.children: dict[int, TreeTransport] = {}
        self.channels: dict[int, tuple[int, FramedChannel]] = {}  # command -> (its worker, its channel)
        self.reading: asyncio.Task | None = None

    def open(self) -> asyncio.Future[None]:
        """Connected to the relay worker and its relay started (once, however many ask)."""
        if self.opening is None:
            self.opening = asyncio.ensure_future(self._open())
        return self.opening

    async def _open(self) -> None:
        self.head.forward_agent = await self.agent.socket()
        await self.head.connect()
        self.channel = await self.head.start_python("tree_relay")
        self.reading = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.channel is not None
        frames = tree_frames.Frames()
        try:
            while chunk := await self.channel.stdout.read(1 << 18):
                frames.feed(chunk)
                try:
                    whole = frames.take()
                except ValueError as broken:
                    raise ChannelLost(f"from the relay, {broken}") from None
                for kind, ident, payload in whole:
                    await self._take(kind, ident, payload)
            why = (await self.channel.stderr.read()).decode(errors="replace").strip().splitlines()
            self._lose(why[-1] if why else "the relay process ended")
        except ChannelLost as lost:
            self._lose(str(lost))

    async def _take(self, kind: int, ident: int, payload: bytes) -> None:
        if kind in (tree_frames.STDOUT, tree_frames.STDERR, tree_frames.EXIT) and ident in self.channels:
            channel = (self.channels.pop(ident) if kind == tree_frames.EXIT else self.channels[ident])[1]
            await channel.take(kind, payload)
        elif kind in (tree_frames.OPENED, tree_frames.FAILED) and ident in self.children:
            self.children[ident].answered(kind == tree_frames.OPENED, payload.decode(errors="replace"))
        elif kind == tree_frames.LOST:
            self._lose_child(ident, payload.decode(errors="replace") or "the connection closed")

    def _lose_child(self, child: int, why: str) -> None:
        for ident, (owner, channel) in list(self.channels.items()):
            if owner == child:
                del self.channels[ident]
                channel.lose(f"{why}, through relay {self.name}")
        if child in self.children:
            self.children[child].answered(False, why)

    def _lose(self, why: str) -> None:
        if self.lost is not None:
            return
        self.lost = f"its relay, {self.name}, was lost: {why}"
        for _, channel in list(self.channels.values()):
            channel.lose(self.lost)
        self.channels.clear()
        for child in self.children.values():
            child.answered(False, self.lost)

    async def close(self) -> None:
        self._flush()
        if self.channel is not None and self.lost is None:
            with contextlib.suppress(ChannelLost, OSError, RuntimeError):
                self.channel.stdin.write_eof()
        if self.reading is not None:
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(self.reading, 5)
        self.lost = self.lost or "closed"
        await self.agent.release()


class TreeTransport(Transport):
    """A worker behind a relay: its own SshTransport's settings, reached from the relay at `address`."""

    def __init__(self, inner: SshTransport, relay: Relay, address: str):
        self.inner, self.relay, self.address = inner, relay, address
        self.python, self.root = inner.python, inner.root
        self.ident = 0
        self.opened: asyncio.Future[str] | None = None

    async def connect(self) -> None:
        await self.relay.open()
        if self.relay.lost:
            raise PodrunError(f"{self.inner.named}: cannot connect: {self.relay.lost}")
        self.ident = next(self.relay.ids)
        self.opened = asyncio.get_running_loop().create_future()
        self.relay.children[self.ident] = self
        known, _, recorded = self.inner._keys_on_record() if self.inner.check_host_keys else ("", [], True)
        check = "no" if not self.inner.check_host_keys else "yes" if known else "accept-new"
        # its own user, else the one the relay signed in as (the spec's ssh.user, or ~/.ssh/config's)
        assert self.relay.head.connection is not None, "the relay connected first"
        user = self.inner.user or self.relay.head.connection.get_extra_info("username")
        argv = ["-o", f"HostKeyAlias={self.inner.known_as}", "-p", str(self.inner.port or 22), "-l", user]
        request = {"argv": [*argv, "--", self.address], "known": known, "check": check}
        self.relay.send(tree_frames.frame(tree_frames.OPEN, self.ident, marshal.dumps(request, 4)))
        added = await self.opened
        if check == "accept-new" and not recorded:
            keys = [line.split(None, 1)[1] for line in added.splitlines() if len(line.split(None, 1)) == 2]
            if keys:
                known_hosts.remember(self.inner.known_as, keys)

    def answered(self, ok: bool, text: str) -> None:
        if self.opened is None or self.opened.done():
            return
        if ok:
            self.opened.set_result(text)
        else:
            self.opened.set_exception(PodrunError(f"{self.inner.named}: cannot connect through relay "
                                                  f"{self.relay.name}: {text}"))

    async def start(self, command: str) -> Channel:
        if self.relay.lost:
            raise ChannelLost(self.relay.lost)
        ident = next(self.relay.ids)
        channel = FramedChannel(self.relay, ident)
        self.relay.channels[ident] = (self.ident, channel)
        self.relay.send(tree_frames.frame(tree_frames.START, ident,
                                          marshal.dumps({"child": self.ident, "command": command}, 4)))
        return channel

    async def close(self) -> None:
        if self.ident and self.relay.lost is None:
            self.relay.send(tree_frames.frame(tree_frames.CLOSE, self.ident))

    def endpoint(self) -> dict:
        return self.inner.endpoint()

    def interactive(self, command: str | None, terminal: bool) -> tuple[list[str], str | None]:
        return self.inner.interactive(command, terminal)

    def starting_environment(self) -> str:
        return self.inner.starting_environment()


class RelayHead(Transport):
    """A relay worker as the launcher's own worker: its SshTransport, connected once with the relay."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self.python, self.root = relay.head.python, relay.head.root

    async def connect(self) -> None:
        await self.relay.open()

    async def start(self, command: str) -> Channel:
        return await self.relay.head.start(command)

    async def close(self) -> None:
        await self.relay.close()
        await self.relay.head.close()

    def endpoint(self) -> dict:
        return self.relay.head.endpoint()

    def interactive(self, command: str | None, terminal: bool) -> tuple[list[str], str | None]:
        return self.relay.head.interactive(command, terminal)

    def starting_environment(self) -> str:
        return self.relay.head.starting_environment()
