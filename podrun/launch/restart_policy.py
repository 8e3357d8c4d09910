"""When a failed or stalled job is run again: with backoff, and not at all once it keeps failing at
once (xpk's rule of restarting only chosen exit codes, restarts.exit_codes, is the lifecycle's).

Before restart k after failures (or stalls) in a row, podrun waits PODRUN_RESTART_BACKOFF seconds (1)
times 2^(k-1), at most BACKOFF_MAX_S. An attempt that ended within QUICK_FAILURE_S of its start
failed "at once"; after QUICK_FAILURES such attempts in a row the job is not restarted again: a bug
or a bad input fails every attempt the same way, and the budget would only burn. A preemption is
no failure of the job's: it neither counts nor waits (creating the TPU again is wait enough).
"""

from __future__ import annotations

from podrun import jobstore

RESTART_BACKOFF = ("PODRUN_RESTART_BACKOFF", 1.0)
BACKOFF_MAX_S = 300.0
QUICK_FAILURE_S = 60.0
QUICK_FAILURES = 3
FAILED_STATES = (jobstore.FAILED, jobstore.STALLED)


def _attempts(record: jobstore.JobRecord) -> list[tuple[str, float]]:
    """(state, seconds it ran) of every attempt so far, the one that just ended last."""
    ended = [(attempt["state"], (attempt["ended_at"] or 0) - attempt["started_at"]) for attempt in record.attempts]
    return [*ended, (record.state, (record.ended_at or 0) - record.attempt_started_at())]


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


def backoff_s(record: jobstore.JobRecord, first_s: float) -> float:
    """How long to wait before running again the attempt that was just closed (record.restart()):
    `first_s` (RESTART_BACKOFF's value) after one failure, doubled for each more in a row."""
    failures = _trailing([(a["state"], 0.0) for a in record.attempts], lambda state, _: state in FAILED_STATES)
    return min(first_s * 2 ** max(failures - 1, 0), BACKOFF_MAX_S)
