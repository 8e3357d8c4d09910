"""What a TPU job cost (README: Long runs), against the Cloud TPU stand-in: a spot TPU podrun creates, with
`cost: {per_hour: X}`, costs X times the hours it was billed, to the cent, which this test works out itself
from the record's phases (from the TPU's creation to the preemption, and from its recreation to the end); a
spot TPU without `cost` is priced from podrun's table. Run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import json
import re

import pytest

from helpers import WAIT_FOR_PREEMPTION, Background, job_id_in, job_record, lifecycle_spec, podrun

PER_HOUR = 3600.0  # a dollar a second: the cents check the billed time to 10 ms
MONEY = r"\$([\d,]+\.\d\d)"
COST_LINE = re.compile(rf"^cost {MONEY} for \S+ billed at \$3,600\.00/h \(spec cost\.per_hour\): attempt 0 {MONEY} "
                       rf"\(preempted\), attempt 1 {MONEY}; run {MONEY}, lost to preemptions {MONEY}$", re.MULTILINE)


def dollars(text: str) -> float:
    return float(text.replace(",", ""))


def cents_of(seconds: float) -> float:
    return PER_HOUR * seconds / 3600


@pytest.mark.slow
def test_a_spot_tpu_jobs_cost_is_its_per_hour_times_the_billed_hours_to_the_cent(home, tpu_api, lab, job_file):
    spec = lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, "spot: true", restarts="{max: 1}", delete_after="always",
                          cost=f"{{per_hour: {PER_HOUR:g}}}")
    job = Background("exec", spec)
    job.wait_for(r"\[w0\] attempt 0 on worker 0")
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    tpu_api.preempt("life")
    assert job.finish(timeout=120) == 0, job.text
    job_id = job_id_in(job.text)
    record = job_record(home, job_id)
    assert record["price"] == {"per_hour": PER_HOUR, "source": "spec cost.per_hour"}

    # billed: attempt 0 from the TPU's creation to its end (the preemption seen); attempt 1 from the TPU's
    # recreation (not queued: from its start) to the job's end
    phases = {(entry["phase"], entry["attempt"]): entry for entry in record["phases"]}
    created, recreated = phases[("create", 0)], phases[("recreate", 1)]
    assert record["attempts"][0]["state"] == "preempted" and "capacity_at" not in recreated
    billed = [record["attempts"][0]["ended_at"] - created["start"], record["ended_at"] - recreated["start"]]
    lost = billed[0] + recreated["end"] - recreated["start"]

    report = podrun("report", job_id)
    assert report.returncode == 0, report.stderr
    shown = COST_LINE.search(report.stdout)
    assert shown, report.stdout
    total, first, second, _, lost_shown = map(dollars, shown.groups())
    for figure, seconds in ((total, sum(billed)), (first, billed[0]), (second, billed[1]), (lost_shown, lost)):
        assert abs(figure - cents_of(seconds)) <= 0.005 + 1e-9, (figure, seconds, report.stdout)

    listed = next(entry for entry in json.loads(podrun("jobs", "--json").stdout) if entry["id"] == job_id)
    assert listed["cost"]["total"] == total and [each["state"] for each in listed["cost"]["attempts"]] == [
        "preempted", "succeeded"]
    header, row = (re.split(r" {2,}", line) for line in podrun("jobs").stdout.splitlines())
    assert header[-1] == "COST" and row[-1] == f"${shown[1]}"


@pytest.mark.slow
def test_a_spot_tpu_without_cost_is_priced_from_the_table(home, tpu_api, lab, job_file):
    ran = podrun("exec", lifecycle_spec(job_file, "echo done", "spot: true", delete_after="always"))
    assert ran.returncode == 0, ran.stderr
    job_id = job_id_in(ran.stderr)
    price = job_record(home, job_id)["price"]
    # the stand-in's zone is us-central2-b; a v4-16 is 8 chips (v4 names count TensorCores, two a chip)
    assert price["per_hour"] == pytest.approx(8 * 0.9215), price
    assert re.fullmatch(r"Cloud TPU price table of \d{4}-\d\d-\d\d: v4-16 Spot in us-central2, 8 chips at "
                        r"\$0\.9215/chip-hour", price["source"]), price
    report = podrun("report", job_id).stdout
    assert re.search(rf"^cost {MONEY} for \S+ billed at \$7\.372/h \(Cloud TPU price table of ", report, re.MULTILINE), \
        report
