"""Deliver one shipment of code to many workers while the launcher sends it once: a relay tree.

The launcher feeds the first worker that lacks the code; each worker's receiver (relay_node.py)
forwards the frames, as they arrive, to up to RELAY_FANOUT others over the workers' internal
addresses. A worker the tree did not reach (a firewall between workers, a receiver that died) is
named, then sent the code directly; only a direct send that fails stops the job.
"""

from __future__ import annotations

import asyncio
import marshal
import os
import secrets
from dataclasses import dataclass

from podrun.errors import PodrunError
from podrun.output import say
from podrun.targets import Worker
from podrun.transport import ChannelLost, script_command, script_source

# children per receiver; scripts/bench_ship.py --fanout compares values
RELAY_FANOUT = int(os.environ.get("PODRUN_RELAY_FANOUT", "4"))
MARSHAL_VERSION = 4  # readable by every Python 3.4+


@dataclass(frozen=True)
class Shipment:
    code_dir: str  # relative to the worker's root
    digest: str  # sha256 of the tar archive the frames unpack to
    frames: list[bytes]  # see relay_node.py


async def deliver(shipment: Shipment, workers: list[Worker]) -> None:
    """Put the shipment in place on every worker, or raise PodrunError naming one it cannot reach."""
    missed = await _round(shipment, workers, RELAY_FANOUT)
    for worker, reason in missed:
        say(f"worker {worker.index} ({worker.address}) was not reached through the relay ({reason}); "
            f"sending it the code directly")
    failed = await _round(shipment, [worker for worker, _ in missed], fanout=0)
    if failed:
        worker, reason = failed[0]
        raise PodrunError(f"worker {worker.index} ({worker.address}): shipping the workdir failed: {reason}")


async def _round(shipment: Shipment, workers: list[Worker], fanout: int) -> list[tuple[Worker, str]]:
    """One tree over `workers` (fanout 0: the launcher feeds each); returns those it did not reach."""
    if not workers:
        return []
    token = secrets.token_hex(16)
    count = len(workers)
    parents = [None if fanout == 0 or i == 0 else (i - 1) // fanout for i in range(count)]
    children = {i: range(i * fanout + 1, min(count, (i + 1) * fanout + 1)) for i in range(count)}  # a heap
    receivers = [Receiver(worker) for worker in workers]
    await asyncio.gather(*(receiver.start(shipment, token, listen=parent is not None)
                           for receiver, parent in zip(receivers, parents)))
    await asyncio.gather(*(receiver.tell_children([receivers[j].address for j in children[i]])
                           for i, receiver in enumerate(receivers)))

    async def finish(i: int) -> None:
        if parents[i] is None:
            await receivers[i].feed(shipment.frames)
        await receivers[i].finish()
        for j in children[i]:  # they have all they will get from this one
            receivers[j].end_input()

    await asyncio.gather(*(finish(i) for i in range(count)))
    missed = []
    for i, receiver in enumerate(receivers):
        if not receiver.ok:
            parent = receivers[parents[i]] if parents[i] is not None else None
            complaint = parent.complaint_about(receiver) if parent else None
            missed.append((receiver.worker, f"{receiver.problem}; {complaint}" if complaint else receiver.problem))
    return missed


class Receiver:
    """relay_node.py on one worker, through the worker's transport."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.channel = None
        self.port = 0
        self.ok = False
        self.problem = "did not start"
        self.complaints: list[str] = []  # what it said about its children

    @property
    def address(self) -> tuple[str, int]:
        return self.worker.internal_ip, self.port

    async def start(self, shipment: Shipment, token: str, listen: bool) -> None:
        config = {"code_dir": shipment.code_dir, "digest": shipment.digest, "token": token, "listen": listen}
        try:
            self.channel = await self.worker.transport.start(script_command(self.worker.transport.python,
                                                                            "relay_node.py"))
            self.channel.stdin.write(script_source("relay_node.py") + _message(config))
            await self.channel.stdin.drain()
            answer = await self.channel.stdout.readline()
        except ChannelLost as lost:
            self.problem = f"lost its connection ({lost})"
            return
        if answer.startswith(b"port "):
            self.port = int(answer.split()[1])

    async def tell_children(self, addresses: list[tuple[str, int]]) -> None:
        if self.channel is not None:
            await self._write(_message({"children": [list(address) for address in addresses if address[1]]}))

    async def feed(self, frames: list[bytes]) -> None:
        for frame in frames:
            if not await self._write(frame):
                return
        self.end_input()

    def end_input(self) -> None:
        if self.channel is not None and not self.channel.stdin.is_closing():
            self.channel.stdin.write_eof()

    async def finish(self) -> None:
        if self.channel is None:
            return
        try:
            said, errors, code = await asyncio.gather(self.channel.stdout.read(), self.channel.stderr.read(),
                                                      self.channel.wait())
        except ChannelLost as lost:
            self.problem = f"lost its connection ({lost})"
            return
        lines = errors.decode(errors="replace").splitlines()
        self.complaints = [line for line in lines if line.startswith(("cannot reach", "relaying to"))]
        failures = [line for line in lines if line not in self.complaints]
        self.ok = code == 0 and said.endswith(b"ok\n")
        self.problem = failures[-1] if failures else f"exit code {code}"

    def complaint_about(self, child: Receiver) -> str | None:
        needle = "%s:%d" % child.address
        return next((f"worker {self.worker.index}: {line}" for line in self.complaints if needle in line), None)

    async def _write(self, data: bytes) -> bool:
        try:
            self.channel.stdin.write(data)
            await self.channel.stdin.drain()
            return True
        except (ChannelLost, ConnectionError, RuntimeError):
            return False  # finish() reports how it ended


def _message(content: dict) -> bytes:
    blob = marshal.dumps(content, MARSHAL_VERSION)
    return b"%d\n" % len(blob) + blob
