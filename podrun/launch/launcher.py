"""Run a planned job on every worker at once: connect, ship code, setup, run; fail fast; stop cleanly.

Each step runs the agent (remote/agent.py, through steps.WorkerStep) on every worker in parallel.
The first step's agents first report whether their worker has the code and what the target asked
them to check (Target.probe: on a TPU VM, what holds the TPU); they wait while the code is shipped
to the workers without it and the workers are checked, then all start at once.
The first worker to fail is reported with its last lines and every other worker is told to stop;
Ctrl-C and SIGTERM do the same. The agents themselves stop their process trees, also when podrun
dies without telling them. How each ending is recorded and said is endings.py's.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import sys
import time
from collections.abc import Callable

from podrun import exits, jobstore, progress, timeline
from podrun.countdown import Countdown
from podrun.errors import PodrunError, WorkersUnreachable
from podrun.launch import causes, endings, health, preflight, stall, stragglers
from podrun.launch.steps import (
    TAIL_LINES_KEPT,
    StepResult,
    WorkerStep,
    first_contact,
    heartbeats,
    hub_address,
    stop_all,
)
from podrun.output import counted, say, say_phase, size_text
from podrun.plan import JobPlan, WorkerPlan
from podrun.shipping import archive, scan
from podrun.targets.base import Target, Worker
from podrun.terminal import Terminal
from podrun.worker_output import WorkerOutput

# worker exits reach job.json at most this often while a step runs (each save writes every
# worker, so saving on every exit would cost O(N^2) on a big pod); a step's end always saves
RECORD_SAVE_INTERVAL_S = 0.5
# and saving takes at most this share of the launcher's time: a save of 512 workers took 46 ms
# (5 ms in compact JSON), so every 0.5 s at 12,000 workers the launcher would do little else
RECORD_SAVE_SHARE = 0.1
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Launch:
    """One `podrun exec`: owns the job record, the terminal and the interrupt handling."""

    def __init__(self, target: Target, job: JobPlan, tree: scan.Tree | None, record: jobstore.JobRecord,
                 terminal: Terminal, detach: bool, kill_stale: bool = False,
                 on_running: Callable[[], None] | None = None, notify: dict | None = None, away: dict | None = None,
                 on_straggler: Callable[[dict], None] = lambda found: None):
        self.target = target
        self.job = job  # what runs: the steps, the checks before each, each worker's plan (plan.py)
        self.plans = job.workers  # each worker's, with the interfaces its probe found (preflight.py)
        self.detach = detach
        self.kill_stale = kill_stale
        self.on_running = on_running  # called once run has started on every worker
        self.on_straggler = on_straggler  # called with the straggler, once one shows (launch/stragglers.py)
        self.notify = notify  # a detached run that nothing watches: worker 0's agent tells its end (notify.py)
        # a supervisor host's detached run: {away_s, delete}: its hub stops it once the supervisor has been away
        # that long, and deletes its TPU as `delete` says (remote/hub.py, remote/self_delete.py)
        self.away = away
        self.tree = tree  # None: nothing ships (an ad-hoc command without --workdir)
        self.record = record
        self.terminal = terminal
        self.interrupted = asyncio.Event()
        self.record_saved_at = 0.0
        self.record_save_interval = RECORD_SAVE_INTERVAL_S
        self.worker_records = {worker.index: worker for worker in record.workers}
        self.interrupt_signal = signal.SIGINT  # which signal stopped the job, once `interrupted` is set
        self.preempted: str | None = None  # why the target's capacity went away, once the API showed it
        self.departed = asyncio.Event()  # set with `preempted` by the watch while run goes on
        self.agents_killed: set[int] = set()  # workers whose agent a signal ended before its report
        self.stalled: str | None = None  # which workers were silent and how long, once the job stalled
        self.warned = False  # a worker's agent stopped on a SIGTERM where the capacity warns_steps (ran_out)
        self.failed_results: list[StepResult] = []  # a step's workers that failed on their own, as their exits came
        self.stopped_results: list[StepResult] = []  # and those its stop (or the job's end) stopped
        self.out_of_time: str | None = None  # why the capacity's time ran out, once a failure showed it (ran_out)
        self.falls = stall.Falls((job.progress or {}).get("pattern"))  # workers whose step fell: said once
        self.logs = {plan.worker.index: jobstore.open_log(record.log_path(plan.worker.index))
                     for plan in job.workers}

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in HANDLED_SIGNALS:
            loop.add_signal_handler(signum, self._on_signal, signum)
        self.terminal.on_closed = self._on_stdout_closed
        transports = [plan.worker.transport for plan in self.plans]
        self.connecting = timeline.begin(self.record, "connect", [plan.worker.index for plan in self.plans])
        try:
            connected = await self._until_interrupted(  # a restart in place starts on the connections still open
                asyncio.gather(*(t.connect_unless_open() for t in transports), return_exceptions=True))
            endings.raise_first_error(connected, self.plans, "connect")  # before anything started anywhere
            steps = self.job.steps
            for step in steps:
                if step != steps[0]:
                    await self._check(step)
                if self.interrupted.is_set():
                    break
                failure = await self._run_step(step, first=step == steps[0])
                if self.warned and (reason := await asyncio.to_thread(self.target.capacity.ran_out, True)):
                    return endings.out_of_time(self.record, reason)  # whatever the workers exited with: 0 after a save
                if failure:
                    return await self._finish_failed(step, failure)
                if self.preempted:
                    return endings.preempted(self.record, self.preempted)
                if self.stalled:
                    return endings.stalled(self.record, self.stalled)
                if step == "run" and self.detach and not self.interrupted.is_set():
                    return endings.detached(self.record)
            if self.interrupted.is_set():
                return endings.interrupted(self.record, self.interrupt_signal)
            return endings.succeeded(self.record)
        except PodrunError as error:
            if self.target.capacity.departs and (reason := await asyncio.to_thread(self.target.capacity.lost)):
                return endings.preempted(self.record, reason)  # a worker unreachable because the TPU is gone
            for index in error.workers if isinstance(error, WorkersUnreachable) else ():
                self.worker_records[index].exit_code = exits.LOST  # as lost as one whose connection dropped
            self.record.finish(jobstore.FAILED, error.exit_code, str(error))
            raise
        except Exception as error:  # a bug: the CLI prints it as an internal error; the record says so too
            self.record.finish(jobstore.FAILED, exits.INTERNAL_ERROR, f"internal error: {type(error).__name__}: {error}")
            raise
        finally:
            timeline.end(self.connecting)  # the workers that never reported
            for signum in HANDLED_SIGNALS:
                loop.remove_signal_handler(signum)
            self.terminal.release()  # the lines still held (collapse.py), before what the CLI says of an error
            # a reusable connection is kept for the next attempt on the worker (launch/attempt_loop.py)
            await asyncio.gather(*(t.close() for t in transports if not t.reusable), return_exceptions=True)
            for log in self.logs.values():
                log.close()

    async def _run_step(self, step: str, first: bool) -> StepResult | None:
        """Run one step everywhere; returns the first failure, after every worker has stopped."""
        detach = self.detach and step == "run"
        stall_s = self.job.stall_s
        reading = self.job.progress if step == "run" else None
        if reading and (epochs := progress.epochs_known(self.record)):  # an earlier attempt's: its count goes on
            reading = {**reading, "epochs": epochs}
        watch = {"token": secrets.token_hex(16), "hub_worker": self.plans[0].worker.index, "workers": len(self.plans),
                 "bind": self.plans[0].worker.internal_ip, "stall": stall_s,
                 "alive_every": stall.alive_every(stall_s) if stall_s else None, "progress": bool(reading),
                 "auto": stall.auto_settings() if stall_s == stall.AUTO else None, **(self.away or {}),
                 } if detach and (len(self.plans) > 1 or stall_s or self.away) else None
        worker_steps = [WorkerStep(plan, step, getattr(plan, step), WorkerOutput(
            plan.worker.index, self.terminal, self.logs[plan.worker.index], keep=TAIL_LINES_KEPT), detach,
            self.record.stop_grace_s,
            watch and {**watch, "worker": plan.worker.index}, vm_notices=step == "run" and self.target.capacity.departs,
            on_notice=self._on_notice, progress=reading, on_step=self._on_step,
            notify=self.notify if detach and plan is self.plans[0] else None, on_fall=self.falls.heard,
            slurm_signals=step == "run" and not detach and self.target.capacity.warns_steps)
            for plan in self.plans]
        # from the first agent's start: one started early waits for go for at most HEARTBEAT_TIMEOUT_S without a
        # word, and starting 1,024 local agents on a loaded machine took longer than that
        beating = asyncio.ensure_future(heartbeats(worker_steps))
        watching = None
        try:
            started = await asyncio.gather(*(ws.start(self._probe(ws.plan) if first else None) for ws in worker_steps),
                                           return_exceptions=True)
            if any(isinstance(outcome, BaseException) for outcome in started):
                await stop_all([ws for ws, outcome in zip(worker_steps, started) if outcome is None])
                endings.raise_first_error(started, self.plans, "start")
            watching = asyncio.ensure_future(self._watch_run(worker_steps)) if step == "run" and not detach else None
            return await self._supervise_step(step, worker_steps, first)
        finally:
            beating.cancel()
            if watching:
                watching.cancel()

    async def _watch_run(self, worker_steps: list[WorkerStep]) -> None:
        """While run goes on: the workers' stacks sampled for a straggler (`stragglers`), and the capacity."""
        sampling = self.job.stragglers_s and stragglers.watch(self.record, worker_steps, self.job.stragglers_s,
                                                              self.on_straggler)
        await asyncio.gather(self._watch_capacity(), *([sampling] if sampling else []))

    async def _watch_capacity(self) -> None:
        """The API read now and then (judgment.watch); the job stops once it shows the capacity gone."""
        if not self.target.capacity.departs:
            return
        from podrun.launch import judgment

        self._depart(await judgment.watch(self.target))

    async def _supervise_step(self, step: str, worker_steps: list[WorkerStep], first: bool) -> StepResult | None:
        if first:
            try:
                failure = await self._prepare(step, worker_steps)
            except BaseException:
                await stop_all(worker_steps)
                raise
            if failure or self.interrupted.is_set():
                await stop_all(worker_steps)
                if failure:
                    self._record_exit(failure)
                    endings.report_failure(self.plans, step, failure)
                return failure
        if first or worker_steps[0].watch:
            hub = await hub_address(worker_steps[0])
            for ws in worker_steps:
                ws.go(hub)
        say_phase(step, counted(len(worker_steps), self.target.worker_noun))
        phase = timeline.begin(self.record, step, [ws.plan.worker.index for ws in worker_steps])
        self.record.save()  # one save per step: `podrun report` on a running job sees its phases so far
        if step == "run" and not self.detach:  # a detached run's output goes to its workers' logs only
            for ws in worker_steps:
                ws.line_counter = timeline.line_counter()
        stop: dict | None = None
        if step == "run" and self.on_running:
            self.on_running()
        finishing: dict[asyncio.Future[StepResult], WorkerStep] = {
            asyncio.ensure_future(ws.finish()): ws for ws in worker_steps}
        interrupt = asyncio.ensure_future(self.interrupted.wait())
        departure = asyncio.ensure_future(self.departed.wait())
        stall_s = self.job.stall_s if step == "run" and not self.detach else None  # detached: agent.Hub watches
        by_steps = bool(self.job.progress)
        silence: asyncio.Future = asyncio.ensure_future(
            stall.silence(worker_steps, stall_s, self.record, by_steps) if stall_s else asyncio.Event().wait())
        failure = None
        self.failed_results, self.stopped_results = [], []  # the step's, in the order their exits came
        stopping = False
        countdown: asyncio.Future | None = None
        while finishing:
            watched: list[asyncio.Future] = [*finishing, interrupt, departure, silence]
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if silence in done and not stopping:
                self.falls.say()
                self.stalled = await stall.on_stall(self.record, silence.result(), worker_steps, by_steps)
                silence = asyncio.ensure_future(asyncio.Event().wait())
            for task in [task for task in finishing if task in done]:
                ended = finishing.pop(task)
                worker = ended.plan.worker
                result = task.result()
                self._record_exit(result)
                if result.stop_reason:  # podrun (or the job's end) stopped it: no cause of the failure
                    self.stopped_results.append(result)
                elif result.failed and not result.killed:
                    self.failed_results.append(result)
                if not result.detached:
                    timeline.end(stop or phase, result.index)
                if ended.line_counter is not None:
                    timeline.keep_lines(phase, worker.index, ended.line_counter)
                if result.killed:
                    say(f"worker {result.index} ({worker.address}) was killed after the grace "
                        f"period ({self.record.stop_grace_s:g}s): it had not ended on SIGTERM")
                elif result.failed and not stopping:
                    if failure is None and self.target.capacity.runs_out and not self.warned:
                        self.out_of_time = await asyncio.to_thread(self.target.capacity.ran_out)  # no worker's failure
                    failure = result
                    if not (self._judged(result) or self.preempted or self.warned or self.out_of_time):
                        endings.report_failure(self.plans, step, result)  # (a VM's notice: said already)
            if not finishing:
                self.record.save()
            else:
                self._save_now_and_then()
            if not stopping and (failure or self.interrupted.is_set() or self.departed.is_set() or self.stalled):
                stopping = True
                for ws in finishing.values():
                    ws.stop()
                    timeline.end(phase, ws.plan.worker.index)
                if finishing:
                    stop = timeline.begin(self.record, "stop", [ws.plan.worker.index for ws in finishing.values()])
                if stall_entry := timeline.current(self.record, "stall"):
                    timeline.end(stall_entry)
                if finishing:
                    countdown = asyncio.ensure_future(Countdown(self.record.stop_grace_s, self.terminal).run())
        if countdown:
            countdown.cancel()
            await asyncio.gather(countdown, return_exceptions=True)
        interrupt.cancel()
        departure.cancel()
        silence.cancel()
        self.falls.say()
        return failure

    def _save_now_and_then(self) -> None:
        """Save the record unless it was saved within record_save_interval (see RECORD_SAVE_SHARE)."""
        if time.monotonic() - self.record_saved_at > self.record_save_interval:
            saving = time.monotonic()
            self.record.save()
            self.record_saved_at = time.monotonic()
            self.record_save_interval = max(RECORD_SAVE_INTERVAL_S, (self.record_saved_at - saving) / RECORD_SAVE_SHARE)

    def _probe(self, plan: WorkerPlan) -> dict:
        """What the first step's agent reports before anything starts (agent.py, "probe")."""
        return {"code_dir": plan.code_dir, **self.target.probe(self.kill_stale), **preflight.interface_probe(self.plans)}

    async def _prepare(self, step: str, worker_steps: list[WorkerStep]) -> StepResult | None:
        """While the first step's agents wait: read their probes, ship the code to the workers without
        it, check the workers. Returns the failure of a worker whose agent ended before reporting."""
        if await self._until_interrupted(first_contact(worker_steps)) is None and self.interrupted.is_set():
            return None
        reports = await self._until_interrupted(
            asyncio.gather(*(self._probed(ws) for ws in worker_steps), return_exceptions=True))
        if reports is None:
            return None
        for ws, report in zip(worker_steps, reports):
            if not isinstance(report, dict):
                return await ws.finish()  # says why: the agent could not start, or the link broke
        workers = [ws.plan.worker for ws in worker_steps]
        self.target.check_probes(list(zip(workers, reports)), self.kill_stale)
        self.plans = preflight.with_interfaces_set(self.plans, reports)
        if self.tree is not None:
            for worker, report in zip(workers, reports):
                if report.get("changed_count"):
                    say(preflight.changed_code_line(worker.index, report["changed"].split("\n"), report["changed_count"]))
            missing = [worker for worker, report in zip(workers, reports) if not report["code"]]
            shipped_to = missing[:1] if self.target.shares_root else missing  # one home: the others see it there
            await self._ship(self.tree, shipped_to)
            if self.interrupted.is_set():
                return None
            if seeing := [plan for plan in self.plans if plan.worker in missing[1:] and self.target.shares_root]:
                await self._until_interrupted(preflight.check_shared_code(seeing, missing[0]))
        await self._check(step)
        return None

    async def _probed(self, ws: WorkerStep) -> dict | None:
        report = await ws.probed()
        timeline.end(self.connecting, ws.plan.worker.index)
        return report

    async def _check(self, step: str) -> None:
        """The checks the plan holds before `step`, in order (plan.CHECKS)."""
        for check in self.job.checks.get(step, ()):
            if self.interrupted.is_set():
                return
            if check == "docker":
                await self._until_interrupted(preflight.check_docker(self.plans))
            elif check == "torchrun":
                await self._until_interrupted(preflight.check_torchrun(self.plans))
            elif check == "health" and self.job.preflight:
                await self._until_interrupted(health.check(self.plans, self.job.preflight))
            elif check == "rendezvous":
                assert self.job.rendezvous_port is not None, "a rendezvous check comes with torchrun's port"
                await self._until_interrupted(
                    preflight.check_rendezvous([p.worker for p in self.plans], self.job.rendezvous_port))

    async def _ship(self, tree: scan.Tree, missing: list[Worker]) -> None:
        if missing:
            say_phase("ship", counted(len(missing), self.target.worker_noun))
        shipping_started = time.monotonic()
        shipping = timeline.begin(self.record, "ship", [worker.index for worker in missing]) if missing else None
        sent = await self._until_interrupted(archive.ship(tree, self.job.code_dir, missing))
        if shipping:
            timeline.end(shipping)
            shipping["bytes"] = sent or 0
        if self.interrupted.is_set():
            return
        say(f"shipped code ({counted(len(tree.files), 'file')}) to {counted(len(missing), 'worker')}: "
            f"{size_text(sent or 0)} sent "
            f"in {time.monotonic() - shipping_started:.1f}s" if missing else "code unchanged on every worker")

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
            self.record.finish(jobstore.STOPPED, exits.stopped_by(signum), "interrupted twice")
            sys.stdout.flush()
            raise SystemExit(exits.stopped_by(signum))
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
        worker.exit_code, worker.signal, worker.rank, worker.killed = result.code, result.signal, result.rank, result.killed
        worker.stop_reason = result.stop_reason  # a stop's: `podrun jobs` counts it stopped, whatever it exited with
        if result.agent_killed:
            self.agents_killed.add(result.index)
        if result.stop_reason == "SIGTERM" and self.target.capacity.warns_steps:
            self.warned = True

    async def _finish_failed(self, step: str, failure: StepResult) -> int:
        if self._judged(failure) and not (self.preempted or self.interrupted.is_set()):
            await self._judge_lost()
            if self.interrupted.is_set():
                return endings.interrupted(self.record, self.interrupt_signal)
            if not self.preempted:
                endings.report_failure(self.plans, step, failure)
        if self.preempted:
            return endings.preempted(self.record, self.preempted)
        if reason := self.out_of_time or await asyncio.to_thread(self.target.capacity.ran_out):
            return endings.out_of_time(self.record, reason)
        first = causes.told(self.record, self.failed_results or [failure], self.stopped_results)
        if first is not failure:  # its last lines, as the first failure's were said when it came
            endings.report_failure(self.plans, step, first)
        return endings.failed(self.record, step, first)

    def _on_step(self, index: int, step: int, at: float, event: dict) -> None:
        """A worker's agent reported a step it reached (the spec's progress): kept in the record, which is
        saved as often as the step's exits save it (`podrun jobs` shows the step)."""
        if progress.advance(self.record, self.worker_records[index], step, at, event):
            self._save_now_and_then()
        if "first" in event and (differ := progress.began(self.record, index, event["first"])):
            say(differ)

    def _on_notice(self, index: int, reason: str) -> None:
        """A worker's VM announced it goes away: its agent stopped its run already; the others stop too."""
        self._depart(f"worker {index}: {reason}")

    def _depart(self, reason: str) -> None:
        """The capacity goes away under a running job: it stops everywhere, to end preempted."""
        if not self.preempted:
            self.preempted = reason
            timeline.end(timeline.begin(self.record, "preempted", why=reason))
            say(f"{reason}: stopping the job on every worker")
            self.departed.set()

    def _judged(self, result: StepResult) -> bool:
        """Whether a failure is judged before it is reported: a worker lost where capacity can go away, or
        its agent killed there before it could report (a preempted VM's shutdown kills processes before
        its network goes: the connection, or a relay on that host, may still say so)."""
        return (result.code == exits.LOST or result.agent_killed) and self.target.capacity.departs

    async def _judge_lost(self) -> None:
        """Whether the workers lost went with the capacity (judgment.judge): `preempted` says why, if so."""
        from podrun.launch import judgment

        lost = {index: worker.endpoint for index, worker in self.worker_records.items()
                if worker.exit_code == exits.LOST or index in self.agents_killed}
        judging = timeline.begin(self.record, "judge", lost=sorted(lost))
        self.preempted = await self._until_interrupted(judgment.judge(self.target, lost, self.record.id))
        timeline.end(judging)
        if self.preempted:
            timeline.end(timeline.begin(self.record, "preempted", why=self.preempted))

