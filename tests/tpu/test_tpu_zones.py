"""Capacity in another zone (`target.tpu.zones`, README: Zones): with the first zone stocked out (the
stand-in's `exhausted_zones`, which answers as Google does: a create fails RESOURCE_EXHAUSTED, a queued
request waits), the job's TPU is asked for in the next zone, what was asked for in the first deleted,
the move said in one line and shown by `podrun report`; a multislice moves as a whole. Against the
Cloud TPU stand-in, whose workers are lab hosts; run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import pytest

from helpers import (
    WAIT_FOR_PREEMPTION,
    Background,
    job_id_in,
    left_in_api,
    lifecycle_spec,
    podrun,
    processes_of_job,
)

FIRST, SECOND = "us-east5-a", "us-central1-a"  # both offer v5p (accelerators.ZONES)
ZONES = f"zones: [{FIRST}, {SECOND}]"
READY_IN_SECOND = 'echo "on $PODRUN_WORKER of $PODRUN_NUM_WORKERS"'


def queued_in(tpu_api, zone: str) -> list[str]:
    return [path for method, path in tpu_api.requests
            if method == "POST" and path == f"/v2/projects/podrun-test/locations/{zone}/queuedResources"]


@pytest.mark.slow
@pytest.mark.parametrize("how, why", [
    ("spot: true", "There is no more capacity in the zone"),  # a direct create fails RESOURCE_EXHAUSTED
    ("spot: true, zone_wait: 2s", "still waiting after 2s"),  # zone_wait asks queued; the request waits past it
])
def test_a_spot_job_whose_first_zone_is_stocked_out_runs_in_the_next_and_its_report_shows_the_move(
        home, tpu_api, lab, job_file, how, why):
    tpu_api.exhausted_zones.add(FIRST)
    spec = lifecycle_spec(job_file, READY_IN_SECOND, f"{ZONES}, {how}", accelerator_type="v5p-16",
                          delete_after="always")
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert "[w1] on 1 of 2" in result.stdout
    moves = [line for line in result.stderr.splitlines() if "trying" in line]
    assert len(moves) == 1 and moves[0].startswith(f"podrun: no capacity for v5p-16 in {FIRST} (") \
        and moves[0].endswith(f"): trying {SECOND}") and why in moves[0], result.stderr
    job_id = job_id_in(result.stderr)
    report = podrun("report", job_id)
    assert report.returncode == 0, report.stderr
    shown = [line for line in report.stdout.splitlines() if line.startswith("moved to")]
    assert shown == [f"moved to {SECOND} in attempt 0: {moves[0].removeprefix('podrun: ')}"], report.stdout
    assert left_in_api(tpu_api) == ([], [])
    assert processes_of_job(job_id) == []


@pytest.mark.slow
def test_a_two_slice_job_moves_both_slices_as_one_queued_resource(home, tpu_api, lab, job_file):
    tpu_api.exhausted_zones.add(FIRST)
    run = 'echo "slice $PODRUN_SLICE of $PODRUN_NUM_SLICES"'
    spec = lifecycle_spec(job_file, run, f"{ZONES}, slices: 2, spot: true, zone_wait: 2s",
                          accelerator_type="v5p-8", delete_after="always")
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert "[w0] slice 0 of 2" in result.stdout and "[w1] slice 1 of 2" in result.stdout
    assert f"no capacity for v5p-8 in {FIRST} (still waiting after 2s): trying {SECOND}" in result.stderr
    assert len(queued_in(tpu_api, FIRST)) == 1 and len(queued_in(tpu_api, SECOND)) == 1
    read = {path for method, path in tpu_api.requests if method == "GET"}
    assert {f"/v2/projects/podrun-test/locations/{SECOND}/nodes/life-{index}" for index in (0, 1)} <= read
    deleted = [path for method, path in tpu_api.requests if method == "DELETE"]
    assert f"/v2/projects/podrun-test/locations/{FIRST}/queuedResources/life" in deleted, deleted
    assert left_in_api(tpu_api) == ([], [])
    assert processes_of_job(job_id_in(result.stderr)) == []


@pytest.mark.slow
def test_a_restart_after_a_preemption_asks_first_in_the_zone_that_just_worked(home, tpu_api, lab, job_file):
    tpu_api.exhausted_zones.add(FIRST)
    spec = lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, f"{ZONES}, spot: true, queued: true, zone_wait: 2s",
                          accelerator_type="v5p-16", restarts="{max: 1}", delete_after="always")
    job = Background("exec", spec)
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    tpu_api.exhausted_zones.clear()  # the first zone has capacity again: the restart still asks the second first
    tpu_api.preempt("life")
    job.wait_for(r"\[w1\] resumed on worker 1", timeout=90)
    assert job.finish(timeout=90) == 0, job.text
    assert len(queued_in(tpu_api, FIRST)) == 1 and len(queued_in(tpu_api, SECOND)) == 2, tpu_api.requests
    assert job.text.count(f"): trying {SECOND}") == 1 and f"trying {FIRST}" not in job.text, job.text
    assert left_in_api(tpu_api) == ([], [])
    assert processes_of_job(job_id_in(job.text)) == []


@pytest.mark.slow
def test_create_with_zones_moves_past_a_stocked_out_zone_and_asks_in_a_zone_its_table_lacks(home, tpu_api, lab):
    tpu_api.exhausted_zones.add(FIRST)
    for flags in (["--zone", FIRST, "--zones", f"{FIRST},{SECOND}"], ["--zones", f"{FIRST},us-central1"]):
        refused = podrun("create", "v5p-8", *flags)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert tpu_api.requests == []  # nothing asked for before the flags are right
    created = podrun("create", "v5p-8", "--name", "z", "--spot", "--zones", f"{FIRST},{SECOND}")
    assert created.returncode == 0, created.stderr
    assert f"podrun: no capacity for v5p-8 in {FIRST} (" in created.stderr and f"): trying {SECOND}" in created.stderr
    assert podrun("delete", "z", "--zone", SECOND, "--yes").returncode == 0
    # podrun's table lists v4 in us-central2-b alone, but Google adds zones: one warning, and the API decides
    unlisted = podrun("create", "v4-8", "--name", "z", "--zones", f"{FIRST},us-central2-b")
    assert unlisted.returncode == 0, unlisted.stderr
    warnings = [line for line in unlisted.stderr.splitlines() if line.startswith("podrun: --zones: ")]
    assert warnings == [f"podrun: --zones: v4-8 is not in {FIRST} by podrun's table, which lists us-central2-b for v4 "
                        f"(Google's TPU regions and zones, as of 2026-11-27; Google adds zones): podrun asks there all "
                        f"the same, and the API's answer decides"], unlisted.stderr
    assert f"no capacity for v4-8 in {FIRST} (" in unlisted.stderr  # asked there: the stand-in's stockout answered
    assert podrun("delete", "z", "--zone", "us-central2-b", "--yes").returncode == 0
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_a_lost_slice_whose_zone_has_no_capacity_moves_the_whole_multislice(home, tpu_api, lab, job_file):
    """recreate: slice makes a lost slice again in its zone alone; a stockout there (its request waiting past
    zone_wait) moves every slice to the next zone, as the first creation would."""
    spec = lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, f"{ZONES}, slices: 2, spot: true, zone_wait: 2s, "
                          f"recreate: slice", accelerator_type="v5p-8", restarts="{max: 1}", delete_after="always")
    job = Background("exec", spec)
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    assert len(queued_in(tpu_api, FIRST)) == 2  # a queued resource per slice
    tpu_api.exhausted_zones.add(FIRST)
    tpu_api.preempt("life-1")
    job.wait_for(r"\[w1\] resumed on worker 1", timeout=90)
    assert job.finish(timeout=90) == 0, job.text
    assert "making slice 1 (life-1) again alone; the other slices stay" in job.text
    assert f"in {FIRST} (still waiting after 2s): the whole multislice moves to {SECOND}" in job.text, job.text
    assert len(queued_in(tpu_api, FIRST)) == 3 and len(queued_in(tpu_api, SECOND)) == 2, tpu_api.requests
    assert left_in_api(tpu_api) == ([], [])
    assert processes_of_job(job_id_in(job.text)) == []
