"""`podrun create --queued`, `list`, `describe` and `delete` with queued resources (README: A TPU's whole life),
against the Cloud TPU stand-in; the real gcloud reads what podrun asked for. Run under
`flock /tmp/podrun-lab.lock`: the stand-in's capacity is the lab."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from helpers import ZONE, Background, crashed, left_in_api, podrun, stderr_lines_without_traceback, wait_until

PARENT = f"projects/podrun-test/locations/{ZONE}"


def gcloud_queued(*args: str):
    result = subprocess.run(["gcloud", "compute", "tpus", "queued-resources", *args, f"--zone={ZONE}",
                             "--format=json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def queued_reads(tpu_api) -> int:
    return sum(method == "GET" and "/queuedResources/" in path for method, path in tpu_api.requests)


@pytest.mark.slow
@pytest.mark.gcloud
def test_a_queued_spot_request_goes_active_and_gcloud_reads_what_podrun_asked_for(home, tpu_api, lab):
    created = podrun("create", "v4-16", "--name", "qr", "--queued", "--spot", "--valid-for", "6h")
    assert created.returncode == 0, created.stderr
    assert ("podrun: creating TPU VM qr (v4-16: 2 workers, runtime tpu-ubuntu2204-base, spot, queued for at most 6h) "
            f"in podrun-test/{ZONE}") in created.stderr
    assert "waiting for qr to be READY: WAITING_FOR_RESOURCES" in created.stderr
    assert "state        READY" in created.stdout
    described = gcloud_queued("describe", "qr")
    assert described["state"]["state"] == "ACTIVE" and "spot" in described
    assert described["queueingPolicy"]["validUntilDuration"] == "21600s"
    node_spec = described["tpu"]["nodeSpec"][0]
    assert node_spec["nodeId"] == "qr" and node_spec["node"]["acceleratorType"] == "v4-16"
    assert [resource["name"] for resource in gcloud_queued("list")] == [f"{PARENT}/queuedResources/qr"]

    listed = podrun("list")
    row = next(line for line in listed.stdout.splitlines() if line.startswith("qr "))
    assert row.split()[:4] == ["qr", "READY", "v4-16", "2"] and row.endswith("spot, queued")
    shown = podrun("describe", "qr").stdout
    assert "queued resource qr" in shown and "state        ACTIVE" in shown and "valid for    21600s" in shown

    deleted = podrun("delete", "qr", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert "podrun: deleting queued resource qr and its TPU VM" in deleted.stderr
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_a_request_waiting_for_capacity_is_shown_polled_with_backoff_and_listed(home, tpu_api, lab):
    tpu_api.withhold_capacity(8)
    creating = Background("create", "v4-8", "--name", "waits", "--queued")
    creating.wait_for(r"waiting for waits to be READY: WAITING_FOR_RESOURCES after \d+s")
    listed = podrun("list")
    assert any(line.split()[:3] == ["waits", "WAITING_FOR_RESOURCES", "(queued)"] for line in listed.stdout.splitlines())
    assert "state        WAITING_FOR_RESOURCES" in podrun("describe", "waits").stdout  # no node yet
    assert creating.finish() == 0, creating.text
    assert "podrun: waits is READY after" in creating.text
    # 0.5 s, then each wait 1.5 times the last: about 9 reads in 8 s, where a fixed 0.5 s would make 16
    assert queued_reads(tpu_api) <= 12


@pytest.mark.slow
@pytest.mark.parametrize("interrupts", [1, 2])
def test_ctrl_c_while_queued_deletes_the_request(home, tpu_api, lab, interrupts):
    tpu_api.withhold_capacity(3600)
    creating = Background("create", "v4-8", "--name", "qr", "--queued", "--spot")
    creating.wait_for("WAITING_FOR_RESOURCES")
    for _ in range(interrupts):
        creating.process.send_signal(signal.SIGINT)
    assert creating.finish() == 130
    assert "podrun: interrupted: deleting what podrun asked for (qr), so that nothing is left queued or billing" \
        in creating.lines
    assert not crashed(creating.text)
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_no_wait_returns_once_the_request_is_accepted(home, tpu_api, lab):
    tpu_api.withhold_capacity(3600)
    created = podrun("create", "v4-8", "--name", "qr", "--queued", "--no-wait")
    assert created.returncode == 0, created.stderr
    assert "the queued request for qr was accepted" in created.stderr
    assert tpu_api.queued[f"{PARENT}/queuedResources/qr"].resource["state"]["state"] in ("ACCEPTED",
                                                                                          "WAITING_FOR_RESOURCES")
    assert podrun("delete", "qr", "--yes").returncode == 0
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_a_request_that_expires_in_the_queue_fails_in_one_line_and_is_deleted(home, tpu_api, lab):
    tpu_api.withhold_capacity(3600)
    created = podrun("create", "v4-8", "--name", "qr", "--queued", "--valid-for", "2s")
    assert created.returncode == 1
    assert stderr_lines_without_traceback(created.stderr)[-1].startswith(
        "podrun: error: queued resource qr FAILED: The queued resource request could not be satisfied before its "
        "valid until time")
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_a_preempted_spot_tpu_is_named_by_create_and_replaced_with_replace(home, tpu_api, lab):
    assert podrun("create", "v4-8", "--name", "qr", "--queued", "--spot").returncode == 0
    tpu_api.preempt("qr")
    wait_until(lambda: podrun("describe", "qr").stdout.count("PREEMPTED"), "the API to show the preemption")
    again = podrun("create", "v4-8", "--name", "qr", "--queued", "--spot")
    assert again.returncode == 1
    assert stderr_lines_without_traceback(again.stderr) == [
        "podrun: error: TPU VM qr was preempted (node PREEMPTED, queued resource SUSPENDED) and keeps its name and "
        "quota until deleted; `podrun delete qr --zone us-central2-b --project podrun-test` clears it (or "
        "`podrun create ... --replace`)"]
    replaced = podrun("create", "v4-8", "--name", "qr", "--queued", "--spot", "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert "state        READY" in replaced.stdout
    assert left_in_api(tpu_api) == (["qr"], ["qr"])


def test_create_refuses_valid_for_without_a_queue_and_spot_with_a_reservation(home):
    alone = podrun("create", "v4-8", "--valid-for", "1h")
    assert alone.returncode == 2
    assert stderr_lines_without_traceback(alone.stderr) == [
        "podrun: error: --valid-for: how long a queued request may wait for capacity; add --queued"]
    both = podrun("create", "v4-8", "--spot", "--reservation", "r")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    bad = podrun("create", "v4-8", "--queued", "--valid-for", "soon")
    assert bad.returncode == 2 and "--valid-for 'soon': expected a duration above 0" in bad.stderr
