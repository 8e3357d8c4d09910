"""The wall time split by the job's steps (report/goodput.py), on records made as the launcher makes
them (helpers.StepsRecord): exact parts that add up to the wall time, lost progress, slow steps."""

from __future__ import annotations

import random
import statistics

import pytest

from podrun import jobstore, progress, timeline
from podrun.report.analysis import Analysis
from podrun.report.goodput import UNKNOWN, Goodput, _weighted_median
from podrun.report.summary import summary

from helpers import StepsRecord


def split_of(record: jobstore.JobRecord, now: float | None = None) -> Goodput:
    split = Goodput(Analysis(record, now))
    assert sum(split.parts_s.values()) == pytest.approx(split.wall_s, abs=1e-6)
    return split


def every_2s(first: int, last: int, at: float) -> list[tuple[float, int]]:
    """Steps first..last, the first at `at`, one each 2 s."""
    return [(at + 2 * index, step) for index, step in enumerate(range(first, last + 1))]


def failed_at_5_resumed_from_3(home, first: int = 4) -> jobstore.JobRecord:
    """Attempt 0 reaches step 5 at 1012 and dies at 1020; attempt 1 restores step 3, prints `first` (step 4) at
    1025 and one step each 2 s, and succeeds."""
    made = StepsRecord(1000.0).phase("setup", 1000, 1002)
    made.attempt((1002, 1020), every_2s(1, 5, 1004), restart_s=1)
    made.phase("setup", 1021, 1022).attempt((1022, 1040), every_2s(first, 8, 1025), state=jobstore.SUCCEEDED)
    return made.record


def test_a_job_that_failed_at_step_5_and_resumed_from_step_3_lost_2_steps(home):
    split = split_of(failed_at_5_resumed_from_3(home))
    assert split.wall_s == 40
    assert split.lost_progress_steps == 2
    assert split.parts_s == pytest.approx({
        "productive": 8 + 6,  # steps 1 to 5, then 5 to 8
        "program_startup": 2 + 1,  # each run's start to its first step, less attempt 1's redone first step
        "wasted_progress_from_disruption": 2 + 2,  # steps 4 (before its line, a median step) and 5 again
        "slow_steps": 0,
        "infrastructure_recovery_from_disruption": 8 + 1,  # step 5 to the failure, and the restart's wait
        "queue": 0, "create": 0, "connect": 0, "ship": 0, "setup": 3, "stop": 0, "stall": 0,
        "after_last_step": 7,  # the last step to the end of the last attempt
        "other": 0,
    }, abs=1e-9)
    assert split.goodput == pytest.approx(14 / 40)


def test_a_first_line_of_a_step_not_yet_reached_before_loses_nothing(home):
    split = split_of(failed_at_5_resumed_from_3(home, first=6))
    assert split.lost_progress_steps == 0
    assert split.parts_s["wasted_progress_from_disruption"] == 0
    assert split.parts_s["program_startup"] == pytest.approx(2 + 3)


def test_a_job_that_prints_the_step_it_restored_counts_the_steps_from_the_one_before(home):
    """`step 3` first: podrun reads a line as a step done, so the attempt restored step 2 and redid 3 to 5,
    each counted once, in the steps and in their time."""
    split = split_of(failed_at_5_resumed_from_3(home, first=3))
    assert split.lost_progress_steps == 3
    assert split.parts_s["wasted_progress_from_disruption"] == pytest.approx(3 * 2)


def test_the_summary_names_each_part_and_each_attempts_steps(home):
    analysis = Analysis(failed_at_5_resumed_from_3(home))
    lines = summary(analysis, Goodput(analysis))
    assert lines[1] == "wall time 40.0s; goodput 35.0% (14.0s productive)"
    assert lines[2] == ("the rest: program_startup 3.00s, wasted_progress_from_disruption 4.00s (2 steps lost), "
                        "setup 3.00s, infrastructure_recovery_from_disruption 9.00s, after_last_step 7.00s")
    assert "attempt 0: failed after 20.0s; steps 1 to 5" in lines
    assert "attempt 1: succeeded after 20.0s; steps 4 to 8" in lines


def test_a_slow_step_counts_beyond_the_median_step_time_even_among_samples_of_several_steps(home):
    steps = [(1001, 1), (1002, 2), (1003, 3), (1007, 7), (1008, 8), (1013, 9), (1014, 10)]  # 7 to 8: 5 s
    record = StepsRecord(1000.0).attempt((1000, 1015), steps, state=jobstore.SUCCEEDED).record
    split = split_of(record)
    assert split.slow_step_bound() == 1.0  # every other step took 1 s: its deviation is 0
    assert split.parts_s["slow_steps"] == pytest.approx(4.0)
    assert split.parts_s["productive"] == pytest.approx(13 - 4)
    assert split.parts_s["program_startup"] == pytest.approx(1) and split.parts_s["after_last_step"] == pytest.approx(1)


def test_the_slow_step_bound_is_median_plus_3_mads_with_each_interval_weighed_by_its_steps():
    rng = random.Random(7)
    for _ in range(200):
        timed = [(round(rng.uniform(0.5, 3), 2), rng.randint(1, 4)) for _ in range(rng.randint(1, 9))]
        expanded = [value for value, weight in timed for _ in range(weight)]
        assert _weighted_median(timed) == pytest.approx(statistics.median(expanded))


def test_a_stall_within_the_run_stays_stall_and_an_attempt_without_a_step_is_all_startup(home):
    made = StepsRecord(1000.0)
    timeline.add(made.record, "stall", 1004, 1010)  # from the last line to the stop, as launch/stall.py records it
    made.attempt((1000, 1010), [(1002, 1), (1004, 2)], state=jobstore.STALLED, restart_s=0)
    made.attempt((1010, 1020), [], state=jobstore.FAILED)
    split = split_of(made.record)
    assert split.parts_s["stall"] == pytest.approx(6)
    assert split.parts_s["program_startup"] == pytest.approx(2 + 10)
    assert split.parts_s["productive"] == pytest.approx(2)
    assert split.parts_s["infrastructure_recovery_from_disruption"] == 0  # the stall took the time after step 2
    assert "attempt 1: failed after 10.0s; no step" in summary(Analysis(made.record), split)


def test_a_running_jobs_time_since_its_last_step_is_after_last_step_up_to_now(home):
    made = StepsRecord(1000.0)
    for at, step in [(1002, 1), (1004, 2)]:
        progress.advance(made.record, made.record.workers[0], step, at)
    timeline.begin(made.record, "run", [0], at=1000)
    split = split_of(made.record, now=1010)
    assert split.parts_s["productive"] == pytest.approx(2)
    assert split.parts_s["program_startup"] == pytest.approx(2) and split.parts_s["after_last_step"] == pytest.approx(6)
    assert split.parts_s["other"] == 0


def test_without_steps_run_is_one_part_and_the_summary_says_what_is_not_known(home):
    record = StepsRecord(1000.0).phase("setup", 1000, 1001).attempt((1001, 1010), [], state=jobstore.SUCCEEDED).record
    split = split_of(record)
    assert not split.known and split.parts_s["run"] == pytest.approx(9) and "productive" not in split.parts_s
    assert split.goodput == pytest.approx(0.9)
    lines = summary(Analysis(record), split)
    assert lines[1] == "wall time 10.0s; goodput 90.0% (9.00s in run)" and UNKNOWN in lines
    assert "attempt 0: succeeded after 10.0s" in lines
