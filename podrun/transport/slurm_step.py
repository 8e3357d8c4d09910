"""One srun for the agents of a whole step: the launcher's side of remote/slurm_fanout.py.

The workers' agents of one step (every worker's `setup`, then every worker's `run`) start together: each
SlurmTransport.start of the agent joins a batch (Steps.join), which starts once every connected worker
has joined (or GATHER_S after the first). A batch runs `slurm_fanout` on the login node over the link's
one SSH connection; its ONE srun starts a connector on every node (Slurm's daemons fan the start out),
and each worker's start returns a StepChannel once its node's connector has reached the fanout. Its
stdin, stdout, stderr and exit code are frames of the fanout's channel (remote/tree_frames.py, the
control tree's; framed_channel.py), so each worker keeps its own streams and its own exit code.

A node whose connector reaches no address of the login node (compute nodes that cannot open TCP
connections to it) runs its agent as a step of its own, srun per node, as before; once one did, the
link uses steps per node for the rest of the job. PODRUN_SLURM_STEPS=per-node chooses them from the
start, PODRUN_SLURM_LOGIN_ADDRESS the address the nodes connect to.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from podrun.errors import PodrunError
from podrun.output import say
from podrun.remote import framing, tree_frames
from podrun.transport.base import Channel, ChannelLost, script_command, script_source
from podrun.transport.framed_channel import FramedChannel, FrameOutbox

GATHER_S = 0.05  # a batch short of every connected worker starts this long after its first join
STEPS_VARIABLE = "PODRUN_SLURM_STEPS"  # "per-node": one srun per node, as before one step did it all
ADDRESS_VARIABLE = "PODRUN_SLURM_LOGIN_ADDRESS"


def srun_argv(job_id: str, nodes: Sequence[str], pty: bool = False) -> list[str]:
    """srun for one task on each of `nodes` of the allocation (as many tasks as nodes: one on each),
    beside any other step there.
    --overlap: the steps of the job's workers (and `podrun ssh`'s) share the nodes' resources;
    --whole: the step gets all of each node's allocated CPUs, memory and GPUs, not one CPU;
    --cpu-bind=none: its task is not bound to one of them (task/affinity's default binds each task to as many
    CPUs as it asked for, one): the worker's torchrun and every rank run on all of the node's allocated CPUs;
    --mpi=none: no PMI set-up for a step that is not MPI; --quiet: no "job step created" notes on stderr,
    which carries the agent's events; --kill-on-bad-exit=0 and --wait=0: one task's end decides nothing."""
    return ["srun", f"--jobid={job_id}", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes)}", "--overlap", "--whole", "--cpu-bind=none", "--mpi=none", "--quiet",
            "--kill-on-bad-exit=0", "--wait=0", *(["--pty"] if pty else [])]


def connector_argv(python: str) -> list[str]:
    """The task each node runs: the connector's bootstrap (transport.base.BOOTSTRAP), its source on stdin,
    which srun gives every task (--input=all)."""
    return shlex.split(script_command(python, "slurm_connector"))[1:]  # without its `exec`


class Fanout(FrameOutbox):
    """The launcher's end of one batch's fanout: its channel, which the nodes' frames go into and come from."""

    def __init__(self, channel: Channel):
        super().__init__()
        self.channel: Channel = channel


@dataclass
class Joined:
    node: str
    started: asyncio.Future[Channel]
    per_node: Callable[[], Awaitable[Channel]]


@dataclass
class Batch:
    job_id: str
    command: str
    joined: list[Joined] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class Steps:
    """A login link's batches: the agents of one step started as one srun (see the module's docstring)."""

    def __init__(self, start: Callable[[str], Awaitable[Channel]], python: str):
        self.start_on_login = start  # runs a shell line on the login node (or here)
        self.python = python
        self.one_step = os.environ.get(STEPS_VARIABLE, "one") != "per-node"
        self.batch: Batch | None = None
        self.running: set[asyncio.Task] = set()
        self.spare: Callable[[], Awaitable[Channel]] | None = None  # a fanout started early, for the next batch

    async def join(self, job_id: str, node: str, command: str, expected: int,
                   per_node: Callable[[], Awaitable[Channel]]) -> Channel:
        """The channel to `command` on `node`, started with the others of its batch; `expected`: how many
        workers a whole batch has."""
        if not self.one_step:
            return await per_node()
        loop = asyncio.get_running_loop()
        if self.batch and (self.batch.job_id, self.batch.command) != (job_id, command):
            self._launch()
        if self.batch is None:
            self.batch = Batch(job_id, command)
            self.batch.timer = loop.call_later(GATHER_S, self._launch)
        joined = Joined(node, loop.create_future(), per_node)
        self.batch.joined.append(joined)
        if len(self.batch.joined) >= expected:
            self._launch()
        return await joined.started

    def _launch(self) -> None:
        batch, self.batch = self.batch, None
        if batch is None:
            return
        if batch.timer:
            batch.timer.cancel()
        task = asyncio.ensure_future(self._run(batch))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _run(self, batch: Batch) -> None:
        # the nodes in name order (node2 before node10), not in the order their workers happened to join: one
        # srun line for the same nodes whatever the timing, as `ps` and the tests read it
        batch.joined.sort(key=lambda joined: [int(part) if part.isdigit() else part
                                              for part in re.split(r"(\d+)", joined.node)])
        if len(batch.joined) == 1:  # one node: its own step is one srun already, without a fanout
            await self._per_node(batch.joined[0])
            return
        try:
            fanout = await self._fanout()
            fanout.stdin.write(framing.message({
                "nodes": [joined.node for joined in batch.joined],
                "srun": [*srun_argv(batch.job_id, [joined.node for joined in batch.joined]), "--input=all",
                         *connector_argv(self.python), *self.task(batch.command)],
                "connector": script_source("slurm_connector"),
                "address": os.environ.get(ADDRESS_VARIABLE) or None}))
        except Exception as error:
            for joined in batch.joined:
                if not joined.started.done():
                    joined.started.set_exception(error)
            return
        await self._carry(batch, Fanout(fanout))

    def fanout_start(self) -> tuple[str, bytes]:
        """The fanout's command on the login node and its source, which it reads first: then it waits for its batch."""
        return script_command(self.python, "slurm_fanout"), script_source("slurm_fanout")

    async def _fanout(self) -> Channel:
        """The fanout started early (LoginLink.start_fanout_early) if there is one, else one started now."""
        spare, self.spare = self.spare, None
        if spare is not None:
            return await spare()
        command, source = self.fanout_start()
        fanout = await self.start_on_login(command)
        fanout.stdin.write(source)
        return fanout

    async def _carry(self, batch: Batch, fanout: Fanout) -> None:
        """Read the fanout's frames into each node's channel until it ends."""
        channels: dict[int, FramedChannel] = {}
        handed: set[int] = set()  # the slots whose agent runs as a step of its own
        frames = tree_frames.Frames()
        try:
            while data := await fanout.channel.stdout.read(262144):
                frames.feed(data)
                for kind, slot, payload in frames.take():
                    if kind == tree_frames.OPENED:
                        channels[slot] = FramedChannel(fanout, slot)
                        batch.joined[slot].started.set_result(channels[slot])
                    elif kind == tree_frames.FAILED:
                        if self.one_step:
                            say_fallback(batch.joined[slot].node, payload.decode(errors="replace"))
                        self.one_step = False  # the rest of the job: steps per node
                        handed.add(slot)
                        self._per_node_soon(batch.joined[slot])
                    elif slot in channels:
                        await take(channels[slot], kind, payload)
            code = await fanout.channel.wait()
            complaint = (await fanout.channel.stderr.read()).decode(errors="replace").strip().splitlines()
            why = complaint[-1] if complaint else f"the login node's fanout ended (exit code {code})"
        except (ChannelLost, ValueError) as lost:
            why = str(lost)
        fanout.lost = why
        for channel in channels.values():
            channel.lose(why)
        for slot, joined in enumerate(batch.joined):
            if not joined.started.done() and slot not in handed:
                joined.started.set_exception(PodrunError(f"srun did not start podrun's agent on {joined.node}: {why}"))

    def task(self, command: str) -> list[str]:
        """What the connector runs (slurm_connector.py's argv): the code of `exec PYTHON -I -S -c CODE` (the
        agent's start), in the connector's own interpreter; any other command through /bin/sh."""
        argv = shlex.split(command)
        if argv[:5] == ["exec", self.python, "-I", "-S", "-c"] and len(argv) == 6:
            return ["python", argv[5]]
        return ["shell", command]

    def _per_node_soon(self, joined: Joined) -> None:
        task = asyncio.ensure_future(self._per_node(joined))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    @staticmethod
    async def _per_node(joined: Joined) -> None:
        try:
            joined.started.set_result(await joined.per_node())
        except Exception as error:
            joined.started.set_exception(error)


def say_fallback(node: str, why: str) -> None:
    """Once a job: its nodes' agents start a step each from now on, and why (a node could not connect back)."""
    say(f"{node} cannot connect back to the login node ({why.strip() or 'no reason given'}): each node's agent "
        f"runs as a Slurm step of its own for the rest of the job, about 3 s more per start; "
        f"{ADDRESS_VARIABLE} names an address the nodes reach")


async def take(channel: FramedChannel, kind: int, payload: bytes) -> None:
    """A frame of a node's channel: its output or exit (FramedChannel.take), or its loss."""
    if kind == tree_frames.LOST:
        channel.lose(payload.decode(errors="replace") or "its connection to the login node closed")
    else:
        await channel.take(kind, payload)
