"""What a job cost (README: Long runs): the Cloud TPU price table's lookup (cloud/prices.py), and the
billed time, per attempt, productive and lost to preemptions, worked out from a record's phases
(report/cost.py)."""

from __future__ import annotations

import re

import pytest

from podrun import jobstore
from podrun.cloud import accelerators, prices
from podrun.report import cost


def test_a_known_type_costs_its_chips_at_the_regions_on_demand_price():
    # v5litepod names count chips, v4 names count TensorCores (two a chip): v4-8 is 4 chips
    assert prices.tpu_price("v5litepod-16", "us-central1-a", spot=False) == {
        "per_hour": 19.2, "source": f"Cloud TPU price table of {prices.AS_OF}: v5litepod-16 on-demand in us-central1, "
                                   f"16 chips at $1.2/chip-hour"}
    assert prices.tpu_price("v4-8", "us-central2-b", spot=False)["per_hour"] == pytest.approx(4 * 3.22)
    assert prices.tpu_price("V5P-8", "us-east5-a", spot=False)["per_hour"] == pytest.approx(4 * 4.2)


def test_spot_takes_the_spot_price_and_slices_multiply_it():
    spot = prices.tpu_price("v6e-8", "us-east5-b", spot=True)
    assert spot["per_hour"] == pytest.approx(8 * 1.08) and "v6e-8 Spot in us-east5, 8 chips at $1.08" in spot["source"]
    assert prices.tpu_price("v6e-8", "us-east5-b", spot=True, slices=3)["per_hour"] == pytest.approx(3 * 8 * 1.08)
    assert prices.tpu_price("v6e-8", "us-east5-b", spot=False)["per_hour"] == pytest.approx(8 * 2.7)


def test_v2_and_v3_price_a_single_device_and_a_pod_slice_apart():
    assert prices.tpu_price("v2-8", "us-central1-b", spot=False)["per_hour"] == pytest.approx(4.5)
    assert prices.tpu_price("v2-32", "us-central1-a", spot=False)["per_hour"] == pytest.approx(24.0)
    assert prices.tpu_price("v3-8", "us-central1-a", spot=False)["per_hour"] == pytest.approx(8.0)


@pytest.mark.parametrize("accelerator_type, zone, spot, named", [
    ("v5p-8", "asia-east1-a", False, "no on-demand price for v5p in asia-east1 (asia-east1-a)"),
    ("v4-8", "europe-west4-a", True, "no Spot price for v4 in europe-west4 (europe-west4-a)"),
    ("v3-8", "us-east1-d", True, "no Spot price for v3-8 in us-east1 (us-east1-d)"),  # on demand only there
])
def test_a_region_without_a_price_is_one_line_that_says_how_to_set_one(accelerator_type, zone, spot, named):
    price = prices.tpu_price(accelerator_type, zone, spot)
    assert price["per_hour"] is None and named in price["why"] and "\n" not in price["why"]
    assert price["why"].endswith("set cost.per_hour in the spec to see its cost")


def test_a_reservation_has_no_table_price():
    price = prices.tpu_price("v6e-8", "us-east5-b", spot=False, reserved=True)
    assert price["per_hour"] is None and "committed-use contract" in price["why"]


def test_every_entry_of_the_table_is_a_generation_or_a_type_and_its_regions_are_regions():
    for priced, regions in prices.PER_CHIP_HOUR.items():
        assert priced in accelerators.GENERATIONS or accelerators.parse(priced).name == priced
        for region, (on_demand, spot) in regions.items():
            assert re.fullmatch(r"[a-z]+-[a-z]+\d", region) and on_demand > 0 and (spot is None or 0 < spot < on_demand)
    assert prices.region_of("us-central2-b") == "us-central2"


# --- billed time from a record's phases: a spot TPU created, preempted in attempt 0, made again for attempt 1

T = 1_000_000.0


def preempted_then_succeeded(price: dict | None) -> jobstore.JobRecord:
    """Queued 0-100 s (not billed), created 100-160, attempt 0 from 160 to 400 (preempted), attempt 1: the TPU
    recreated from 400, its queued request waiting until 450, ready at 500, run 510-700, the end at 710."""
    record = jobstore.JobRecord("job-1", "job", "tpu:2", "job.yaml", [jobstore.WorkerRecord(0, "a")],
                                started_at=T + 160, attempt=1, ended_at=T + 710, state=jobstore.SUCCEEDED, price=price,
                                attempts=[{"attempt": 0, "state": jobstore.PREEMPTED, "exit_code": 75,
                                           "summary": "preempted", "started_at": T + 160, "ended_at": T + 400}])
    record.phases = [
        {"phase": "queue", "attempt": 0, "start": T, "end": T + 100},
        {"phase": "create", "attempt": 0, "start": T + 100, "end": T + 160},
        {"phase": "run", "attempt": 0, "start": T + 170, "end": None, "workers": {"0": [T + 170, None]}},
        {"phase": "recreate", "attempt": 1, "start": T + 400, "end": T + 500, "capacity_at": T + 450},
        {"phase": "run", "attempt": 1, "start": T + 510, "end": T + 700, "workers": {"0": [T + 510, T + 700]}}]
    return record


def test_each_attempt_bills_from_its_tpus_creation_and_preemptions_lose_the_attempt_and_the_recreation():
    figures = cost.figures(preempted_then_succeeded({"per_hour": 36.0, "source": "spec cost.per_hour"}))
    # attempt 0: 100..400 = 300 s; attempt 1: 450..710 = 260 s (the queue's waits are not billed)
    assert [(each["attempt"], each["billed_s"], each["cost"]) for each in figures["attempts"]] == [(0, 300, 3.0),
                                                                                                   (1, 260, 2.6)]
    assert figures["billed_s"] == 560 and figures["total"] == 5.6
    assert figures["lost_s"] == 300 + 50 and figures["lost_to_preemptions"] == 3.5  # attempt 0 and the recreation
    assert figures["productive_of"] == "run" and figures["productive_s"] == 190 and figures["productive"] == 1.9
    assert cost.lines(figures) == ["cost $5.60 for 9m20s billed at $36.00/h (spec cost.per_hour): attempt 0 $3.00 "
                                   "(preempted), attempt 1 $2.60; run $1.90, lost to preemptions $3.50"]


def test_the_productive_and_lost_seconds_given_replace_the_records_own():
    figures = cost.figures(preempted_then_succeeded({"per_hour": 36.0, "source": "spec cost.per_hour"}),
                           productive_s=100, lost_s=360)
    assert (figures["productive"], figures["lost_to_preemptions"]) == (1.0, 3.6)
    assert "; productive steps $1.00, lost to preemptions $3.60" in cost.lines(figures)[0]


def test_a_job_without_a_price_says_why_in_one_line():
    why = "a local target has no price table: its cost comes only from the spec's cost.per_hour"
    assert cost.lines(cost.figures(preempted_then_succeeded({"per_hour": None, "why": why}))) == [
        f"cost: not shown: {why}"]
    assert cost.lines(cost.figures(preempted_then_succeeded(None))) == [f"cost: not shown: {cost.NO_PRICE}"]


def test_a_price_with_more_than_cents_is_shown_whole():
    assert cost.rate(7.372) == "$7.372/h" and cost.rate(12.5) == "$12.50/h" and cost.money(1234.5) == "$1,234.50"
