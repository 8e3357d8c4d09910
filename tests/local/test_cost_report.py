"""What a job cost (README: Long runs), on local workers, whose only price is the spec's `cost.per_hour`:
`podrun report`'s cost line, the COST column of `podrun jobs` and the cost in `jobs --json`, worked out again
here from the record's own times; a job without a price says why in one line."""

from __future__ import annotations

import json
import re

from helpers import job_id_in, podrun

FAILS_FIRST = ("target: {local: {workers: 2}}\n"
               "run: |\n"
               "  echo step; sleep 0.5\n"
               "  [ \"$PODRUN_ATTEMPT\" != 0 ] || exit 3\n"
               "restarts: {max: 1, on: [failure]}\n"
               "cost: {per_hour: 3600}\n")  # a dollar a second: the cents check the billed time to 10 ms
COST_LINE = re.compile(r"^cost \$([\d,.]+) for \S+ billed at \$3,600\.00/h \(spec cost\.per_hour\): "
                       r"attempt 0 \$([\d,.]+), attempt 1 \$([\d,.]+); run \$[\d,.]+$", re.MULTILINE)


def dollars(text: str) -> float:
    return float(text.replace(",", ""))


def test_a_local_jobs_cost_is_its_per_hour_times_each_attempts_wall_time(home, job_file, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.2")
    ran = podrun("exec", job_file(FAILS_FIRST))
    assert ran.returncode == 0, ran.stderr
    job_id = job_id_in(ran.stderr)
    job = next(job for job in json.loads(podrun("jobs", "--json").stdout) if job["id"] == job_id)
    assert job["price"] == {"per_hour": 3600, "source": "spec cost.per_hour"}
    first = job["attempts"][0]
    billed = [first["ended_at"] - job["started_at"], job["ended_at"] - first["ended_at"]]  # no TPU made: wall time

    shown = COST_LINE.search(podrun("report", job_id).stdout)
    assert shown, podrun("report", job_id).stdout
    for figure, seconds in zip(shown.groups(), [sum(billed), *billed]):
        assert abs(dollars(figure) - seconds) <= 0.005 + 1e-9, (figure, seconds)
    assert abs(job["cost"]["total"] - sum(billed)) <= 0.005 + 1e-9 and job["cost"]["lost_to_preemptions"] == 0

    header, row = (re.split(r" {2,}", line) for line in podrun("jobs").stdout.splitlines())
    assert header[-1] == "COST" and row[-1] == f"${shown[1]}" and row[0] == job_id


def test_a_job_without_a_price_says_why_in_one_line_and_jobs_shows_no_cost_column(home, job_file):
    ran = podrun("exec", job_file("target: {local: {workers: 1}}\nrun: echo hi\n"))
    assert ran.returncode == 0, ran.stderr
    report = podrun("report", job_id_in(ran.stderr)).stdout
    assert "\ncost: not shown: a local target has no price table: its cost comes only from the spec's cost.per_hour\n" \
           in report, report
    assert "COST" not in podrun("jobs").stdout
    assert json.loads(podrun("jobs", "--json").stdout)[0]["cost"]["per_hour"] is None
