"""Reach a detached job again (`podrun logs`, `podrun stop`, and any running job's `podrun stacks`):
through its workers, from any terminal.

Each worker's agent keeps ~/.podrun/jobs/<JOB_ID>/output.log and writes run.exit when the run ends.
Fetching copies what the local log lacks (so it resumes where the local copy ends) and, once every
worker has its exit, records the job's end in the job store.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from collections.abc import Callable

from podrun import exits, file_limit, jobstore, notify, progress, timeline
from podrun.countdown import Countdown
from podrun.errors import PodrunError
from podrun.launch import causes, stacks, stall
from podrun.launch.steps import TAIL_LINES_KEPT, StepResult
from podrun.output import counted, say
from podrun.remote import vm_notice
from podrun.transport import past_login, transport_for
from podrun.transport.base import ChannelLost, Transport
from podrun.worker_output import WorkerOutput

# an agent's stop_reason when podrun stop (or a user) signalled it, and the signal's number (the same on
# Linux and macOS): a job stopped so exits 128 + N, as an attached job stopped by that signal does
STOP_SIGNALS = {"SIGTERM": 15, "SIGINT": 2, "SIGHUP": 1}
REFRESH_TIMEOUT_S = 10  # `podrun jobs` does not wait longer for a detached job's workers
AGENT_STOP_MARGIN_S = 15  # after the job's grace period: KILL, a container's removal, and some
STEP_SAVE_EVERY_S = 2.0  # a followed job's record is saved this often at most for the steps its workers reach
LOG_TAIL_BYTES = 256 * 1024  # of a failed worker's log, what its last lines are read from
_saved_at: dict[str, float] = {}  # when each followed job's record was last saved for them


def fetch(record: jobstore.JobRecord, indexes: list[int], outputs: dict[int, WorkerOutput] | None,
          follow: bool) -> None:
    """Bring the local logs of `indexes` up to date (showing new output through `outputs`, if given),
    following until the job ends when asked; records the end when every worker has one."""
    asyncio.run(_fetch_all(record, indexes, outputs, follow))


async def follow(record: jobstore.JobRecord, outputs: dict[int, WorkerOutput] | None, beat_every_s: float,
                 ran_out: Callable[[], str | None] | None = None) -> None:
    """Follow every worker's log until the job ends, recording its end (the supervisor's watch, which holds
    the target: its `ran_out` tells a Slurm time limit from a stop, as attached), showing new
    output through `outputs`, if given; `beat_every_s`: a supervisor host's follower on the first worker
    says it is there that often (0: never), which the job's hub hears (launch/kept.py)."""
    await _fetch_all(record, [w.index for w in record.workers], outputs, follow=True, beat_every_s=beat_every_s,
                     ran_out=ran_out)


def refresh(records: list[jobstore.JobRecord]) -> None:
    """Bring running detached jobs' records up to date from their workers (`podrun jobs`; those that
    nothing here watches: handles/on_workers.py): a job that ended meanwhile shows its true state and
    duration. A job whose workers cannot be reached stays as it was recorded."""
    async def refresh_one(record: jobstore.JobRecord) -> None:
        try:
            await asyncio.wait_for(_fetch_all(record, [w.index for w in record.workers], None, follow=False),
                                   REFRESH_TIMEOUT_S)
        except (PodrunError, asyncio.TimeoutError) as error:
            say(f"job {record.id}: shown as last recorded; its workers could not be asked "
                f"({str(error) or f'no answer within {REFRESH_TIMEOUT_S}s'})")
        except Exception as error:  # whatever one job's workers send, the listing of the others goes on
            say(f"job {record.id}: shown as last recorded; what its workers sent could not be read "
                f"({type(error).__name__}: {error})")

    asyncio.run(_gather(refresh_one(record) for record in records))


async def _gather(work) -> None:
    await asyncio.gather(*work)


def fetch_stacks(record: jobstore.JobRecord, indexes: list[int]) -> dict[int, str]:
    """The stacks of a running job's workers `indexes`, now (launch/stacks.py)."""
    async def fetch_all() -> list[dict[int, str]]:
        return await on_every_worker([w for w in record.workers if w.index in indexes],
                                     lambda worker, transport: stacks.collect(
                                         [(worker.index, transport, record.remote_job_dir(worker))]))

    return {index: text for texts in asyncio.run(fetch_all()) for index, text in texts.items()}


def stop(record: jobstore.JobRecord) -> None:
    """Stop every worker's run (saying how long the stop may take, counting down on a terminal) and record the end."""
    async def stop_counting_down() -> None:
        countdown = Countdown(record.stop_grace_s)
        drawing = asyncio.ensure_future(countdown.run())
        try:
            await stop_all(record, countdown.again if len(record.workers) > 1 else None)
        finally:
            drawing.cancel()
            await asyncio.gather(drawing, return_exceptions=True)

    asyncio.run(stop_counting_down())
    fetch(record, [w.index for w in record.workers], None, follow=False)


async def _fetch_all(record, indexes, outputs, follow, beat_every_s: float = 0, ran_out=None) -> None:
    workers = [w for w in record.workers if w.index in indexes]
    reports = await on_every_worker(workers, lambda worker, transport: _fetch(
        record, worker, transport, (outputs or {}).get(worker.index), follow,
        beat_every_s if worker is record.workers[0] else 0))
    ends: dict[int, float] = {}  # when each worker's run ended, as its agent says
    stalls = {worker.index: report.exit for worker, report in zip(workers, reports)
              if report.exit and report.exit.get("stalled") is not None}
    silent_s = {index: stall_exit["stalled"] for index, stall_exit in stalls.items()}
    # with progress (each exit has its step), the stall was judged by steps: its summary names them
    steps = {worker.index: report.exit["step"] for worker, report in zip(workers, reports)
             if report.exit and "step" in report.exit} or None
    # (worker, code) of the failures that stopped other workers (agent.Hub), as each worker in turn
    # names it: the first worker's agent, the hub that sees every other, first
    named_failures: list[tuple[int, int]] = []
    running = timeline.current(record, "run")
    _take_steps(record, workers, reports)
    for worker, report in zip(workers, reports):
        worker.output_at = report.output_at or worker.output_at
        if report.notified:  # worker 0's agent told the job's end (a detached job that nothing watches)
            notify.took(record, report.notified)
        if exit_record := report.exit:
            worker.exit_code, worker.signal = exit_record["code"], exit_record["signal"]
            worker.stop_reason, worker.rank = exit_record["stop_reason"], exit_record.get("rank")
            worker.killed = bool(exit_record.get("killed"))
            if exit_record.get("ended_at"):
                ends[worker.index] = exit_record["ended_at"]
            if running and exit_record.get("ended_at"):  # the launcher saw the run start, not its end
                timeline.end(running, worker.index, exit_record["ended_at"])
            if exit_record.get("cause_worker") is not None:
                named_failures.append((exit_record["cause_worker"], exit_record["cause_code"]))
    # a worker whose agent is gone (killed, its host lost) leaves no exit: the others name it. A job with no
    # worker yet (its supervisor was creating its TPU) has no end to tell: it is not `succeeded 0/0`
    if record.workers and all(w.exit_code is not None or w.index in dict(named_failures) for w in record.workers):
        if stalls and not timeline.current(record, "stall"):
            stall.add_stopped(record, stalls, steps)
        ended_badly = bool(named_failures) or any(w.exit_code or w.stop_reason for w in record.workers)
        over_time = await asyncio.to_thread(ran_out) if ran_out and ended_badly else None
        _record_end(record, named_failures, ends, silent_s, steps, over_time, stall.fallen_of(stalls))
        if silent_s:  # what each agent saved before the stall stopped it
            for line in stacks.saved_and_summed_up(record, {w.index: report.stacks for w, report in zip(workers, reports)}):
                say(line)
    else:
        record.save()


def _take_steps(record: jobstore.JobRecord, workers: list[jobstore.WorkerRecord], reports: list[WorkerReport]) -> None:
    """The steps the workers reached (the spec's progress): the latest each fetch sees, and once every
    worker's run ended, the attempt's steps over time from their samples, in place of what earlier
    fetches saw of them."""
    if len(workers) == len(record.workers) and all(report.exit for report in reports) \
            and any(report.samples for report in reports):
        record.steps = [entry for entry in record.steps if entry["attempt"] != record.attempt]
        for worker in workers:
            worker.step = worker.step_at = None
        samples = [(at, step, worker) for worker, report in zip(workers, reports)
                   for at, step in zip(report.samples[::2], report.samples[1::2])]
        for at, step, worker in sorted(samples, key=lambda sample: sample[:2]):
            progress.advance(record, worker, step, at)
    for worker, report in zip(workers, reports):
        if report.step:
            progress.advance(record, worker, report.step[0], report.step[1])
        if report.exit and report.exit.get("first_step") is not None:
            progress.began(record, worker.index, report.exit["first_step"])
        if report.exit and report.exit.get("epoch") is not None and (entry := progress.entry_of(record)):
            # an epoch group's count, as the run ended: what a later attempt's goes on from (progress.py)
            progress.take_epoch(entry, report.exit)


def _record_end(record: jobstore.JobRecord, named_failures: list[tuple[int, int]], ends: dict[int, float],
                silent_s: dict[int, float], steps: dict[int, int | None] | None = None,
                over_time: str | None = None, fallen: dict[int, tuple[str, str]] | None = None) -> None:
    """The job's outcome from its workers' exits: the worker that failed on its own (not stopped by
    podrun or because another worker failed) decides it, as in an attached job; else the worker lost
    that the first worker's agent named (its agent killed, its host or its link gone). A worker
    stopped by `podrun stop` that another worker's agent took for a failure is no cause: the job was
    stopped, even where every program, saving on SIGTERM, exited 0. `over_time`: why the target's
    time ran out (a Slurm time limit, whose SIGTERM reads as a stop), which then decides it. `ends`: when
    each worker's run ended; of the failures, the first by it that is no cascade is the cause (causes.py),
    from its local log's last lines."""
    ended_at = max(ends.values(), default=None)
    failed = sorted((StepResult(w.index, w.exit_code, w.signal, rank=w.rank)
                     for w in record.workers if w.exit_code and w.stop_reason is None),
                    key=lambda result: ends.get(result.index, float("inf")))
    stopped_by_signal = {w.index for w in record.workers if w.stop_reason in STOP_SIGNALS}
    lost = [(index, code) for index, code in named_failures if index not in stopped_by_signal]
    stopped = [w for w in record.workers if w.stop_reason is not None]  # whatever it exited with: 0 after a save
    noticed = [w for w in record.workers if vm_notice.announced(w.stop_reason)]
    if noticed:  # the VM's own notice stopped it (remote/vm_notice.py)
        record.finish(jobstore.PREEMPTED, exits.PREEMPTED, f"worker {noticed[0].index}: {noticed[0].stop_reason}",
                      ended_at)
    elif over_time:
        record.finish(jobstore.FAILED, exits.TIME_LIMIT, over_time, ended_at)
    elif failed:
        for result in failed:  # read only where a failure decides the end
            result.tail = _last_lines(record, result.index)
        cause, _, _ = causes.kept(record, failed)
        first = next(result for result in failed if result.index == cause.worker)
        record.finish(jobstore.FAILED, first.code, f"worker {first.index} {first.describe()}", ended_at)
    elif silent_s:  # worker 0's agent saw no output from any worker for the job's stall
        record.finish(jobstore.STALLED, exits.STALLED, stall.summary(silent_s, steps, fallen), ended_at)
    elif lost:
        index, code = lost[0]
        record.finish(jobstore.FAILED, code, f"worker {index} was lost (its agent, its host or the link to it)",
                      ended_at)
    elif stopped:
        by = next((w.stop_reason for w in stopped if w.stop_reason in STOP_SIGNALS), None)
        if by:
            record.finish(jobstore.STOPPED, exits.stopped_by(STOP_SIGNALS[by]), f"stopped by {by}", ended_at)
        else:  # its agents stopped it themselves (its supervisor away, its launcher gone): with SIGTERM, as podrun stop
            record.finish(jobstore.STOPPED, exits.stopped_by(STOP_SIGNALS["SIGTERM"]),
                          f"stopped ({stopped[0].stop_reason})", ended_at)
    else:
        record.finish(jobstore.SUCCEEDED, 0, None, ended_at)


def _last_lines(record: jobstore.JobRecord, index: int) -> list[str]:
    """The last lines of worker `index`'s local log (fetched in full by now), as an attached job's
    launcher keeps them of its output: what its failure is classified by."""
    try:
        with open(record.log_path(index), "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - LOG_TAIL_BYTES))
            end = log.read()
    except OSError:
        return []
    lines = WorkerOutput(index, None, None, keep=TAIL_LINES_KEPT)
    lines.feed(end)
    lines.close()
    return lines.tail()


class WorkerReport:
    """What log_follower tells of one worker besides its output: its run.exit (None while it runs),
    when its output last came (epoch seconds), what its agent told of the job's end (notify.json), and
    the stacks its agent saved on a stall.

    Its stderr may begin with what the host's login printed there (transport/past_login.py)."""

    def __init__(self, text: str, worker: jobstore.WorkerRecord):
        found = past_login.report_in(text, _report_fields)
        if found is not None:
            fields, self.stacks = found
            self.exit: dict | None = fields["exit"]
            self.output_at: float | None = fields["output_at"]
            step = fields.get("step")
            self.step: tuple[int, float] | None = (int(step[0]), float(step[1])) if step else None
            self.samples: list = fields.get("samples") or []
            self.notified: dict | None = fields.get("notified")
            return
        said = next((line.strip() for line in reversed(text.split("\n")) if line.strip()), "nothing")
        raise PodrunError(f"worker {worker.index} ({worker.address}): no report on the job's log came back; "
                          f"the worker said: {said[:200]}")


def _report_fields(line: str) -> dict | None:
    """log_follower's report line as its fields, or None for any other line."""
    try:
        fields = json.loads(line)
    except ValueError:
        return None
    if not (isinstance(fields, dict) and {"exit", "output_at"} <= fields.keys()):
        return None
    if not isinstance(fields["exit"], (dict, type(None))) or not isinstance(fields["output_at"], (int, float, type(None))):
        return None
    return fields


async def _fetch(record, worker, transport: Transport, output: WorkerOutput | None, follow: bool,
                 beat_every_s: float) -> WorkerReport:
    log_path = record.log_path(worker.index)
    offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    channel = await transport.start_python("log_follower", unlisted=[
        record.remote_job_dir(worker), str(offset), "1" if follow else "0", f"{beat_every_s:g}"])
    reading = asyncio.ensure_future(_report_read(record, worker, channel))
    with jobstore.open_log(log_path) as log:
        while chunk := await channel.stdout.read(65536):
            _append_at(log, offset, chunk)
            offset += len(chunk)
            worker.output_at = time.time()  # as the worker's output.log grew, within the follower's poll
            if output:
                output.feed(chunk)
    if output:
        output.close()
    report, _ = await asyncio.gather(reading, channel.wait())
    return WorkerReport(report, worker)


async def _report_read(record: jobstore.JobRecord, worker: jobstore.WorkerRecord, channel) -> str:
    """The follower's stderr: the steps it tells while it follows (kept in the record, saved now and then:
    `podrun jobs` shows a supervised job's step as it runs), then its report, returned."""
    report: list[str] = []
    reported = False  # the report's line came: what follows is the stacks a stall saved
    while line := (await channel.stderr.readline()).decode(errors="replace"):
        told = line.split()
        reported = reported or line.startswith('{"exit"')
        if not reported and len(told) == 3 and told[0] == "step":
            progress.advance(record, worker, int(told[1]), float(told[2]))
            if time.time() - _saved_at.get(record.id, 0.0) >= STEP_SAVE_EVERY_S:
                _saved_at[record.id] = time.time()
                record.save()
        else:
            report.append(line)
    return "".join(report)


def _append_at(log, offset: int, chunk: bytes) -> None:
    """Write the bytes the worker's log holds at `offset` onwards, but only those the local copy lacks:
    another podrun (a `logs -f` beside a `stop`) may be fetching the same log at the same time."""
    fcntl.flock(log, fcntl.LOCK_EX)
    try:
        already = os.fstat(log.fileno()).st_size - offset
        if already < len(chunk):
            log.write(chunk[max(already, 0):])
    finally:
        fcntl.flock(log, fcntl.LOCK_UN)


async def stop_all(record: jobstore.JobRecord, first_stopping: Callable[[], None] | None = None) -> None:
    """Stop every worker's run; the first worker's last, once the others' have ended: its agent is the
    hub that the others' agents watch (agent.Hub), and stopped first it would look lost to them.
    `first_stopping` is called as the first worker's stop begins."""
    others_ended = asyncio.Event()

    async def stop_others() -> None:
        try:
            await on_every_worker(record.workers[1:], stop_one)
        finally:
            others_ended.set()

    async def stop_one(worker, transport: Transport) -> None:
        if worker is record.workers[0]:
            await others_ended.wait()
            if first_stopping:
                first_stopping()
        wait_s = record.stop_grace_s + AGENT_STOP_MARGIN_S
        channel = await transport.start_python(
            "detached_stopper", unlisted=[record.remote_job_dir(worker), str(wait_s), record.id, str(worker.index)])
        notes, code = await asyncio.gather(channel.stderr.read(), channel.wait())
        for note in notes.decode(errors="replace").splitlines():  # a pid that was not the job's, and what it did
            say(f"worker {worker.index} ({worker.address}): {note}")
        if code != 0:
            raise PodrunError(f"worker {worker.index} ({worker.address}): the job did not stop within {wait_s:g}s")

    await asyncio.gather(stop_others(), on_every_worker(record.workers[:1], stop_one))


async def on_every_worker(workers, action) -> list:
    """Run action(worker, transport) on every worker at once, over one connection each."""
    # one command on each, and its log (`podrun logs`) or stacks open here
    file_limit.make_room(file_limit.needed([worker.endpoint["kind"] for worker in workers], processes=1, files=1),
                         counted(len(workers), "worker"))

    async def one(worker):
        transport = transport_for(worker.endpoint)
        try:
            await transport.connect()
            return await action(worker, transport)
        except ChannelLost as lost:
            worker.exit_code = exits.LOST  # as an attached job's worker whose connection dropped (spares: holding.py)
            raise PodrunError(f"worker {worker.index} ({worker.address}) lost its connection ({lost})") from None
        finally:
            await transport.close()

    return await asyncio.gather(*(one(worker) for worker in workers))

