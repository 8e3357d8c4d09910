"""The job's step as its agent reads it (remote/step_reader.py), stall: auto's bound, and what the record
keeps of the steps (progress.py)."""

from __future__ import annotations

import os

import pytest

from podrun import jobstore, progress
from podrun.launch import stall
from podrun.remote import step_reader
from podrun.remote.step_reader import StepReader, auto_bound


def test_the_last_complete_line_with_a_step_counts_and_a_lower_step_changes_nothing():
    reader = StepReader({"pattern": r"step (\d+)"}, ".")
    reader.feed(b"[rank0]:step 7 loss 2.1\nstep 8 loss 2.0\nalive\n")
    assert reader.step == 8
    reader.feed(b"[rank1]:step 6 loss 2.3\n")  # a rank behind the others
    assert reader.step == 8
    reader.feed(b"step 1")  # not a whole line yet
    reader.feed(b"2\r")  # a progress bar's carriage return ends it
    assert reader.step == 12


def test_a_group_without_a_number_and_lines_without_the_pattern_are_passed_over():
    reader = StepReader({"pattern": r"step (\S+)"}, ".")
    reader.feed(b"step 3\nstep three\nepoch done\n")
    assert reader.step == 3


def test_a_step_is_reported_once_and_then_at_most_every_second(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(step_reader.time, "monotonic", lambda: clock[0])
    reader = StepReader({"pattern": r"step (\d+)"}, ".")
    assert reader.report() is None and reader.due() is None
    reader.feed(b"step 1\n")
    assert reader.report()[0] == 1
    reader.feed(b"step 2\n")
    assert reader.report() is None and reader.due() == pytest.approx(1.0)
    clock[0] += 1.0
    assert reader.report()[0] == 2 and reader.report() is None


def test_a_step_file_is_read_when_it_changes(tmp_path, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(step_reader.time, "monotonic", lambda: clock[0])
    reader = StepReader({"file": "step.txt"}, str(tmp_path))
    assert reader.report() is None  # not written yet
    (tmp_path / "step.txt").write_text("41\n")
    clock[0] += step_reader.FILE_EVERY_S
    assert reader.report()[0] == 41
    (tmp_path / "step.txt").write_text("42")
    os.utime(tmp_path / "step.txt", (1, 1))  # a new mtime and size alike: it is read again
    clock[0] += step_reader.FILE_EVERY_S
    assert reader.report()[0] == 42


def test_stall_auto_is_a_multiple_of_the_median_step_time_within_its_floor_and_cap():
    steady = [(float(second), second) for second in range(10)]  # a step a second
    assert auto_bound(steady, multiple=10, floor_s=1, cap_s=100) == 10
    assert auto_bound(steady, multiple=10, floor_s=30, cap_s=100) == 30
    assert auto_bound(steady, multiple=10, floor_s=1, cap_s=5) == 5
    batched = [(0.0, 1), (1.0, 6), (1.4, 8)]  # reported at most every second: 5 steps, then 2, at 0.2 s each
    assert auto_bound(batched, multiple=10, floor_s=1, cap_s=100) == pytest.approx(2.0)
    slow_spike = [*steady, (40.0, 10)]  # one 30 s step: the median keeps the bound
    assert auto_bound(slow_spike, multiple=10, floor_s=1, cap_s=100) == 10


def test_stall_auto_waits_for_the_cap_until_steps_were_timed():
    assert auto_bound([], multiple=10, floor_s=1, cap_s=7200) == 7200
    assert auto_bound([(0.0, 1), (900.0, 2)], multiple=10, floor_s=1, cap_s=7200) == 7200  # one step: compiling?


def test_the_stall_summary_names_the_step_each_worker_is_at():
    assert stall.summary({0: 3.04, 1: 3.01, 2: 12.4}, {0: 7, 1: 7, 2: 5}) == \
        "no step from any worker for 3.0s: the job is at step 7 (w0-1 at step 7 for 3.0s, w2 at step 5 for 12.4s)"
    assert stall.summary({0: 5.0}, {0: None}) == \
        "no step from any worker for 5.0s: no worker reached a step (w0 no step yet)"
    assert stall.summary({0: 3.0, 1: 3.0}) == "no output from any worker for 3.0s (w0-1 silent 3.0s)"


def record(workers: int = 2) -> jobstore.JobRecord:
    return jobstore.JobRecord("j", "j", "local:2", "job.yaml", [jobstore.WorkerRecord(i, "x") for i in range(workers)])


def test_the_job_step_is_the_highest_any_worker_reached_per_attempt():
    job = record()
    assert progress.advance(job, job.workers[0], 5, 10.0)
    assert not progress.advance(job, job.workers[1], 4, 11.0)  # worker 1 behind: the job is at 5
    assert progress.advance(job, job.workers[1], 6, 12.0)
    assert (job.steps[0]["first"], job.steps[0]["last"], progress.step_of(job)) == (5, 6, 6)
    assert progress.samples(job.steps[0]) == [(10.0, 5), (12.0, 6)]
    job.attempt = 1
    job.workers = [jobstore.WorkerRecord(i, "x") for i in range(2)]
    progress.advance(job, job.workers[0], 3, 20.0)
    assert progress.best_before(job, 1) == 6 and progress.entry_of(job)["first"] == 3


def test_the_first_step_line_of_a_chunk_is_where_the_run_began_and_is_told_once():
    reader = StepReader({"pattern": r"step (\d+)"}, ".")
    reader.feed(b"restoring\nstep 4 loss 2\nstep 5 loss 2\n")  # one chunk: the job's step is its last line's
    assert (reader.first, reader.step) == (4, 5)
    assert reader.first_untold() == 4 and reader.first_untold() is None
    reader.feed(b"step 6\n")
    assert reader.first == 4
    resumed = StepReader({"pattern": EPOCH_BAR, "epochs": {"first": 1, "steps": 10}}, ".")
    resumed.feed(b"Epoch 2: 3/10\nEpoch 2: 4/10\n")
    assert (resumed.first, resumed.step) == (13, 14)  # counted as the step is
    redrawn = StepReader({"pattern": EPOCH_BAR}, ".")
    redrawn.feed(b"loading\rEpoch 1: 1/10\rEpoch 1: 2/10\n")  # a bar's redraws are lines
    assert (redrawn.first, redrawn.step) == (1, 2)
    from_file = StepReader({"file": "step.txt"}, ".")
    assert from_file.first_untold() is None  # a file read now and then does not say where the run began


def test_workers_that_began_at_different_steps_are_said_once_and_kept_in_the_attempts_entry():
    job = record(3)
    job.attempt = 1
    progress.advance(job, job.workers[0], 5, 10.0)
    assert progress.began(job, 0, 4) is None
    progress.advance(job, job.workers[1], 5, 10.5)
    assert progress.began(job, 1, 4) is None  # the same checkpoint
    progress.advance(job, job.workers[2], 2, 11.0)
    assert progress.began(job, 2, 1) == ("attempt 1: its workers began at different steps (w0 at 4, w1 at 4, "
                                         "w2 at 1): did each restore the same checkpoint?")
    assert progress.entry_of(job)["firsts"] == {"0": 4, "1": 4, "2": 1}
    assert progress.began(job, 2, 1) is None  # said once
    from podrun.supervisor import answers

    assert answers.record(job.to_dict(), job.id, "host").steps == job.steps


def test_a_long_attempt_keeps_a_bounded_number_of_samples_with_its_first_and_latest():
    job = record(1)
    for step in range(10 * progress.MAX_SAMPLES):
        progress.advance(job, job.workers[0], step, 1000.0 + step)
    pairs = progress.samples(job.steps[0])
    assert len(pairs) <= progress.MAX_SAMPLES + 1
    assert pairs[0] == (1000.0, 0) and pairs[-1] == (1000.0 + 10 * progress.MAX_SAMPLES - 1, 10 * progress.MAX_SAMPLES - 1)
    assert [step for _, step in pairs] == sorted(step for _, step in pairs)


def test_steps_per_minute_over_the_recent_samples():
    job = record(1)
    for second in range(0, 600, 10):
        progress.advance(job, job.workers[0], second // 10, float(second))  # 6 steps a minute
    assert progress.steps_per_minute(job, 590.0) == pytest.approx(6.0)
    # the last 300 s of samples (steps 29 to 59), over the time since their first: no step for 5 minutes halves it
    assert progress.steps_per_minute(job, 890.0) == pytest.approx(30 * 60 / 600)


def test_a_supervisor_host_may_answer_with_a_record_that_has_steps():
    from podrun.supervisor import answers

    job = record()
    for step in range(3 * progress.MAX_SAMPLES):
        progress.advance(job, job.workers[0], step, 1000.0 + step)
    assert answers.record(job.to_dict(), job.id, "host").steps == job.steps
    damaged = job.to_dict()
    damaged["steps"][0]["samples"][1] = -1
    with pytest.raises(Exception, match="steps.0.samples.1"):
        answers.record(damaged, job.id, "host")


def test_the_step_a_run_ended_at_is_reported_at_once_however_soon_after_the_last_report():
    reader = StepReader({"pattern": r"step (\d+)"}, ".")
    reader.feed(b"step 1\n")
    assert reader.report()[0] == 1
    reader.feed(b"step 2\nstep 3\n")
    assert reader.report() is None  # within REPORT_EVERY_S of the last report
    assert reader.report(final=True)[0] == 3
    assert reader.report(final=True) is None  # reported already


def bar(epoch: int, step: int, steps: int = 10) -> bytes:
    """A line of a per-epoch bar as tqdm and Lightning draw it, redrawn with a carriage return."""
    return f"\rEpoch {epoch}: {step * 100 // steps:3d}%|{'#' * step}{' ' * (steps - step)}| {step}/{steps} " \
           f"[00:0{step}<00:0{steps - step}, 1.00it/s]".encode()


PLAIN_BAR = r"Epoch \d+:.*?(\d+)/\d+"
EPOCH_BAR = r"Epoch (?P<epoch>\d+):.*?(\d+)/\d+"


def test_a_step_that_falls_to_half_and_counts_up_again_is_a_fall_told_once():
    reader = StepReader({"pattern": PLAIN_BAR}, ".")
    for step in range(11):
        reader.feed(bar(1, step))
    reader.feed(b"\n" + bar(2, 0))
    reader.feed(bar(2, 1))  # which ends the line of the new epoch's step 0, below half the highest
    assert reader.fell() is None  # one low line is no fall yet: a quoted old step reads alike
    reader.feed(bar(2, 2))
    assert reader.step == 10 and reader.fell() == (10, "10", "0") and reader.fell() is None
    assert reader.fallen() == ("10", "0")  # it has not passed 10 since: a stall says so
    reader.feed(b"\n" + bar(3, 0) + bar(3, 1) + b"\rEpoch 3: 11/12 \r")
    assert reader.step == 11 and reader.fallen() is None and reader.fell() is None


def test_a_rank_a_little_behind_or_a_line_that_quotes_an_old_step_is_no_fall():
    reader = StepReader({"pattern": r"step (\d+)"}, ".")
    for step in range(100, 110):
        reader.feed(f"[rank0]:step {step}\n[rank1]:step {step - 2}\n[rank1]:step {step - 1}\n".encode())
    reader.feed(b"saved the checkpoint of step 50\nstep 110\nbest so far: step 40\nstep 111\n")
    assert reader.step == 111 and reader.fell() is None


def test_with_an_epoch_group_a_new_epochs_step_is_progress_and_the_count_rises():
    reader = StepReader({"pattern": EPOCH_BAR}, ".")
    counts = []
    for epoch in (1, 2, 3):
        for step in range(11):
            reader.feed(bar(epoch, step))
            counts += [reader.step] if reader.step is not None else []
        reader.feed(b"\n")
    assert counts == sorted(counts) and reader.step == 30 and reader.fell() is None
    assert reader.epoch_fields() == {"epoch": 3, "epoch_step": 10, "first_epoch": 1, "epoch_steps": 10}
    # a chunk that holds an epoch's last lines and the next one's first: the epoch's end still counts
    chunked = StepReader({"pattern": EPOCH_BAR}, ".")
    chunked.feed(bar(1, 1) + b"\r")
    chunked.feed(bar(1, 2) + bar(1, 10) + b"\n" + bar(2, 0) + bar(2, 3) + b"\r")
    assert (chunked.step, chunked.epoch_fields()["epoch_steps"]) == (13, 10)


def test_an_earlier_attempts_epochs_carry_its_count_on_where_it_resumes():
    resumed = StepReader({"pattern": EPOCH_BAR, "epochs": {"first": 1, "steps": 10}}, ".")
    resumed.feed(b"Epoch 2: 3/10\n")  # an attempt that died at epoch 2 step 8 (count 18) resumed here
    assert resumed.step == 13  # 5 steps lost, as the report counts them


def test_the_step_is_the_group_named_step_else_the_first_other_than_the_epoch():
    named = StepReader({"pattern": r"(?P<step>\d+)/\d+ in epoch (?P<epoch>\d+)"}, ".")
    named.feed(b"9/10 in epoch 1\n10/10 in epoch 1\n2/10 in epoch 2\n")
    assert named.step == 12 and named.epoch_fields()["epoch"] == 2
    plain = StepReader({"pattern": r"loss (\d+\.\d+) step (?P<step>\d+)"}, ".")
    plain.feed(b"loss 2.5 step 7\n")
    assert plain.step == 7


def test_the_record_keeps_an_epoch_groups_count_for_a_later_attempt():
    job = record(1)
    fields = {"epoch": 2, "epoch_step": 4, "first_epoch": 1, "epoch_steps": 10}
    assert progress.advance(job, job.workers[0], 14, 10.0, fields)
    assert job.steps[0]["epoch"] == {"epoch": 2, "step": 4, "first": 1, "steps": 10}
    assert progress.epochs_known(job) == {"first": 1, "steps": 10}
    assert progress.epochs_known(record(1)) is None


def test_a_fall_is_said_in_one_line_with_the_pattern_and_an_epoch_group_for_it():
    assert stall.fall_line({0: ("10", "0"), 1: ("10", "0"), 3: ("9", "1")}, PLAIN_BAR) == (
        r"the step went back in lines matching 'Epoch \d+:.*?(\d+)/\d+': w0-1 from 10 to 0, w3 from 9 to 1; a step "
        r"is progress (for stall, restarts and the record) only past the highest one reached; if it starts over "
        r"each epoch, name the epoch in a group of its own: progress: 'Epoch (?P<epoch>\d+):.*?(\d+)/\d+'")
    assert stall.fall_line({0: ("10", "0")}, r"(\d+)/\d+").endswith(
        r"progress: 'Epoch (?P<epoch>\d+):.*?(\d+)/\d+' for a bar such as `Epoch 2: 10%| 1/10`")
    assert not stall.fall_line({0: ("25 (epoch 3 step 5)", "12 (epoch 2 step 2)")}, EPOCH_BAR).count("name the epoch")


def test_a_stall_while_the_step_fell_says_the_step_went_back():
    assert stall.summary({0: 3.0}, {0: 10}, {0: ("10", "0")}) == (
        "no step from any worker for 3.0s: the job is at step 10 (w0 at step 10 for 3.0s); the step went back, w0 "
        "from 10 to 0, and has not passed where it was since")


def test_the_rate_over_time_is_each_tenths_steps_read_between_the_samples_around_its_ends():
    entry = {"samples": [100.0, 0, 110.0, 10, 120.0, 15]}  # 60 steps a minute for 10 s, then 30
    assert [(start - 100, end - 100, rate) for start, end, rate in progress.rates(entry)] == pytest.approx(
        [(2 * tenth, 2 * tenth + 2, 60.0 if tenth < 5 else 30.0) for tenth in range(10)])
    assert progress.rates({"samples": [100.0, 3]}) == []  # one sample: no rate
