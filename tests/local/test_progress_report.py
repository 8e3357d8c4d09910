"""Real local jobs that print `step N` (the spec's `progress`): `podrun report` splits their run time by
the steps (report/goodput.py), and restarts.until_no_progress stops restarting attempts that keep dying
at the same step."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import job_id_in, podrun

# attempt 0 reaches step 5 and fails; attempt 1 resumes from its checkpoint of step 3: its first line is
# `step 4`, and it goes on to 8. Each line names a step done. The agent reports a step at most once a second:
# the last step of each attempt is held for longer.
RESUMES_FROM_3 = ("target: {local: {workers: 2}}\n"
                  "progress: 'step (\\d+)'\n"
                  "restarts: {max: 1, on: [failure]}\n"
                  "run: |\n"
                  "  if [ \"$PODRUN_ATTEMPT\" = 0 ]; then first=1 last=5; else first=4 last=8; fi\n"
                  "  for i in $(seq $first $last); do sleep 0.3; echo \"step $i\"; done\n"
                  "  sleep 1.2\n"
                  "  [ \"$PODRUN_ATTEMPT\" != 0 ] || exit 3\n")
# every attempt dies right after step 3, within the second in which the agent reports no second step
DIES_AT_3 = ("target: {local: {workers: 1}}\n"
             "progress: 'step (\\d+)'\n"
             "restarts: {max: 10, on: [failure], until_no_progress: 2}\n"
             "run: for i in 1 2 3; do echo \"step $i\"; sleep 0.2; done; exit 3\n")


def test_a_job_that_resumed_from_step_3_after_dying_at_step_5_reports_2_steps_of_lost_progress(home, job_file,
                                                                                               monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.1")
    ran = podrun("exec", job_file(RESUMES_FROM_3))
    assert ran.returncode == 0, ran.stderr
    job_id = job_id_in(ran.stderr)

    report = json.loads(podrun("report", "--json", job_id).stdout)
    parts = report["parts_s"]
    assert sum(parts.values()) == pytest.approx(report["wall_s"], abs=1e-6)
    assert [(entry["attempt"], entry["first"], entry["last"]) for entry in report["steps"]] == [(0, 1, 5), (1, 4, 8)]
    assert report["lost_progress_steps"] == 2
    for entry in report["steps"]:  # the rate over each tenth of the attempt's steps adds up to its steps
        rates = entry["rates"]
        assert len(rates) == 10 and rates[0][0] == pytest.approx(entry["first_at"], abs=1e-3), entry
        assert sum(rate * (end - start) / 60 for start, end, rate in rates) == pytest.approx(
            entry["last"] - entry["first"], abs=0.01), entry
        # a step each 0.3 s: 200 a minute, as the samples (at most one a second) show it; slower under load
        assert 30 < (entry["last"] - entry["first"]) * 60 / (rates[-1][1] - rates[0][0]) < 400, entry
    # steps 4 and 5 again: about 0.6 s, by the samples the agent sent at most once a second (step 4's own time
    # before its line, a median step, taken out of program_startup)
    assert 0.2 < parts["wasted_progress_from_disruption"] < 2.5, parts
    assert parts["productive"] > 2 * parts["wasted_progress_from_disruption"], parts
    assert parts["program_startup"] > 0, parts
    # attempt 0's time after step 5, and the restart's wait
    assert parts["infrastructure_recovery_from_disruption"] >= 1.2, parts
    assert parts["after_last_step"] >= 1.0, parts  # attempt 1's time after its last step
    assert report["goodput"] == pytest.approx(parts["productive"] / report["wall_s"])

    shown = podrun("report", job_id).stdout
    assert re.search(r"^wall time \S+; goodput \d+\.\d% \(\d+\.\d+s productive\)$", shown, re.MULTILINE), shown
    assert re.search(r"wasted_progress_from_disruption \d+\.\d+s \(2 steps lost\)", shown), shown
    assert re.search(r"^attempt 0: failed after \S+ \(unknown on worker \d\): worker \d exited with code 3 in run; "
                     r"steps 1 to 5$", shown,
                     re.MULTILINE), shown
    assert re.search(r"^attempt 1: succeeded after \S+; steps 4 to 8$", shown, re.MULTILINE), shown
    assert len(re.findall(r"^  steps/min over each tenth of its steps: (\d\S* ){9}\d\S*$", shown, re.MULTILINE)) == 2, shown
    page = Path(re.search(r"^timeline: (\S+)$", shown, re.MULTILINE)[1]).read_text()
    assert "attempt 1: succeeded, steps 4 to 8</text>" in page
    assert re.search(r"<title>productive: \d+\.\d\ds \(\d+\.\d%\)</title>", page)
    assert re.search(r"<title>wasted_progress_from_disruption: \d+\.\d\ds \(\d+\.\d%\) \(2 steps lost\)</title>", page)


# attempt 1: worker 0 resumes from its checkpoint of step 3, worker 1 finds none and starts over
RESUMES_APART = RESUMES_FROM_3.replace("else first=4 last=8", 'else first=$((PODRUN_WORKER ? 1 : 4)) last=8')


def test_an_attempt_whose_workers_began_at_different_steps_is_said_at_once_and_flagged_in_the_report(
        home, job_file, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.1")
    ran = podrun("exec", job_file(RESUMES_APART))
    assert ran.returncode == 0, ran.stderr
    job_id = job_id_in(ran.stderr)
    differ = ("its workers began at different steps (w0 at 4, w1 at 1): did each restore the same checkpoint?")
    assert ran.stderr.count(differ) == 1 and f"podrun: attempt 1: {differ}" in ran.stderr, ran.stderr
    report = json.loads(podrun("report", "--json", job_id).stdout)
    assert [entry.get("firsts") for entry in report["steps"]] == [{"0": 1, "1": 1}, {"0": 4, "1": 1}]
    shown = podrun("report", job_id).stdout
    assert re.search(rf"^attempt 1: succeeded after \S+; steps [14] to 8; {re.escape(differ)}$", shown,
                     re.MULTILINE), shown
    assert re.search(r"^attempt 0: .*; steps 1 to 5$", shown, re.MULTILINE), shown


def test_a_detached_job_nothing_watches_keeps_where_each_worker_began(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nprogress: 'step (\\d+)'\n"
                    "run: for i in $(seq $((PODRUN_WORKER * 2 + 1)) 6); do echo \"step $i\"; sleep 0.1; done\n")
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    assert podrun("logs", "-f", job_id).returncode == 0
    report = json.loads(podrun("report", "--json", job_id).stdout)
    assert [entry.get("firsts") for entry in report["steps"]] == [{"0": 1, "1": 3}]
    assert "its workers began at different steps (w0 at 1, w1 at 3)" in podrun("report", job_id).stdout


def test_until_no_progress_decides_where_the_quick_failure_rule_would_have_stopped_first(home, job_file, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0")
    ran = podrun("exec", job_file(DIES_AT_3.replace("until_no_progress: 2", "until_no_progress: 3")))
    assert ran.returncode == 3, ran.stderr
    # 4 attempts, each within a second: the 60-s rule alone would have stopped after the third
    assert "restart 3 of 10" in ran.stderr and "restart 4 of 10" not in ran.stderr, ran.stderr
    assert ("podrun: no restart: the last 3 attempts never got past step 3, the best before them "
            "(each died at step 3)") in ran.stderr.splitlines()
    assert "within 60s of starting" not in ran.stderr


def test_attempts_that_keep_dying_at_the_same_step_stop_restarting_after_until_no_progress(home, job_file,
                                                                                          monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.1")
    ran = podrun("exec", job_file(DIES_AT_3))
    assert ran.returncode == 3, ran.stderr
    # attempt 0 got to step 3 from nothing; attempts 1 and 2 never got past it
    assert "restart 2 of 10" in ran.stderr and "restart 3 of 10" not in ran.stderr
    assert ("podrun: no restart: the last 2 attempts never got past step 3, the best before them "
            "(each died at step 3)") in ran.stderr.splitlines()
    report = json.loads(podrun("report", "--json", job_id_in(ran.stderr)).stdout)
    assert [(entry["first"], entry["last"]) for entry in report["steps"]] == [(1, 3)] * 3
    assert report["lost_progress_steps"] == 6  # each restart redid steps 1 to 3
