"""A job's whole life on its target: its capacity acquired (holding.py: the TPU the spec declares
created, a Slurm allocation made), the job run, restarted as `restarts` says (after a preemption on
capacity made again, after a failure on the same workers, each attempt with PODRUN_ATTEMPT=k and logs
of its own), and the capacity given back (a Slurm allocation always, the TPU as `delete_after` says),
also after Ctrl-C.

An attached job lives in `podrun exec`. A detached one that restarts or deletes its TPU is watched by
a supervisor: `podrun exec` forks it once the first attempt runs, in a session of its own, with what
exec knew (the spec, the code scanned, the --env values); it follows the workers as `podrun logs -f`
does and does the rest. `podrun stop` sends it SIGTERM: it stops the job and cleans up as Ctrl-C does.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping

from podrun import exits, file_limit, interrupts, jobstore, paths, timeline
from podrun.cloud.settings import seconds
from podrun.collapse import Collapse
from podrun.errors import PodrunError, WorkersUnreachable
from podrun.launch import control_tree, judgment, restart_policy, stall
from podrun.launch.attempt_loop import AttemptLoop
from podrun.launch.holding import Holding
from podrun.launch.kept import Kept
from podrun.launch.launcher import HANDLED_SIGNALS, Launch
from podrun.notify import Notifier, secret_values
from podrun.output import counted, hidden, say, say_failure
from podrun.plan import JobPlan, job_plan, parse_worker_selection
from podrun.shipping import relay, scan
from podrun.spec.model import JobSpec
from podrun.targets.base import Target, Worker
from podrun.terminal import Terminal
from podrun.worker_output import WorkerOutput

SUPERVISOR_LOG = "supervisor.log"
# what a launch runs on each worker at once, at most: a step's agent, and while it waits for go, what
# ships the code or checks the worker (a stall's stacks, later); its log is open all along
STEP_PROCESSES = 2


class Lifecycle:
    def __init__(self, spec: JobSpec, target: Target, tree: scan.Tree | None, extra_env: Mapping[str, str],
                 kill_stale: bool, detach: bool, restarts: int, down: bool, collapse: bool = True, raw: bool = False,
                 kept: Kept | None = None):
        self.spec, self.target, self.tree = spec, target, tree
        self.kept = kept  # a supervisor host's job: how its supervisor keeps it (launch/kept.py)
        self.collapse = collapse  # identical lines of several workers shown once (collapse.py)
        self.raw = raw  # the workers' output shown as written, escape sequences and all (escapes.py)
        self.extra_env, self.kill_stale, self.detach = extra_env, kill_stale, detach
        self.max_restarts = restarts
        self.restart_on = spec.restart_on
        self.exit_codes = spec.restarts.exit_codes if spec.restarts else None  # None: failures of any code
        self.until_no_progress = spec.restarts.until_no_progress if spec.restarts else None
        self.code_dir = paths.remote_code_dir(spec.name, tree.digest) if tree else ""  # "": nothing ships
        self.workers: list[Worker] = []
        self.selected: set[int] = set()
        self.attempts = AttemptLoop()  # what runs them: a restart on the same workers starts on their connections
        # its capacity: made, made again, given back (exec --down: deleted whatever the end)
        self.holding = Holding(spec, target, "always" if down else spec.delete_after)
        self.on_running: Callable[[], None] | None = None
        # a secret the program prints is *** in what podrun says, records and notifies while the job runs
        self.secrets = secret_values(spec, extra_env, os.environ)
        self.notifier = Notifier(spec.notify)  # the spec's notify
        # podrun's settings read now: one it cannot use is one line before anything starts
        self.backoff_s = seconds(restart_policy.RESTART_BACKOFF, zero=True)
        control_tree.settings()
        stall.auto_settings()  # stall: auto's bounds, read again as the run starts
        relay.relay_fanout()
        if target.capacity.departs:
            judgment.settings()

    def plans(self, workers: list[Worker], selected: set[int], job_id: str, attempt: int) -> JobPlan:
        return job_plan(self.spec, self.target, workers, job_id, self.code_dir, self.extra_env, os.environ, attempt,
                        selected)

    def run(self, selection: str | None, stop_grace_s: float, job_id: str | None = None,
            on_running: Callable[[], None] | None = None) -> int:
        """Create the TPU if the spec declares it and it does not exist, run the job (on the workers
        `selection` picks: --worker) until it ends, restarting it as asked, then delete the TPU
        if asked. Detached, this returns once the first attempt runs, leaving a supervisor if needed.
        `job_id`: the id chosen beforehand (a supervisor host's); `on_running`: called once the first
        attempt's run has started everywhere."""
        self.on_running = on_running
        # a second interrupt cannot stop the cleanup
        with hidden(self.secrets), interrupts.interruptible_once(HANDLED_SIGNALS):
            return self._run(selection, stop_grace_s, job_id)

    def _run(self, selection: str | None, stop_grace_s: float, job_id: str | None) -> int:
        declared = self.spec.target.declared
        if count := declared.worker_count(self.spec.target.options):  # nothing is made for a job that cannot run
            self._make_room([declared.transport] * len(parse_worker_selection(selection, count)))
        job_id = job_id or jobstore.new_job_id(self.spec.name)
        with self.holding.claimed(job_id):
            return self._run_as(selection, stop_grace_s, job_id)

    def _run_as(self, selection: str | None, stop_grace_s: float, job_id: str) -> int:
        record: jobstore.JobRecord | None = None
        try:
            self.workers = self.holding.acquire(stop_grace_s, self.detach)
            self.selected = parse_worker_selection(selection, len(self.workers))
            job = self.plans(self.workers, self.selected, job_id, attempt=0)  # a bad plan starts no job
            self._make_room([plan.worker.transport.endpoint()["kind"] for plan in job.workers])
            record = self._new_record(job_id, stop_grace_s)
            self.holding.record_acquired(record, self.workers)
            gc.freeze()  # what start-up made (cli._exec turned the collector off for it) is never collected
            gc.enable()
            code = self._attempt(record, job)
            if self.detach:
                return self._left_detached(record, code)
            return self._restart_while_due(record, code)
        except KeyboardInterrupt:
            if record and record.state == jobstore.RUNNING:  # between attempts: restarting
                record.finish(jobstore.STOPPED, exits.INTERRUPTED, "interrupted while restarting")
            raise
        finally:
            self.attempts.close()
            if not (self.detach and record and record.state == jobstore.RUNNING):
                failure = sys.exc_info()[1]
                self._ended(record, failure, lambda: self.holding.give_back_after(record, failure))

    def _ended(self, record: jobstore.JobRecord | None, error: BaseException | None,
               give_back: Callable[[], None]) -> None:
        """The job's end told (notify.py) while what it held is given back, then the deliveries waited for."""
        if record:
            self.notifier.ended(record, error)
        try:
            give_back()
        finally:
            if record:
                self.notifier.close(record)

    def _make_room(self, kinds: list[str]) -> None:
        """Open files for a launch on workers of these transport kinds, before it connects (file_limit.py)."""
        file_limit.make_room(file_limit.needed(kinds, processes=STEP_PROCESSES, files=1),
                             counted(len(kinds), self.target.worker_noun))

    def _new_record(self, job_id: str, stop_grace_s: float) -> jobstore.JobRecord:
        spec, workers = self.spec, self.workers
        record = jobstore.JobRecord(
            id=job_id, name=spec.name, target=self.target.record_label(workers),
            spec_path=str(spec.path), workers=self._worker_records(), stop_grace_s=stop_grace_s,
            shared_root=self.target.shares_root, price=self._price(),
            total_steps=spec.progress.total if spec.progress else None)
        record.create()
        say(f"job {record.id}: {counted(len(self.selected), self.target.worker_noun)}; logs in {record.dir}")
        return record

    def _price(self) -> dict:
        """The spec's cost.per_hour, else the target's price table's (cloud/prices.py), else why none."""
        if self.spec.cost:
            return {"per_hour": self.spec.cost.per_hour, "source": "spec cost.per_hour"}
        return self.target.price()

    def _worker_records(self) -> list[jobstore.WorkerRecord]:
        return [jobstore.WorkerRecord(w.index, w.address, endpoint=w.transport.endpoint())
                for w in self.workers if w.index in self.selected]

    def _left_detached(self, record: jobstore.JobRecord, code: int) -> int:
        """A detached exec's end: once an attempt runs, its supervisor (if it needs one) takes over. An attempt that
        could not start everywhere (a host unreachable, a spare to take its place) is followed by the next one here,
        never by watching the job in the foreground."""
        while record.state != jobstore.RUNNING and self._restart_due(record):
            self._next_attempt(record)
            code = self._attempt(record, self.plans(self.workers, self.selected, record.id, record.attempt))
        if record.state == jobstore.RUNNING and self._needs_supervisor():
            self._fork_supervisor(record)
        return code

    def _restart_while_due(self, record: jobstore.JobRecord, code: int) -> int:
        while self._restart_due(record):
            self._next_attempt(record)
            code = self._attempt(record, self.plans(self.workers, self.selected, record.id, record.attempt))
            if self.detach:
                code = self._watch(record)
            if hint := restart_policy.resumed_apart(record):
                say(hint)
        return code

    def _attempt(self, record: jobstore.JobRecord, job: JobPlan) -> int:
        """An attempt's launch. Workers it could not reach end it as failed, not the job, where spares can take
        their place and a restart on failure is left (the next attempt leaves them out: holding.replace_lost)."""
        try:
            return self._launch(record, job)
        except WorkersUnreachable as error:
            if not (self.holding.capacity.spares_left and "failure" in self.restart_on
                    and record.attempt < self.max_restarts):
                raise
            say_failure(str(error))
            return error.exit_code

    def _launch(self, record: jobstore.JobRecord, job: JobPlan) -> int:
        try:
            terminal = self._terminal([plan.worker.index for plan in job.workers])
            if reach := control_tree.described(job):
                say(f"reaching the workers{reach}")
            job = control_tree.arrange(job)
            launch = Launch(self.target, job, self.tree, record, terminal, self.detach, self.kill_stale,
                            self._running_once, self._workers_notify(record), self._away(),
                            functools.partial(self.notifier.straggling, record))
            return self.attempts.run(launch.run(), [plan.worker.transport for plan in job.workers])
        finally:  # the event loop leaves the signals at their defaults when it removes its handlers
            interrupts.rearm(HANDLED_SIGNALS)
            if self.detach:  # this launcher leaves the workers to themselves (or its supervisor, forked next)
                self.attempts.close()

    def _terminal(self, indexes: list[int]) -> Terminal:
        return Terminal(worker_count=len(self.workers), collapse=Collapse(indexes) if self.collapse else None, raw=self.raw)

    def _away(self) -> dict | None:
        """A supervisor host's run: how long its workers wait for an absent supervisor, then what worker 0 deletes."""
        if not (self.kept and self.detach):
            return None
        return {"away_s": self.kept.away_s, "delete": self.holding.self_delete_config()}

    def _workers_notify(self, record: jobstore.JobRecord) -> dict | None:
        """A detached job that nothing here will watch: its worker 0's agent tells its end (remote/agent.py)."""
        return self.notifier.for_workers(record) if self.detach and not self._needs_supervisor() else None

    def _running_once(self) -> None:
        if self.on_running:
            self.on_running()
            self.on_running = None

    def _restart_due(self, record: jobstore.JobRecord) -> bool:
        cause = restart_policy.cause(record.state, record.exit_code, record.summary)
        found = record.cause or {}
        klass = found.get("class") if cause == "failure" else None
        if cause is None or (cause not in self.restart_on and klass not in self.restart_on):
            return False
        if klass == "config" and "config" not in self.restart_on:
            say(f"no restart: worker {found['worker']} failed on a configuration error ({found['text']}), which fails "
                f"the same way every time; `restarts.on: [config]` restarts it anyway")
            return False
        if cause == "time_limit":  # a continuation: restarts.max counts failures
            return not self._no_progress(record)
        if cause == "failure" and self.exit_codes and record.exit_code not in self.exit_codes:
            say(f"no restart: exit code {record.exit_code} is not one of restarts.exit_codes "
                f"({', '.join(map(str, self.exit_codes))})")
            return False
        if self._restarts_used(record) >= self.max_restarts:
            if self.max_restarts:
                say(f"no restart left ({self.max_restarts} of {self.max_restarts} used)")
            return False
        if self._no_progress(record):
            return False
        # until_no_progress, given, alone judges restarts that get nowhere: the quick-failure rule is for specs without it
        if (cause != "preemption" and not self.until_no_progress
                and (quick := restart_policy.quick_failures(record)) >= restart_policy.QUICK_FAILURES):
            say(f"no restart: the last {quick} attempts each ended within {restart_policy.QUICK_FAILURE_S:g}s of "
                f"starting; a restart would most likely fail the same way")
            return False
        return True

    def _no_progress(self, record: jobstore.JobRecord) -> bool:
        """Whether restarts.until_no_progress says no more restarts (saying so)."""
        if self.until_no_progress and (stuck := restart_policy.no_progress(record, self.until_no_progress)):
            say(stuck)
            return True
        return False

    def _restarts_used(self, record: jobstore.JobRecord) -> int:
        """The restarts that count against restarts.max: all but continuations past a time limit."""
        return record.attempt - restart_policy.continuations(record)

    def _next_attempt(self, record: jobstore.JobRecord) -> None:
        cause, why = restart_policy.cause(record.state, record.exit_code, record.summary), record.summary
        preempted = cause == "preemption"
        self.holding.reacquiring = preempted  # before anything is said: an interrupt from here on deletes the old TPU
        record.restart()
        swaps = [] if cause in ("preemption", "time_limit") else self.holding.replace_lost(record)
        if preempted or cause == "time_limit" or swaps:  # workers made again or swapped: their connections go
            self.attempts.close([worker.transport for worker in self.workers])
        else:  # a worker lost in the attempt is connected again, whatever its connection seems to be
            lost = {worker.index for worker in record.workers if worker.exit_code == exits.LOST}
            self.attempts.close([worker.transport for worker in self.workers if worker.index in lost])
        self.notifier.restarting(record, swaps)
        if preempted:
            say(f"restart {self._restarts_used(record)} of {self.max_restarts}: creating the TPU again ({why})")
            self.workers = self.holding.reacquire(record, why)
            self.holding.watch_idle(self.workers)
        elif cause == "time_limit":
            say(f"attempt {record.attempt}: continuing on a new allocation ({why}; a continuation, which "
                f"restarts.max does not count)")
            self.workers = self.holding.reacquire(record, why)
            record.target = self.target.record_label(self.workers)  # the new allocation's job id
        else:
            if swaps:
                self.workers = self.target.workers(dry_run=False)
                record.target = self.target.record_label(self.workers)  # a new allocation's job id, where one was made
            delay = restart_policy.backoff_s(record, self.backoff_s)
            on = ("on a new allocation" if self.holding.reallocated else "with the spares in place") if swaps \
                else "on the same workers"
            say(f"restart {self._restarts_used(record)} of {self.max_restarts} in {delay:g}s: running again {on} ({why})")
            timeline.add(record, "restart", time.time(), time.time() + delay, why=why)
            time.sleep(delay)
        record.workers = self._worker_records()
        record.save()

    # --- detached jobs: the supervisor ------------------------------------------------------------
    def _needs_supervisor(self) -> bool:
        return bool(self.kept) or bool(self.max_restarts) or self.holding.gives_back

    def _fork_supervisor(self, record: jobstore.JobRecord) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            self._supervised_by(record, pid)
            duties = self._duties()
            log = os.path.join(record.dir, "console", "stderr") if self.kept else os.path.join(record.dir, SUPERVISOR_LOG)
            say(f"a supervisor (pid {pid}) watches it{f' and {duties}' if duties else ''}; its log: {log}")
            return
        os._exit(self._supervise(record))

    def _supervised_by(self, record: jobstore.JobRecord, pid: int) -> None:
        record.supervisor = jobstore.process_identity(pid)
        record.cleanup = self.holding.cleanup_command()
        record.save()

    def _duties(self) -> str:
        duties = []
        if self.max_restarts:
            duties.append(f"restarts it (at most {self.max_restarts} times, on {' or '.join(self.restart_on)})")
        duties += self.holding.duties()
        return " and ".join(duties)

    def _supervise(self, record: jobstore.JobRecord, resume: Callable[[], int] | None = None) -> int:
        """The supervisor's life, in the forked child: watch, restart, clean up; its exit code is the job's.
        `resume`: what a supervisor host's supervisor, started again, does first in place of the watch."""
        if os.getsid(0) != os.getpid():  # one adopted again leads its session already (supervisor/adopt.py)
            os.setsid()
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        if self.kept:  # what it says goes on into the job's console files (supervisor/daemon.py)
            self.kept.hold(record)
        else:
            log = os.open(os.path.join(record.dir, SUPERVISOR_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
        self._supervised_by(record, os.getpid())  # the same as its launcher saved: a supervisor adopted again is new
        with hidden(self.secrets), interrupts.interruptible_once(HANDLED_SIGNALS):
            try:
                try:
                    return self._restart_while_due(record, (resume or (lambda: self._watch(record)))())
                except KeyboardInterrupt:
                    taken = interrupts.taken() or signal.SIGTERM
                    say(f"{signal.Signals(taken).name}: stopping the job on every worker")
                    from podrun.launch import detached

                    detached.stop(record)
                    code = exits.INTERRUPTED if taken == signal.SIGINT else exits.stopped_by(taken)
                    if record.state == jobstore.STOPPED:  # by this signal, whatever the workers' programs exited with
                        record.finish(jobstore.STOPPED, code, f"stopped by {signal.Signals(taken).name}", record.ended_at)
                    return code
            except PodrunError as error:
                say_failure(str(error))
                record.finish(jobstore.FAILED, error.exit_code, str(error))
                return error.exit_code
            except Exception as error:  # a bug: the record says so, the log keeps the traceback
                traceback.print_exc()
                record.finish(jobstore.FAILED, exits.INTERNAL_ERROR, f"supervisor: internal error: {error!r}")
                return exits.INTERNAL_ERROR
            finally:
                self._ended(record, None, lambda: self.holding.give_back(record))
                if self.kept:
                    self.kept.done(record)
                sys.stdout.flush()

    async def _warn_before_time_limit(self, record: jobstore.JobRecord, warned: asyncio.Event) -> None:
        """A detached job on capacity that warns its steps before its time limit (restarts.on: [time_limit]):
        its agents have left the step, so its supervisor stops the job that long ahead itself, each rank
        getting SIGTERM from its agent, and the job's end reads as the time limit (ran_out)."""
        from podrun.launch import detached

        capacity = self.target.capacity
        if (due_s := await asyncio.to_thread(capacity.warning_due_s)) is None:
            await asyncio.Event().wait()  # never done
            return
        await asyncio.sleep(due_s)
        warned.set()
        say(f"{record.stop_grace_s:g}s (stop_grace) before {capacity.held}'s time limit: stopping the job on every "
            f"worker to save (restarts.on: [time_limit])")
        await asyncio.gather(detached.stop_all(record), return_exceptions=True)  # its end: the watch's

    def _watch(self, record: jobstore.JobRecord) -> int:
        """Follow a detached attempt to its end, as `podrun logs -f` does, watching its capacity as an
        attached exec does (launch/judgment.py): the API read while it runs, a lost worker judged."""
        asyncio.run(self._follow(record))
        say(record.outcome())
        return record.exit_code if record.exit_code is not None else exits.LOST

    async def _follow(self, record: jobstore.JobRecord) -> None:
        from podrun.launch import detached

        outputs = None
        if self.kept and self.kept.shows_output:  # to the laptop that waits for the job (supervisor/daemon.py)
            terminal = self._terminal([w.index for w in record.workers])
            outputs = {w.index: WorkerOutput(w.index, terminal, log=None) for w in record.workers}
        capacity, warned = self.target.capacity, asyncio.Event()
        warning = asyncio.ensure_future(self._warn_before_time_limit(record, warned))
        following = asyncio.ensure_future(detached.follow(record, outputs, self.kept.beat_every_s if self.kept else 0,
                                                          lambda: capacity.ran_out(warned.is_set())))
        watching: asyncio.Future[str] = (asyncio.ensure_future(judgment.watch(self.target)) if self.target.capacity.departs
                                         else asyncio.get_running_loop().create_future())  # never done
        either: list[asyncio.Future] = [following, watching]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not warning.done():
            warning.cancel()
        if watching.done():  # the API shows the TPU gone while the workers still answer
            reason = watching.result()
            say(f"{reason}: stopping the job on every worker")
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
            await asyncio.gather(detached.stop_all(record), return_exceptions=True)  # gone with their VMs: fine
            record.finish(jobstore.PREEMPTED, exits.PREEMPTED, reason)
            return
        watching.cancel()
        lost_why = None  # recorded only once judged: a preemption never reads `failed` in between
        try:
            following.result()
        except PodrunError as error:
            lost_why = str(error)
        if lost_why is None and record.state == jobstore.RUNNING:  # a log ended without its exit: unfollowable
            lost_why = "a worker's agent ended without recording an exit"
        # a Slurm time limit ends the steps that follow the workers' logs too: said as attached
        if lost_why and (over_time := await asyncio.to_thread(self.target.capacity.ran_out)):
            record.finish(jobstore.FAILED, exits.TIME_LIMIT, over_time)
            return
        departed = record.state == jobstore.FAILED and record.exit_code == exits.LOST
        if self.target.capacity.departs and (lost_why or departed):
            lost = {w.index: w.endpoint for w in record.workers if w.exit_code in (None, exits.LOST)}
            if judged := await judgment.judge(self.target, lost, record.id):
                record.finish(jobstore.PREEMPTED, exits.PREEMPTED, judged)
                return
        if lost_why:
            record.finish(jobstore.FAILED, exits.LOST, lost_why)
