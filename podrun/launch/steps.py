"""The launcher's half of the agent protocol (remote/agent.py): one step of a job on one worker.

A WorkerStep starts the agent over the worker's transport with its step (framing.py), optionally
waits for its probe report and says go, sends heartbeats and stop, streams the step's output into
the worker's log and the terminal, and reads the agent's events into a StepResult.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from podrun import exits, timeline
from podrun.errors import PodrunError
from podrun.output import counted, say, worker_ranges
from podrun.plan import FILE_VARIABLES, WorkerPlan, job_files
from podrun.remote import framing
from podrun.targets.base import Worker
from podrun.transport.base import Channel, ChannelLost
from podrun.worker_output import RANK_HEADER, WorkerOutput

# the launcher says something to every agent this often; an agent that hears nothing for
# HEARTBEAT_TIMEOUT_S (a link that died without closing) stops its job by itself
HEARTBEAT_S = 5.0
HEARTBEAT_TIMEOUT_S = 20.0
# "torch.distributed.DistNetworkError: ...", "RuntimeError: ...": the line that says why it died
EXCEPTION_LINE = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Timeout|Interrupt)): (\S.*)$")
RANK_LINE = re.compile("^" + RANK_HEADER)
# a first step's agents say hello before anything else (agent.py): workers silent this long are named on
# the terminal, and this much longer, given up on; a login that waits (a ~/.bashrc reading its input, a
# ForceCommand) would otherwise hold the job, and a Ctrl-C, forever
FIRST_CONTACT_NOTICE_S = 5.0
FIRST_CONTACT_TIMEOUT_S = 30.0
WAITING_LOGIN = "does a login there wait: ~/.bashrc, ~/.ssh/rc, a ForceCommand?"
TAIL_LINES_KEPT = 200  # enough to hold torchrun's summary and the failing rank's traceback before it


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class StepResult:
    index: int
    code: int
    signal: str | None = None
    problem: str | None = None  # set when the agent could not report an exit (start failure, lost link)
    tail: list[str] = field(default_factory=list)
    detached: bool = False  # the step runs on in the background (exec --detach)
    rank: int | None = None  # under torchrun: the rank that failed first, whose exit code `code` is (agent.py)
    killed: bool = False  # a stop's SIGKILL ended it, after the grace period (agent.py)
    agent_killed: bool = False  # a signal ended the agent itself before its report: as a VM's shutdown does
    stop_reason: str | None = None  # why its agent stopped it early, as it said ("SIGTERM": Slurm's warning)

    @property
    def failed(self) -> bool:
        return self.code != 0

    def describe(self) -> str:
        if self.problem:
            return self.problem
        if self.rank is not None:
            return f"rank {self.rank} exited with code {self.code}"
        if self.signal:
            return f"was killed by {self.signal} (exit code {self.code})"
        return f"exited with code {self.code}"

    def cause(self) -> str | None:
        """The last exception line in the worker's final output (of the failed rank, under torchrun:
        else its last line, such as python's "can't open file"), e.g. torchrun's rendezvous error."""
        lines = self.shown_tail()
        for line in reversed(lines):
            if match := EXCEPTION_LINE.match(line):
                return f"{match[1]}: {match[2]}"
        return RANK_LINE.sub("", lines[-1]).strip() if self.rank is not None and lines else None

    def shown_tail(self) -> list[str]:
        """The last lines that explain the failure: under torchrun the failed rank's own, not its summary."""
        if self.rank is None:
            return self.tail
        return [line for line in self.tail if (match := RANK_LINE.match(line)) and int(match[1]) == self.rank]


class WorkerStep:
    """One step of the job (setup or run) on one worker, through the agent."""

    def __init__(self, plan: WorkerPlan, step: str, command: str, output: WorkerOutput, detach: bool,
                 grace: float, watch: dict | None = None, vm_notices: bool = False,
                 on_notice: Callable[[int, str], None] | None = None, progress: dict | None = None,
                 on_step: Callable[[int, int, float, dict], None] | None = None, notify: dict | None = None,
                 on_fall: Callable[[int, dict], None] | None = None, slurm_signals: bool = False):
        self.plan = plan
        self.detach = detach
        self.grace = grace
        self.watch = watch  # a detached run on several workers: the agents watch each other (agent.Hub)
        self.vm_notices = vm_notices  # the agent stops the run on the VM's own notice (remote/vm_notice.py)
        self.slurm_signals = slurm_signals  # a SIGTERM to the agent is Slurm's to the whole step (remote/step.py)
        self.on_notice = on_notice  # told (worker, reason) as soon as the agent reports such a notice
        self.progress = progress  # where run's agent reads the job's step (the spec's progress: step_reader.py)
        self.on_step = on_step  # told (worker, step, epoch seconds, event) as the agent reports each step it reached
        self.on_fall = on_fall  # told (worker, event) once its agent saw the step fall (step_reader.py)
        self.fell: dict | None = None  # that event: {step: where it fell from, before, after: as shown}
        self.notify = notify  # worker 0 of a detached run that nothing watches: the agent tells the job's end
        self.step = step
        self.command = command
        self.output = output
        self.channel: Channel | None = None
        self.events: list[dict] = []
        self.diagnostics: list[str] = []  # stderr lines that are not agent events
        self.output_at = 0.0  # when output last came (time.monotonic()): the stall watch's clock
        self.step_at = 0.0  # when its step last advanced (time.monotonic()): with progress, the stall watch's
        self.probing = False  # its agent says hello first (first_contact)
        self.line_counter: dict | None = None  # run's lines counted over time (timeline.count_lines)
        self.gone = asyncio.Event()  # set once the agent was told to start the step (go)

    async def start(self, probe: dict | None = None) -> None:
        """Start the agent; with `probe`, it reports (see probed()) and waits for go() before the step starts."""
        worker = self.plan.worker
        config = {"job_id": self.plan.env["PODRUN_JOB_ID"], "job_dir": self.plan.job_dir, "worker": worker.index,
                  "step": self.step,
                  "cwd": self.plan.cwd, "command": self.command, "env": self.plan.env, "grace": self.grace,
                  "heartbeat": HEARTBEAT_TIMEOUT_S, "detach": self.detach, "code_dir": self.plan.code_dir,
                  "job_files": job_files(self.plan, self.step), "file_env": FILE_VARIABLES}
        if self.step == "run":
            config.update(container=self.plan.container, term="leader" if self.plan.term_leader_only else "group",
                          vm_notices=self.vm_notices, progress=self.progress, slurm_signals=self.slurm_signals,
                          on_preempt=self.plan.on_preempt if self.vm_notices else None)
        if probe is not None:
            config["probe"] = probe
            self.probing = True
        if self.watch is not None:
            config["watch"] = self.watch
        if self.notify is not None:
            config["notify"] = self.notify
        self.channel = channel = await worker.transport.start_python("agent")
        channel.stdin.write(framing.message(config))
        await channel.stdin.drain()

    async def probed(self) -> dict | None:
        """The agent's probe report; None if it ended without one (finish() then says why)."""
        return await self.reported("probe")

    async def reported(self, name: str) -> dict | None:
        """The agent's event `name` (read on until it comes); None if the agent ended without it."""
        for seen in self.events:
            if seen["event"] == name:
                return seen
        while line := await self._started().stderr.readline():
            event = self._take(line)
            if event and event["event"] == name:
                return event
        return None

    def go(self, hub: str = "") -> None:
        """Start the step; `hub`: worker 0's address for a watched job's agents (agent.Hub)."""
        self._say(f"go {hub}".rstrip().encode() + b"\n")
        self.gone.set()

    def stop(self) -> None:
        self._say(b"stop\n")
        self.output.stopping()

    def heartbeat(self) -> None:
        self._say(b"\n")

    def _say(self, line: bytes) -> None:
        if self.channel and not self.channel.stdin.is_closing():
            try:
                self.channel.stdin.write(line)
            except (ChannelLost, OSError, RuntimeError):
                pass  # the channel is gone; finish() reports how the worker ended

    async def finish(self) -> StepResult:
        index = self.plan.worker.index
        try:
            await asyncio.gather(self._pump_output(), self._read_events())
            agent_code = await self._started().wait()
        except ChannelLost as lost:
            self.output.close()
            return StepResult(index, exits.LOST, problem=f"lost its connection ({lost})", tail=self.output.tail())
        self.output.close()
        exited = next((event for event in self.events if event.get("event") == "exited"), None)
        if any(event.get("event") == "detached" for event in self.events):
            return StepResult(index, 0, detached=True)
        if exited:
            return StepResult(index, exited["code"], exited["signal"], tail=self.output.tail(), rank=exited.get("rank"),
                              killed=bool(exited.get("killed")), stop_reason=exited.get("stop_reason"))
        errors = [event["message"] for event in self.events if event.get("event") == "error"]
        code = exits.of_process(agent_code)
        ended = (f"its agent was killed by {_signal_name(-agent_code)} (exit code {code})" if agent_code < 0
                 else f"the agent ended with code {code} and no report")
        detail = (errors or self.diagnostics or [ended])[-1]
        return StepResult(index, code or 1, problem=f"failed to run: {detail}", tail=self.output.tail(),
                          agent_killed=agent_code < 0)

    async def _pump_output(self) -> None:
        while chunk := await self._started().stdout.read(65536):
            self.output_at = time.monotonic()
            self.output.feed(chunk)
            if self.line_counter is not None:
                timeline.count_lines(self.line_counter, chunk.count(b"\n"), time.time())

    async def _read_events(self) -> None:
        while line := await self._started().stderr.readline():
            self._take(line)

    def _started(self) -> Channel:
        assert self.channel is not None, "the step was started"
        return self.channel

    def _take(self, line: bytes) -> dict | None:
        """Keep a line of the agent's stderr: an event (returned) or a diagnostic."""
        text = line.decode(errors="replace").rstrip("\n")
        try:
            event = json.loads(text)
        except ValueError:
            event = None
        if isinstance(event, dict) and "event" in event:
            self.events.append(event)
            if event["event"] == "notice" and self.on_notice:
                self.on_notice(self.plan.worker.index, str(event.get("reason")))
            elif event["event"] == "step":
                self.step_at = time.monotonic()
                if self.on_step:
                    self.on_step(self.plan.worker.index, int(event["step"]), float(event["at"]), event)
            elif event["event"] == "fell":
                self.fell = event
                if self.on_fall:
                    self.on_fall(self.plan.worker.index, event)
            return event
        if text.strip():
            self.diagnostics.append(text)
        return None


async def heartbeats(worker_steps: list[WorkerStep]) -> None:
    while True:
        await asyncio.sleep(HEARTBEAT_S)
        for worker_step in worker_steps:
            worker_step.heartbeat()


async def hub_address(first: WorkerStep) -> str:
    """Where the other agents of a watched job reach the first worker's (agent.Hub); "" if unwatched."""
    if not first.watch:
        return ""
    event = await first.reported("hub")
    return f"{first.plan.worker.internal_ip}:{event['port']}" if event else ""


async def first_contact(worker_steps: list[WorkerStep]) -> None:
    """Returns once every probing agent said hello (or ended); see wait_for_workers."""
    await wait_for_workers({asyncio.ensure_future(ws.reported("hello")): ws.plan.worker
                            for ws in worker_steps if ws.probing}, "start podrun's agent", FIRST_CONTACT_TIMEOUT_S)


async def wait_for_workers(waiting: dict[asyncio.Future, Worker], what: str, timeout_s: float) -> None:
    """Returns once every future is done: the workers whose futures are not done after
    FIRST_CONTACT_NOTICE_S are named on the terminal, and after `timeout_s` raised as a PodrunError.
    Whatever ends it, the futures not done are cancelled (a done one's outcome stays for its caller)."""
    try:
        pending = (await asyncio.wait(waiting, timeout=FIRST_CONTACT_NOTICE_S))[1] if waiting else set()
        if pending:
            say(f"waiting for {_named([waiting[task] for task in pending])} to {what} "
                f"({FIRST_CONTACT_NOTICE_S:g}s so far; {WAITING_LOGIN})")
            pending = (await asyncio.wait(pending, timeout=timeout_s - FIRST_CONTACT_NOTICE_S))[1]
        if pending:
            raise PodrunError(f"{_named([waiting[task] for task in pending])}: did not {what} within {timeout_s:g}s "
                              f"({WAITING_LOGIN})")
    finally:
        for task in waiting:
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # looked at: asyncio warns of an exception nobody retrieved


def _named(workers: list[Worker]) -> str:
    """`worker 1 (10.0.0.3)`, or for several, `3 workers (w1-2,5)`."""
    workers = sorted(workers, key=lambda worker: worker.index)
    if len(workers) == 1:
        return f"worker {workers[0].index} ({workers[0].address})"
    return f"{counted(len(workers), 'worker')} ({worker_ranges([worker.index for worker in workers])})"


async def stop_all(worker_steps: list[WorkerStep]) -> None:
    """Stop every step and wait for each to end; an agent that never said hello (first_contact) never
    got past the login: nothing of the job runs there to wait for, and closing the connection ends it."""
    for worker_step in worker_steps:
        worker_step.stop()
    started = [ws for ws in worker_steps if not ws.probing or any(e["event"] == "hello" for e in ws.events)]
    await asyncio.gather(*(worker_step.finish() for worker_step in started), return_exceptions=True)
