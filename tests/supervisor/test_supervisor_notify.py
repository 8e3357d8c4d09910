"""Notifications of a job handed to a supervisor host (docs/notifications.md): the host's launcher sends
them, so the laptop may close; the webhook stand-in listens on the lab's bridge, which the host reaches.
Run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import pytest

from helpers import (
    FAILS_ONCE,
    FAILS_ONCE_CAUSE,
    failed_restarted_succeeded,
    job_id_in,
    podrun,
    podrun_on_this_machine,
    wait_until,
)
from webhook_stand_in import TOKEN_PATH


@pytest.mark.slow
def test_a_supervised_job_that_fails_restarts_and_succeeds_is_told_of_by_its_supervisor_host(
        home, lab, hosts_spec, supervisor, webhook):
    from lab import BRIDGE_IP

    stand_in, url = webhook(address=BRIDGE_IP)
    spec = hosts_spec(supervisor.spec + f"notify: {{url: '{url}'}}\n" + FAILS_ONCE, hosts=(0, 1))
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    assert podrun_on_this_machine(home) == []  # the laptop may close now
    assert stand_in.wait_for(3, timeout=60) == failed_restarted_succeeded(
        job_id, "job", "worker 1 exited with code 3", FAILS_ONCE_CAUSE)
    wait_until(lambda: len(supervisor.record(job_id)["events"]) == 3, "the supervisor host to record the deliveries")
    assert [(event["event"], event["attempt"], event["delivered"], event["by"], event["to"])
            for event in supervisor.record(job_id)["events"]] == [
        ("failure", 0, True, "launcher", url.split("/")[2]), ("restart", 1, True, "launcher", url.split("/")[2]),
        ("success", 1, True, "launcher", url.split("/")[2])]
    # the webhook's URL is a secret: not on the host's disk (the job's record and logs, what its launcher said)
    assert (supervisor.job_dir(job_id) / "console" / "stderr").is_file()
    for path in supervisor.job_dir(job_id).rglob("*"):
        if path.is_file():
            assert TOKEN_PATH.encode() not in path.read_bytes(), path
