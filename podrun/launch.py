"""Run a planned job on every worker at once: connect, ship code, setup, run; fail fast; stop cleanly.

Each step runs the agent (podrun/agent.py) on every worker in parallel. The first step's agents
first report whether their worker has the code and, on a TPU VM, what holds the TPU; they wait while
the code is shipped to the workers without it and the workers are checked, then all start at once.
The first worker to fail is reported with its last lines and every other worker is told to stop;
Ctrl-C and SIGTERM do the same. The agents themselves stop their process trees, also when podrun
dies without telling them.
"""

from __future__ import annotations

import asyncio
import json
import marshal
import re
import signal
import sys
import time
from dataclasses import dataclass, field

from podrun import jobstore, preflight, sync
from podrun.errors import PodrunError
from podrun.output import Terminal, WorkerOutput, counted, say, size_text
from podrun.plan import WorkerPlan
from podrun.spec import JobSpec
from podrun.transport import Channel, ChannelLost, agent_command, agent_source

STOP_GRACE_S = 5.0
# the launcher says something to every agent this often; an agent that hears nothing for
# HEARTBEAT_TIMEOUT_S (a link that died without closing) stops its job by itself
HEARTBEAT_S = 5.0
HEARTBEAT_TIMEOUT_S = 20.0
# worker exits reach job.json at most this often while a step runs (each save writes every
# worker, so saving on every exit would cost O(N^2) on a big pod); a step's end always saves
RECORD_SAVE_INTERVAL_S = 0.5
# stop signals and the exit codes they give; SIGPIPE stands for stdout closing (`podrun exec | head`)
INTERRUPTED_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGPIPE: 141}
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
AGENT_MARSHAL_VERSION = 4  # what the agent reads its step in: every Python 3.4+ can read it
LOST_EXIT = 255  # what ssh itself exits with when the connection fails
SHOWN_TAIL_LINES = 20
# "torch.distributed.DistNetworkError: ...", "RuntimeError: ...": the line that says why it died
EXCEPTION_LINE = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Timeout|Interrupt)): (\S.*)$")


@dataclass
class StepResult:
    index: int
    code: int
    signal: str | None = None
    problem: str | None = None  # set when the agent could not report an exit (start failure, lost link)
    tail: list[str] = field(default_factory=list)
    detached: bool = False  # the step runs on in the background (exec --detach)

    @property
    def failed(self) -> bool:
        return self.code != 0

    def describe(self) -> str:
        if self.problem:
            return self.problem
        if self.signal:
            return f"was killed by {self.signal} (exit code {self.code})"
        return f"exited with code {self.code}"

    def cause(self) -> str | None:
        """The last exception line in the worker's final output, e.g. torchrun's rendezvous error."""
        for line in reversed(self.tail):
            if match := EXCEPTION_LINE.match(line):
                return f"{match[1]}: {match[2]}"
        return None


class WorkerStep:
    """One step of the job (setup or run) on one worker, through the agent."""

    def __init__(self, plan: WorkerPlan, step: str, command: str, output: WorkerOutput, detach: bool):
        self.plan = plan
        self.detach = detach
        self.step = step
        self.command = command
        self.output = output
        self.channel: Channel | None = None
        self.events: list[dict] = []
        self.diagnostics: list[str] = []  # stderr lines that are not agent events

    async def start(self, probe: dict | None = None) -> None:
        """Start the agent; with `probe`, it reports (see probed()) and waits for go() before the step starts."""
        worker = self.plan.worker
        config = {"job_id": self.plan.env["PODRUN_JOB_ID"], "worker": worker.index, "step": self.step,
                  "cwd": self.plan.cwd, "command": self.command, "env": self.plan.env, "grace": STOP_GRACE_S,
                  "heartbeat": HEARTBEAT_TIMEOUT_S, "detach": self.detach}
        if probe is not None:
            config["probe"] = probe
        self.channel = channel = await worker.transport.start(agent_command(worker.transport.python))
        step_blob = marshal.dumps(config, AGENT_MARSHAL_VERSION)
        channel.stdin.write(agent_source() + b"%d\n" % len(step_blob) + step_blob)
        await channel.stdin.drain()

    async def probed(self) -> dict | None:
        """The agent's probe report; None if it ended without one (finish() then says why)."""
        while line := await self._started().stderr.readline():
            event = self._take(line)
            if event and event["event"] == "probe":
                return event
        return None

    def go(self) -> None:
        self._say(b"go\n")

    def stop(self) -> None:
        self._say(b"stop\n")

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
            return StepResult(index, LOST_EXIT, problem=f"lost its connection ({lost})", tail=self.output.tail())
        self.output.close()
        exited = next((event for event in self.events if event.get("event") == "exited"), None)
        if any(event.get("event") == "detached" for event in self.events):
            return StepResult(index, 0, detached=True)
        if exited:
            return StepResult(index, exited["code"], exited["signal"], tail=self.output.tail())
        errors = [event["message"] for event in self.events if event.get("event") == "error"]
        detail = (errors or self.diagnostics or [f"the agent ended with code {agent_code} and no report"])[-1]
        return StepResult(index, agent_code or 1, problem=f"failed to run: {detail}", tail=self.output.tail())

    async def _pump_output(self) -> None:
        while chunk := await self._started().stdout.read(65536):
            self.output.feed(chunk)

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
            return event
        if text.strip():
            self.diagnostics.append(text)
        return None


class Launch:
    """One `podrun exec`: owns the job record, the terminal and the interrupt handling."""

    def __init__(self, spec: JobSpec, plans: list[WorkerPlan], tree: sync.Tree, record: jobstore.JobRecord,
                 terminal: Terminal, detach: bool, kill_stale: bool = False):
        self.spec = spec
        self.plans = plans
        self.detach = detach
        self.kill_stale = kill_stale
        self.tree = tree
        self.record = record
        self.terminal = terminal
        self.interrupted = asyncio.Event()
        self.record_saved_at = 0.0
        self.worker_records = {worker.index: worker for worker in record.workers}
        self.interrupt_signal = signal.SIGINT  # which signal stopped the job, once `interrupted` is set
        self.logs = {plan.worker.index: jobstore.open_log(record.log_path(plan.worker.index))
                     for plan in plans}

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in HANDLED_SIGNALS:
            loop.add_signal_handler(signum, self._on_signal, signum)
        self.terminal.on_closed = self._on_stdout_closed
        transports = [plan.worker.transport for plan in self.plans]
        try:
            connected = await self._until_interrupted(
                asyncio.gather(*(t.connect() for t in transports), return_exceptions=True))
            _raise_first_error(connected, self.plans)  # before anything started anywhere
            steps = ("setup", "run") if self.spec.setup else ("run",)
            for step in steps:
                if step != steps[0]:
                    await self._check_rendezvous(step)
                if self.interrupted.is_set():
                    break
                failure = await self._run_step(step, first=step == steps[0])
                if failure:
                    return self._finish_failed(step, failure)
                if step == "run" and self.detach and not self.interrupted.is_set():
                    return self._finish_detached()
            if self.interrupted.is_set():
                return self._finish_interrupted()
            self.record.finish(jobstore.SUCCEEDED, 0)
            say(f"job {self.record.id} succeeded in {time.time() - self.record.started_at:.1f}s")
            return 0
        except PodrunError as error:
            self.record.finish(jobstore.FAILED, 1, str(error))
            raise
        except Exception as error:  # a bug: the CLI prints it as an internal error; the record says so too
            self.record.finish(jobstore.FAILED, 1, f"internal error: {type(error).__name__}: {error}")
            raise
        finally:
            for signum in HANDLED_SIGNALS:
                loop.remove_signal_handler(signum)
            await asyncio.gather(*(t.close() for t in transports), return_exceptions=True)
            for log in self.logs.values():
                log.close()

    async def _run_step(self, step: str, first: bool) -> StepResult | None:
        """Run one step everywhere; returns the first failure, after every worker has stopped."""
        worker_steps = [WorkerStep(plan, step, getattr(plan, step), WorkerOutput(
            plan.worker.index, self.terminal, self.logs[plan.worker.index]), self.detach and step == "run")
            for plan in self.plans]
        started = await asyncio.gather(*(ws.start(self._probe(ws.plan) if first else None) for ws in worker_steps),
                                       return_exceptions=True)
        if any(isinstance(outcome, BaseException) for outcome in started):
            await _stop_all([ws for ws, outcome in zip(worker_steps, started) if outcome is None])
            _raise_first_error(started, self.plans)
        heartbeats = asyncio.ensure_future(_heartbeats(worker_steps))
        try:
            return await self._supervise_step(step, worker_steps, first)
        finally:
            heartbeats.cancel()

    async def _supervise_step(self, step: str, worker_steps: list[WorkerStep], first: bool) -> StepResult | None:
        if first:
            try:
                failure = await self._prepare(step, worker_steps)
            except BaseException:
                await _stop_all(worker_steps)
                raise
            if failure or self.interrupted.is_set():
                await _stop_all(worker_steps)
                if failure:
                    self._record_exit(failure)
                    self._report_failure(step, failure)
                return failure
            for ws in worker_steps:
                ws.go()
        finishing: dict[asyncio.Future[StepResult], WorkerStep] = {
            asyncio.ensure_future(ws.finish()): ws for ws in worker_steps}
        interrupt = asyncio.ensure_future(self.interrupted.wait())
        failure = None
        stopping = False
        while finishing:
            watched: list[asyncio.Future] = [*finishing, interrupt]
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for task in [task for task in finishing if task in done]:
                finishing.pop(task)
                result = task.result()
                self._record_exit(result)
                if result.failed and not stopping:
                    failure = result
                    self._report_failure(step, result)
            if time.monotonic() - self.record_saved_at > RECORD_SAVE_INTERVAL_S or not finishing:
                self.record.save()
                self.record_saved_at = time.monotonic()
            if not stopping and (failure or self.interrupted.is_set()):
                stopping = True
                for ws in finishing.values():
                    ws.stop()
        interrupt.cancel()
        return failure

    def _probe(self, plan: WorkerPlan) -> dict:
        """What the first step's agent reports before anything starts (agent.py, "probe")."""
        probe: dict[str, object] = {"code_dir": plan.cwd}
        if self.spec.target.kind == "tpu":
            probe.update(accelerator_files=preflight.accelerator_files(), kill_stale=self.kill_stale,
                         stale_grace=preflight.STALE_KILL_GRACE_S)
        return probe

    async def _prepare(self, step: str, worker_steps: list[WorkerStep]) -> StepResult | None:
        """While the first step's agents wait: read their probes, ship the code to the workers without
        it, check the workers. Returns the failure of a worker whose agent ended before reporting."""
        reports = await self._until_interrupted(
            asyncio.gather(*(ws.probed() for ws in worker_steps), return_exceptions=True))
        if reports is None:
            return None
        for ws, report in zip(worker_steps, reports):
            if not isinstance(report, dict):
                return await ws.finish()  # says why: the agent could not start, or the link broke
        workers = [ws.plan.worker for ws in worker_steps]
        if self.spec.target.kind == "tpu":
            preflight.report_tpu_holders([(w, report["holders"]) for w, report in zip(workers, reports)],
                                         self.kill_stale)
        missing = [worker for worker, report in zip(workers, reports) if not report["code"]]
        shipping_started = time.monotonic()
        sent = await self._until_interrupted(sync.ship(self.tree, self.spec.name, missing))
        if self.interrupted.is_set():
            return None
        say(f"shipped code ({counted(len(self.tree.files), 'file')}) to {counted(len(missing), 'worker')}: "
            f"{size_text(sent or 0)} sent "
            f"in {time.monotonic() - shipping_started:.1f}s" if missing else "code unchanged on every worker")
        if self.spec.docker:  # run is wrapped in `docker run`
            await self._until_interrupted(preflight.check_docker(self.plans))
        await self._check_rendezvous(step)
        return None

    async def _check_rendezvous(self, step: str) -> None:
        if step == "run" and self.spec.torchrun and len(self.plans) > 1 and not self.interrupted.is_set():
            await self._until_interrupted(
                preflight.check_rendezvous([p.worker for p in self.plans], self.spec.torchrun.port))

    async def _until_interrupted(self, work):
        """Await `work`, abandoning it (None) if the user interrupts first."""
        task = asyncio.ensure_future(work)
        interrupt = asyncio.ensure_future(self.interrupted.wait())
        await asyncio.wait([task, interrupt], return_when=asyncio.FIRST_COMPLETED)
        interrupt.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        return task.result()

    def _on_signal(self, signum: signal.Signals) -> None:
        if self.interrupted.is_set():
            say("second interrupt: exiting now; the workers stop on their own")
            self.record.finish(jobstore.STOPPED, INTERRUPTED_EXIT[signum], "interrupted twice")
            sys.stdout.flush()
            raise SystemExit(INTERRUPTED_EXIT[signum])
        self.interrupt_signal = signum
        self.interrupted.set()
        say(f"{signal.Signals(signum).name}: stopping the job on every worker (again to exit at once)")

    def _on_stdout_closed(self) -> None:
        if not self.interrupted.is_set():
            self.interrupt_signal = signal.SIGPIPE
            self.interrupted.set()
            say("stdout was closed: stopping the job on every worker (its logs keep all output)")

    def _record_exit(self, result: StepResult) -> None:
        if result.detached:
            return
        worker = self.worker_records[result.index]
        worker.exit_code, worker.signal = result.code, result.signal

    def _report_failure(self, step: str, result: StepResult) -> None:
        plan = next(p for p in self.plans if p.worker.index == result.index)
        lines = [f"worker {result.index} ({plan.worker.address}) {result.describe()} in {step}"]
        if result.tail:
            lines.append(f"last lines of worker {result.index}:")
            lines += [f"  {line}" for line in result.tail[-SHOWN_TAIL_LINES:]]
        say("\n".join(lines))

    def _finish_failed(self, step: str, failure: StepResult) -> int:
        summary = f"worker {failure.index} {failure.describe()} in {step}"
        if cause := failure.cause():
            summary += f" ({cause})"
        self.record.finish(jobstore.FAILED, failure.code, summary)
        say(f"job {self.record.id} failed: {summary}; every other worker was stopped")
        return failure.code

    def _finish_detached(self) -> int:
        self.record.detached = True
        self.record.save()
        job_id = self.record.id
        say(f"job {job_id} runs on every worker without podrun; follow it with `podrun logs -f {job_id}`, "
            f"stop it with `podrun stop {job_id}`")
        return 0

    def _finish_interrupted(self) -> int:
        code = INTERRUPTED_EXIT[self.interrupt_signal]
        self.record.finish(jobstore.STOPPED, code, f"stopped by {self.interrupt_signal.name}")
        say(f"job {self.record.id} stopped on every worker")
        return code


async def _heartbeats(worker_steps: list[WorkerStep]) -> None:
    while True:
        await asyncio.sleep(HEARTBEAT_S)
        for worker_step in worker_steps:
            worker_step.heartbeat()


async def _stop_all(worker_steps: list[WorkerStep]) -> None:
    for worker_step in worker_steps:
        worker_step.stop()
    await asyncio.gather(*(worker_step.finish() for worker_step in worker_steps), return_exceptions=True)


def _raise_first_error(outcomes: list | None, plans: list[WorkerPlan]) -> None:
    """Raise the first worker's error as one PodrunError line; anything else than a PodrunError
    (a connection lost mid-start, a library's own exception) is named with its worker."""
    failed = [(plan.worker, outcome) for plan, outcome in zip(plans, outcomes or ())
              if isinstance(outcome, BaseException)]
    if not failed:
        return
    worker, error = failed[0]
    if isinstance(error, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
        raise error
    if isinstance(error, PodrunError):
        message = str(error)
    elif isinstance(error, ChannelLost):
        message = f"worker {worker.index} ({worker.address}) lost its connection ({error})"
    else:
        message = f"worker {worker.index} ({worker.address}): {type(error).__name__}: {error}"
    more = f" (and {len(failed) - 1} more worker(s) failed the same step)" if len(failed) > 1 else ""
    raise PodrunError(message + more)
