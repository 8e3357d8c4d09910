"""Deliver one shipment of code to many workers while the launcher sends it once: a relay tree.

The launcher feeds the first worker that lacks the code; each worker's receiver (relay_node.py)
forwards the frames, as they arrive, to up to PODRUN_RELAY_FANOUT others over the workers' internal
addresses. A worker the tree did not reach (a firewall between workers, a receiver that died) is
named, then sent the code directly, from a stream packed afresh (a stream is packed while it is
sent, so it feeds one round); only a direct send that fails stops the job.

Local workers share this machine's disk: one receiver takes the shipment for all of them and copies
the unpacked tree into each other worker's directory (relay_node.copy_to), instead of a receiver (a
Python, and a tar) per worker. A worker it failed to copy to is named and sent the code directly.

Every wait on a receiver is bounded: one that takes no data or says nothing for RECEIVER_STALL_S
(receivers say "receiving" every second while frames arrive) is given up on, and named.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from podrun.errors import PodrunError, UsageError
from podrun.output import say, size_text
from podrun.remote import framing
from podrun.remote.relay_node import NOT_COPIED
from podrun.targets.base import Worker
from podrun.transport import past_login
from podrun.transport.base import Channel, ChannelLost

# children per receiver (PODRUN_RELAY_FANOUT; 0: the launcher feeds every worker itself);
# scripts/bench_ship.py --fanout compares values
DEFAULT_FANOUT = 4
MAX_FANOUT = 64
# longer than relay_node.py's STALL_TIMEOUT_S, so that a receiver's own account of a stalled relay
# peer arrives before the launcher gives up on the receiver
RECEIVER_STALL_S = 60
ABANDON_WAIT_S = 1.0  # after an interrupt: how long receivers get to remove their partial trees
REDRAW_S = 0.25


@dataclass(frozen=True)
class Shipment:
    code_dir: str  # relative to the worker's root
    frames: Callable[[], AsyncGenerator[bytes, None]]  # a fresh stream of frames (see relay_node.py) per call
    what: str = "code"  # in messages: the workdir's "code", or the "files" `podrun cp` uploads

    @property
    def recorded(self) -> bool:
        """Code gets its record as it is unpacked (remote/code_record.py); what `podrun cp` uploads does not."""
        return self.what == "code"


async def deliver(shipment: Shipment, workers: list[Worker]) -> int:
    """Put the shipment in place on every worker, or raise PodrunError naming one it cannot reach.
    Returns the bytes the launcher sent."""
    progress = Progress(len(workers), f"shipping {shipment.what}", "sent")
    try:
        missed = await _round(shipment, workers, relay_fanout(), progress)
        progress.clear()
        for worker, reason in missed:
            say(f"worker {worker.index} ({worker.address}) was not reached through the relay ({reason}); "
                f"sending it the {shipment.what} directly")
        failed = await _round(shipment, [worker for worker, _ in missed], 0, progress)
    finally:
        progress.clear()
    if failed:
        worker, reason = failed[0]
        raise PodrunError(f"worker {worker.index} ({worker.address}): shipping {shipment.what} failed: {reason}")
    return progress.sent


def relay_fanout() -> int:
    text = os.environ.get("PODRUN_RELAY_FANOUT", str(DEFAULT_FANOUT))
    if not text.isdigit() or int(text) > MAX_FANOUT:
        raise UsageError(f"PODRUN_RELAY_FANOUT={text!r}: expected how many workers each worker relays the code to, "
                         f"0 to {MAX_FANOUT} (default {DEFAULT_FANOUT}; 0: the launcher sends to each)")
    return int(text)


async def _round(shipment: Shipment, workers: list[Worker], fanout: int,
                 progress: Progress) -> list[tuple[Worker, str]]:
    """One tree over `workers` (fanout 0: the launcher feeds each); returns those it did not reach."""
    if not workers:
        return []
    token = secrets.token_hex(16)
    here = [worker for worker in workers if worker.transport.path_here(shipment.code_dir) is not None]
    fed = [worker for worker in workers if worker.transport.path_here(shipment.code_dir) is None] + here[:1]
    count = len(fed)
    parents = [None if fanout == 0 or i == 0 else (i - 1) // fanout for i in range(count)]
    children = {i: range(i * fanout + 1, min(count, (i + 1) * fanout + 1)) for i in range(count)}  # a heap
    receivers = [Receiver(worker, shipment, progress) for worker in fed]
    if here:  # local workers: one receiver unpacks it and copies it into the others' directories
        receivers[-1].copies = here[1:]

    async def finish(i: int) -> None:
        await receivers[i].finish()
        for j in children[i]:  # they have all they will get from this one
            receivers[j].end_input()

    try:
        await asyncio.gather(*(receiver.start(token, listen=parent is not None)
                               for receiver, parent in zip(receivers, parents)))
        await asyncio.gather(*(receiver.tell_children([receivers[j].address for j in children[i]])
                               for i, receiver in enumerate(receivers)))
        roots = [receiver for receiver, parent in zip(receivers, parents) if parent is None]
        await _all_or_none([_feed(shipment.frames(), roots, progress), *(finish(i) for i in range(count))])
    except BaseException:  # interrupted, or the workdir could not be packed
        await _abandon(receivers)
        raise
    missed = []
    for receiver, parent_index in zip(receivers, parents):
        if not receiver.ok:
            complaint = receivers[parent_index].complaint_about(receiver) if parent_index is not None else None
            missed.append((receiver.worker, f"{receiver.problem}; {complaint}" if complaint else receiver.problem))
        missed += receiver.copies_missed()
    return missed


async def _feed(frames: AsyncGenerator[bytes, None], roots: list[Receiver], progress: Progress) -> None:
    """Send the stream to every root in step; packing stops when no root is left to take it."""
    roots = [root for root in roots if root.answered]
    if not roots:
        return
    async with contextlib.aclosing(frames):
        async for frame in frames:
            taken = await asyncio.gather(*(root.send(frame) for root in roots))
            roots = [root for root, ok in zip(roots, taken) if ok]
            progress.add(sent=len(frame) * len(roots))
            if not roots:
                return
    for root in roots:
        root.end_input()


async def _all_or_none(awaitables: list) -> None:
    """Await them all; if one raises, cancel the others first."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _abandon(receivers: list[Receiver]) -> None:
    """End every receiver's input (each then removes its partial tree and exits) and give them a
    moment to do so."""
    running = [receiver.channel for receiver in receivers if receiver.channel is not None and not receiver.exited]
    for receiver in receivers:
        receiver.end_input()
    if running:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(channel.wait() for channel in running), return_exceptions=True),
                                   ABANDON_WAIT_S)


class Receiver:
    """relay_node.py on one worker, through the worker's transport."""

    def __init__(self, worker: Worker, shipment: Shipment, progress: Progress):
        self.worker = worker
        self.shipment = shipment
        self.progress = progress
        self.channel: Channel | None = None
        self.port: int | None = None  # set once it answered
        self.ok = False
        self.exited = False
        self.problem = "did not start"
        self.given_up: str | None = None  # why the launcher stopped waiting for it
        self.complaints: list[str] = []  # what it said about its children
        self.copies: list[Worker] = []  # local workers it copies the shipment to, on this machine's disk

    @property
    def answered(self) -> bool:
        return self.port is not None

    @property
    def address(self) -> tuple[str, int]:
        return self.worker.internal_ip, self.port or 0

    async def start(self, token: str, listen: bool) -> None:
        shipment = self.shipment
        config = {"code_dir": shipment.code_dir, "token": token, "listen": listen, "record": shipment.recorded,
                  "copies": [worker.transport.path_here(shipment.code_dir) for worker in self.copies]}
        try:
            self.channel = await self.worker.transport.start_python("relay_node")
            if not await self.send(framing.message(config)):
                return
            # past what the host's login printed (past_login.py)
            self.port = await asyncio.wait_for(past_login.read_report(self.channel.stdout, _port), RECEIVER_STALL_S)
        except ChannelLost as lost:
            self.problem = f"lost its connection ({lost})"
        except asyncio.TimeoutError:
            self._give_up(f"did not answer within {RECEIVER_STALL_S}s")

    async def tell_children(self, addresses: list[tuple[str, int]]) -> None:
        if self.answered:
            await self.send(framing.message({"children": [list(address) for address in addresses if address[1]]}))

    async def send(self, data: bytes) -> bool:
        """False when the receiver did not take it (finish() says why)."""
        if self.channel is None:
            return False
        try:
            self.channel.stdin.write(data)
            await asyncio.wait_for(self.channel.stdin.drain(), RECEIVER_STALL_S)
            return True
        except asyncio.TimeoutError:
            self._give_up(f"took no data for {RECEIVER_STALL_S}s")
        except (ChannelLost, ConnectionError, RuntimeError):
            pass
        return False

    def end_input(self) -> None:
        if self.channel is not None and not self.channel.stdin.is_closing():
            self.channel.stdin.write_eof()

    async def finish(self) -> None:
        """Follow it to its end: "receiving" while frames arrive, "ok" once the code is in place."""
        if self.channel is None:
            return
        reading_errors = asyncio.ensure_future(self.channel.stderr.read())
        last_line = b""
        try:
            while line := await asyncio.wait_for(self.channel.stdout.readline(), RECEIVER_STALL_S):
                last_line = line
            errors, code = await asyncio.wait_for(asyncio.gather(reading_errors, self.channel.wait()),
                                                  RECEIVER_STALL_S)
        except ChannelLost as lost:
            self.problem = f"lost its connection ({lost})"
            return
        except asyncio.TimeoutError:
            self._give_up(f"said nothing for {RECEIVER_STALL_S}s")
            return
        finally:
            reading_errors.cancel()
        self.exited = True
        lines = errors.decode(errors="replace").splitlines()
        self.complaints = [line for line in lines if line.startswith(("cannot reach", "relaying to", NOT_COPIED))]
        failures = [line for line in lines if line not in self.complaints]
        self.ok = code == 0 and last_line == b"ok\n" and not self.given_up
        self.problem = self.given_up or (failures[-1] if failures else f"exit code {code}")
        if self.ok:
            self.progress.add(done=1 + len(self.copies))

    def copies_missed(self) -> list[tuple[Worker, str]]:
        """The local workers it was to copy the shipment to and did not, with why."""
        missed = []
        for worker in self.copies:
            needle = f"{NOT_COPIED}{worker.transport.path_here(self.shipment.code_dir)}: "
            reason = next((line[len(needle):] for line in self.complaints if line.startswith(needle)), None)
            if not self.ok or reason is not None:
                missed.append((worker, f"copying the {self.shipment.what} from worker {self.worker.index}'s failed: "
                                       f"{reason or self.problem}"))
        return missed

    def complaint_about(self, child: Receiver) -> str | None:
        needle = "%s:%d" % child.address
        return next((f"worker {self.worker.index}: {line}" for line in self.complaints if needle in line), None)

    def _give_up(self, reason: str) -> None:
        self.given_up = self.problem = self.given_up or reason
        self.end_input()


def _port(line: bytes) -> int | None:
    """The port in relay_node's answer `port N`; None for any other line."""
    words = line.split()
    return int(words[1]) if len(words) == 2 and words[0] == b"port" and words[1].isdigit() else None


class Progress:
    """A transfer on one redrawn line of a terminal: bytes moved, rate, workers done. In a pipe it shows
    nothing (launch/launcher.py says what was shipped once it is)."""

    def __init__(self, workers: int, doing: str, moved: str):
        self.workers = workers
        self.doing, self.moved = doing, moved  # "shipping code", "sent"
        self.sent = 0
        self.done = 0
        self.started = time.monotonic()
        self.drawn_at = 0.0
        self.live = sys.stderr.isatty()

    def add(self, sent: int = 0, done: int = 0) -> None:
        self.sent += sent
        self.done += done
        now = time.monotonic()
        if self.live and now - self.drawn_at >= REDRAW_S:
            self.drawn_at = now
            rate = self.sent / max(now - self.started, 1e-3)
            self._draw(f"podrun: {self.doing}: {size_text(self.sent)} {self.moved}, {size_text(rate)}/s, "
                       f"{self.done}/{self.workers} worker(s) done")

    def clear(self) -> None:
        if self.live:
            self._draw("")

    @staticmethod
    def _draw(text: str) -> None:
        sys.stderr.write(f"\r\x1b[K{text}")
        sys.stderr.flush()
