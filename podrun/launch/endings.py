"""How a launch ends, recorded and said once: the job record's end state with the terminal's line for
each ending (succeeded, failed, preempted, stalled, stopped, detached), a failed worker with its last
lines, and the workers' errors (a connect or start that failed) raised as one PodrunError."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from podrun import exits, jobstore
from podrun.errors import PodrunError, WorkersUnreachable
from podrun.launch.steps import StepResult
from podrun.output import counted, say, say_failure, say_success, worker_ranges
from podrun.plan import WorkerPlan
from podrun.targets.base import Worker
from podrun.transport.base import ChannelLost

SHOWN_TAIL_LINES = 20
DEFAULT_SCREEN_ROWS = 24
MIN_ERROR_ROWS = 5  # a failure names at least this many workers, however small the terminal


def succeeded(record: jobstore.JobRecord) -> int:
    record.finish(jobstore.SUCCEEDED, 0)
    took_s = time.time() - record.started_at
    say_success(f"job {record.id} succeeded " + (
        f"after {counted(record.attempt, 'restart')}, {took_s:.1f}s in all" if record.attempt
        else f"in {took_s:.1f}s"))
    return 0


def failed(record: jobstore.JobRecord, step: str, failure: StepResult) -> int:
    summary = f"worker {failure.index} {failure.describe()} in {step}"
    if cause := failure.cause():
        summary += f" ({cause})"
    record.finish(jobstore.FAILED, failure.code, summary)
    say_failure(f"job {record.id} failed: {summary}; every other worker was stopped")
    return failure.code


def preempted(record: jobstore.JobRecord, reason: str) -> int:
    record.finish(jobstore.PREEMPTED, exits.PREEMPTED, reason)
    say_failure(f"job {record.id} preempted: {reason}")
    return exits.PREEMPTED


def stalled(record: jobstore.JobRecord, why: str) -> int:
    record.finish(jobstore.STALLED, exits.STALLED, why)
    say_failure(f"job {record.id} stalled: {why}; every worker was stopped")
    return exits.STALLED


def out_of_time(record: jobstore.JobRecord, reason: str) -> int:
    record.finish(jobstore.FAILED, exits.TIME_LIMIT, reason)
    say_failure(f"job {record.id} ran out of time: {reason}")
    return exits.TIME_LIMIT


def detached(record: jobstore.JobRecord) -> int:
    record.detached = True
    record.save()
    job_id = record.id
    say(f"job {job_id} runs on every worker without podrun; follow it with `podrun logs -f {job_id}`, "
        f"stop it with `podrun stop {job_id}`")
    return 0


def interrupted(record: jobstore.JobRecord, signum: signal.Signals) -> int:
    code = exits.stopped_by(signum)
    record.finish(jobstore.STOPPED, code, f"stopped by {signum.name}")
    say(f"job {record.id} stopped on every worker")
    return code


def report_failure(plans: list[WorkerPlan], step: str, result: StepResult) -> None:
    """The failed worker, what it ended with, and its last lines."""
    plan = next(p for p in plans if p.worker.index == result.index)
    lines = [f"worker {result.index} ({plan.worker.address}) {result.describe()} in {step}"]
    if tail := result.shown_tail():
        whose = f"worker {result.index}" if result.rank is None else f"rank {result.rank}"
        lines.append(f"last lines of {whose}:")
        lines += [f"  {line}" for line in tail[-SHOWN_TAIL_LINES:]]
    say("\n".join(lines))


def raise_first_error(outcomes: list | None, plans: list[WorkerPlan], doing: str) -> None:
    """Raise the workers' errors as one PodrunError: one line for one worker; for several, one line
    each, up to a screenful, then the rest by index. Anything else than a PodrunError (a connection
    lost mid-start, a library's own exception) is named with its worker."""
    failed = [(plan.worker, outcome) for plan, outcome in zip(plans, outcomes or ())
              if isinstance(outcome, BaseException)]
    if not failed:
        return
    for _, error in failed:
        if isinstance(error, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
            raise error
    alike = {error.alike if isinstance(error, PodrunError) else None for _, error in failed}
    if len({str(error) for _, error in failed}) == 1:  # one error for all (a jump host they share): said once
        raised = PodrunError(_worker_error(*failed[0]))
    elif len(alike) == 1 and None not in alike:  # a cause none of the hosts' own (an account refused): said once
        raised = PodrunError(f"{len(failed)} of {counted(len(plans), 'worker')} "
                             f"({worker_ranges([worker.index for worker, _ in failed])}) failed to {doing}: "
                             f"{alike.pop()}")
    else:
        room = _screen_rows() - 2  # the heading, and the line that counts the rest
        shown = failed if len(failed) <= room + 1 else failed[:room]
        lines = [f"{len(failed)} of {counted(len(plans), 'worker')} failed to {doing}:"]
        lines += [f"  {_worker_error(worker, error)}" for worker, error in shown]
        if rest := [worker.index for worker, _ in failed[len(shown):]]:
            lines.append(f"  and {len(rest)} more: {worker_ranges(rest)}")
        raised = PodrunError("\n".join(lines))
    if doing == "connect":  # who could not be reached: a spare may take their place (launch/holding.py)
        raised = WorkersUnreachable(str(raised), [worker.index for worker, _ in failed])
    first_error = failed[0][1]
    if isinstance(first_error, PodrunError):  # an unusable PODRUN_HOME stays a usage error (exit 2)
        raised.exit_code = first_error.exit_code
    raise raised


def _worker_error(worker: Worker, error: BaseException) -> str:
    if isinstance(error, PodrunError):
        return str(error)
    if isinstance(error, ChannelLost):
        return f"worker {worker.index} ({worker.address}) lost its connection ({error})"
    return f"worker {worker.index} ({worker.address}): {type(error).__name__}: {error}"


def _screen_rows() -> int:
    """The rows of the terminal podrun's messages show on; a pipe's reader gets as many as a default terminal."""
    try:
        rows = os.get_terminal_size(sys.stderr.fileno()).lines
    except (OSError, ValueError):
        rows = DEFAULT_SCREEN_ROWS
    return max(rows - 2, MIN_ERROR_ROWS)  # the shell's prompt, and the line before the error, stay on screen
