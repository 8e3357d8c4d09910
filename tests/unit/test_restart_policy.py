"""restarts.until_no_progress (launch/restart_policy.no_progress): the job restarts no more once that many
attempts in a row never got past the best step reached before them; on records made as the launcher
makes them (helpers.StepsRecord)."""

from __future__ import annotations

from podrun import exits, jobstore
from podrun.launch.restart_policy import backoff_s, cause, continuations, no_progress, quick_failures

from helpers import StepsRecord


def attempts_dying_at(*last_steps: int | None, resumed_from: int = 3) -> StepsRecord:
    """An attempt per step given, each dead at that step (None: before any), each after the first resumed from
    `resumed_from`, the last one just ended (not restarted yet)."""
    made, at = StepsRecord(1000.0), 1000.0
    for number, last in enumerate(last_steps):
        first = 1 if number == 0 else resumed_from
        steps = [] if last is None else [(at + 1 + index, step) for index, step in enumerate(range(first, last + 1))]
        made.attempt((at, at + 20), steps, restart_s=None if number == len(last_steps) - 1 else 0)
        at += 20
    return made


def test_attempts_that_keep_dying_at_the_best_step_stop_the_restarts_and_name_it(home):
    made = attempts_dying_at(5, 5, 5, 5)
    assert no_progress(made.record, 3) == ("no restart: the last 3 attempts never got past step 5, the best before "
                                           "them (each died at step 5)")
    assert no_progress(made.record, 4) is None  # the first attempt got to step 5 from nothing


def test_an_attempt_that_got_past_the_best_step_starts_the_count_again(home):
    assert no_progress(attempts_dying_at(5, 5, 6, 6).record, 3) is None
    assert no_progress(attempts_dying_at(5, 5, 6, 6, 6).record, 3) is None  # the first at 6 got past 5
    assert no_progress(attempts_dying_at(5, 5, 6, 6, 6, 6).record, 3) is not None


def test_an_attempt_with_no_step_counts_as_no_progress_and_each_place_is_named(home):
    made = attempts_dying_at(5, 4, None, 5)
    assert no_progress(made.record, 3) == ("no restart: the last 3 attempts never got past step 5, the best before "
                                           "them (they died at step 4, before any step and at step 5)")


def test_attempts_that_never_reached_a_step_stop_the_restarts(home):
    made = attempts_dying_at(None, None)
    assert no_progress(made.record, 2) == "no restart: none of the last 2 attempts reached a step (the spec's progress)"
    assert no_progress(made.record, 3) is None  # not that many attempts yet


def test_time_limit_continuations_are_no_failures_and_not_counted(home):
    """An attempt a Slurm time limit ended (125) is a time_limit, which restarts.max does not count, nor the
    quick-failure rule or the backoff: three 30-s allocations in a row are no bug failing at once."""
    made = attempts_dying_at(5, 9, 14)
    record = made.record
    over = "Slurm job 7 was 30s from its time limit (00:01:00): the job was signalled to save and stop"
    for attempt in record.attempts:
        attempt["state"], attempt["exit_code"], attempt["summary"] = jobstore.FAILED, exits.TIME_LIMIT, over
    record.state, record.exit_code, record.summary = jobstore.FAILED, exits.TIME_LIMIT, over
    assert cause(record.state, record.exit_code, record.summary) == "time_limit"
    assert continuations(record) == 2
    assert quick_failures(record) == 0
    assert backoff_s(record, 1.0) == 1.0
    record.exit_code = 1
    assert (cause(record.state, record.exit_code, record.summary), quick_failures(record)) == ("failure", 1)
    # a program's own exit 125 is a failure, wherever it runs
    assert cause(jobstore.FAILED, 125, "worker 1 exited with code 125 in run (RuntimeError: time limit)") == "failure"
    assert cause(jobstore.SUCCEEDED, 0, None) is None
