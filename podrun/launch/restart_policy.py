"""When a failed or stalled job is run again: with backoff, and not at all once it keeps failing at
once (xpk's rule of restarting only chosen exit codes, restarts.exit_codes, is the lifecycle's).

Before restart k after failures (or stalls) in a row, podrun waits PODRUN_RESTART_BACKOFF seconds (1)
times 2^(k-1), at most BACKOFF_MAX_S. An attempt that ended within QUICK_FAILURE_S of its start
failed "at once"; after QUICK_FAILURES such attempts in a row the job is not restarted again: a bug
or a bad input fails every attempt the same way, and the budget would only burn. A preemption is
no failure of the job's: it neither counts nor waits (creating the TPU again is wait enough), and nor
does a Slurm allocation's time limit (restarts.on: [time_limit]): its next attempt is a continuation on a
new allocation, which restarts.max does not count (as SkyPilot's and JobSet's maintenance events do not).

With restarts.until_no_progress: N (and the spec's progress), the job is not restarted again once N
attempts in a row never got past the best step reached before them, whatever ended them: an attempt
that dies at the same step each time (a bad batch, a checkpoint it cannot get past) only burns the
budget, and so does one preempted before it ever gets further.
"""

from __future__ import annotations

import re

from podrun import exits, jobstore, progress

RESTART_BACKOFF = ("PODRUN_RESTART_BACKOFF", 1.0)
BACKOFF_MAX_S = 300.0
QUICK_FAILURE_S = 60.0
QUICK_FAILURES = 3
FAILED_STATES = (jobstore.FAILED, jobstore.STALLED)
# what a rank says when a peer went away under a collective: gloo's "Connection closed by peer", a
# socket's "Connection reset by peer" or "Broken pipe", NCCL's "remote process exited"
PEER_GONE = re.compile(r"(closed|reset) by peer|broken pipe|remote process exited", re.IGNORECASE)


CAUSE_OF_STATE = {jobstore.PREEMPTED: "preemption", jobstore.FAILED: "failure", jobstore.STALLED: "stall"}


def cause(state: str, exit_code: int | None, summary: str | None) -> str | None:
    """What ended an attempt, as restarts.on names it (preemption, failure, stall, time_limit); None: nothing
    that restarts it (it succeeded, or was stopped). A time limit is podrun's exit 125 with the capacity's
    words (ran_out), not a worker's own 125 ("worker 1 exited with code 125 ...")."""
    if state == jobstore.FAILED and exit_code == exits.TIME_LIMIT and summary and "time limit" in summary \
            and not summary.startswith("worker "):
        return "time_limit"
    return CAUSE_OF_STATE.get(state)


def continuations(record: jobstore.JobRecord) -> int:
    """How many of the job's restarts so far were continuations past a time limit (not counted in max)."""
    return sum(cause(attempt["state"], attempt["exit_code"], attempt["summary"]) == "time_limit"
               for attempt in record.attempts)


def _attempts(record: jobstore.JobRecord) -> list[tuple[str, float]]:
    """(state, seconds it ran) of every attempt so far, the one that just ended last; one that reached a time
    limit as `time_limit`, no failure."""
    ended = [(_state(attempt["state"], attempt["exit_code"], attempt["summary"]),
              (attempt["ended_at"] or 0) - attempt["started_at"]) for attempt in record.attempts]
    return [*ended, (_state(record.state, record.exit_code, record.summary),
                     (record.ended_at or 0) - record.attempt_started_at())]


def _state(state: str, exit_code: int | None, summary: str | None) -> str:
    return "time_limit" if cause(state, exit_code, summary) == "time_limit" else state


def _trailing(attempts: list[tuple[str, float]], counts) -> int:
    streak = 0
    for state, ran_s in reversed(attempts):
        if not counts(state, ran_s):
            break
        streak += 1
    return streak


def quick_failures(record: jobstore.JobRecord) -> int:
    """How many attempts in a row, ending with the last, failed within QUICK_FAILURE_S of starting."""
    return _trailing(_attempts(record), lambda state, ran_s: state in FAILED_STATES and ran_s < QUICK_FAILURE_S)


def no_progress(record: jobstore.JobRecord, limit: int) -> str | None:
    """The line that says why the job is not restarted, once the last `limit` attempts (the one that just
    ended last) never got past the best step reached before them (one that reached no step never did);
    else None."""
    if record.attempt + 1 < limit:
        return None
    streak = range(record.attempt + 1 - limit, record.attempt + 1)
    best = progress.best_before(record, streak[0])
    died_at = [entry["last"] if (entry := progress.entry_of(record, attempt)) else None for attempt in streak]
    if any(step is not None and (best is None or step > best) for step in died_at):
        return None
    if best is None:
        return f"no restart: none of the last {limit} attempts reached a step (the spec's progress)"
    places = [f"at step {step}" if step is not None else "before any step" for step in died_at]
    died = f"each died {places[0]}" if len(set(places)) == 1 else \
        f"they died {', '.join(places[:-1])} and {places[-1]}"
    return f"no restart: the last {limit} attempts never got past step {best}, the best before them ({died})"


def resumed_apart(record: jobstore.JobRecord) -> str | None:
    """After a restarted attempt failed: a hint, when the workers probably did not resume from the same
    point; else None. The sign: one worker was done (exit 0) while another still failed, or a rank failed
    because its peer went away (PEER_GONE). In a job whose ranks step together neither happens unless
    some ranks ran out of work first: on a restart, most often because a checkpoint saved by rank 0 on
    its own disk resumed worker 0 while the others started over."""
    if not record.attempt or cause(record.state, record.exit_code, record.summary) != "failure":
        return None
    done = [worker.index for worker in record.workers if worker.exit_code == 0]
    if done:
        sign = f"worker {done[0]} was done while another failed"
    elif peer_gone := PEER_GONE.search(record.summary or ""):
        sign = f"a rank lost its peer ({peer_gone[0]})"
    else:
        return None
    return (f"attempt {record.attempt} (a restart) failed as workers do that resumed from different points: {sign}. "
            f"A checkpoint saved on one worker's disk only (by rank 0, say) resumes that worker where it stopped "
            f"while the others start over, and the first to finish leaves the others waiting. Save checkpoints "
            f"where every worker reads them (a shared file system, a bucket), or on every worker "
            f"(docs/targets/tpu.md: Restarts and per-worker disks)")


def backoff_s(record: jobstore.JobRecord, first_s: float) -> float:
    """How long to wait before running again the attempt that was just closed (record.restart()):
    `first_s` (RESTART_BACKOFF's value) after one failure, doubled for each more in a row."""
    failures = _trailing([(_state(a["state"], a["exit_code"], a["summary"]), 0.0) for a in record.attempts],
                         lambda state, _: state in FAILED_STATES)
    return min(first_s * 2 ** max(failures - 1, 0), BACKOFF_MAX_S)
