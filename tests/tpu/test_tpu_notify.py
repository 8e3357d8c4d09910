"""Notifications of a TPU job (docs/notifications.md): a preemption that the job recovers from tells the
preemption, the restart on a TPU created again, and the success. Against the Cloud TPU stand-in, whose
workers are lab hosts; run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import pytest

from helpers import WAIT_FOR_PREEMPTION, Background, job_id_in, job_record, lifecycle_spec, notification


@pytest.mark.slow
def test_a_preempted_job_that_restarts_and_succeeds_tells_the_preemption_the_restart_and_the_success(
        home, tpu_api, lab, job_file, webhook):
    stand_in, url = webhook()
    spec = lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, "spot: true", restarts="{max: 1}", delete_after="always",
                          notify=f"{{url: '{url}'}}")
    job = Background("exec", spec)
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    tpu_api.preempt("life")
    assert job.finish(timeout=120) == 0, job.text
    job_id = job_id_in(job.text)
    why = job_record(home, job_id)["attempts"][0]["summary"]
    assert why.startswith("TPU VM life was preempted")
    assert stand_in.received == [
        notification(job_id, "job", "preemption", "preempted", 0, why),
        notification(job_id, "job", "restart", "running", 1, f"after preemption: {why}"),
        notification(job_id, "job", "success", "succeeded", 1, "every worker exited with code 0")]
