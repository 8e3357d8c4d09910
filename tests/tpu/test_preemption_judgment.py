"""A lost TPU worker judged as Google's order of events demands (issue 25, part 1): SSH breaks at once
and the API shows the preemption later, or never; the host may come back; the node may go away while
SSH still holds. Against the Cloud TPU stand-in, whose workers are lab hosts; run under
`flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import (
    PREEMPTED,
    WAIT_FOR_PREEMPTION,
    Background,
    job_id_in,
    job_record,
    left_in_api,
    lifecycle_spec,
    live_processes,
    podrun,
    processes_of_job,
    wait_until,
)

LOST = 255


@pytest.mark.slow
def test_a_preemption_the_api_shows_20s_late_is_recovered(home, tpu_api, lab, job_file):
    tpu_api.preemption_lag_s = 20
    spec = lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, "spot: true", restarts="{max: 1}", delete_after="always")
    job = Background("exec", spec)
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    preempted_at = time.monotonic()
    tpu_api.preempt("life")
    job.wait_for(r"dropped (its|their) connection: waiting up to 180s")
    job.wait_for(r"preempted \(node PREEMPTED", timeout=60)
    assert time.monotonic() - preempted_at >= 20  # it waited for the API, not for a guess
    job.wait_for(r"\[w1\] resumed on worker 1", timeout=90)
    assert job.finish(timeout=60) == 0, job.text
    assert "lost its connection" not in job.text
    record = job_record(home, job_id_in(job.text))
    assert record["attempts"][0]["state"] == "preempted"
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
@pytest.mark.parametrize("lag", [6, math.inf], ids=["later than the bound", "never"])
def test_an_api_that_shows_nothing_within_the_bound_leaves_the_job_lost_and_deletes_as_asked(
        home, tpu_api, lab, job_file, monkeypatch, lag):
    monkeypatch.setenv("PODRUN_LOST_WORKER_WAIT", "2")
    tpu_api.preemption_lag_s = lag
    spec = lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, "spot: true", restarts="{max: 1, on: [preemption]}",
                          delete_after="always")
    job = Background("exec", spec)
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    tpu_api.preempt("life")
    assert job.finish(timeout=60) == LOST, job.text
    assert "the API still shows the TPU serving" in job.text and "restart" not in job.text
    assert job_record(home, job_id_in(job.text))["state"] == "failed"
    assert left_in_api(tpu_api) == ([], [])  # delete_after: always, preempted or not


@pytest.mark.slow
def test_a_host_that_answers_again_without_the_job_is_judged_lost_at_once(home, tpu_api, lab, job_file):
    spec = lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, restarts="{max: 1}", delete_after="always")
    job = Background("exec", spec)
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    dropped_at = time.monotonic()
    listener = lab.hosts[tpu_api.node_endpoints_of("life")[1].host_index].sshd.pid
    subprocess.run(["pkill", "-KILL", "-P", str(listener)], check=True)  # worker 1's connection, not its sshd
    assert job.finish(timeout=60) == LOST, job.text
    assert time.monotonic() - dropped_at < 30  # not the 180 s bound
    assert "answered again, with none of the job's processes left" in job.text
    assert "lost its connection" in job.text and "restart" not in job.text
    assert processes_of_job(job_id_in(job.text)) == []
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_ctrl_c_while_the_loss_is_judged_stops_and_deletes_as_asked(home, tpu_api, lab, job_file):
    tpu_api.preemption_lag_s = math.inf
    job = Background("exec", lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, "spot: true"), "--down")
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    tpu_api.preempt("life")
    job.wait_for(r"dropped (its|their) connection: waiting")
    interrupted_at = time.monotonic()
    job.process.send_signal(signal.SIGINT)
    assert job.finish(timeout=60) == 130, job.text
    assert time.monotonic() - interrupted_at < 20
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_a_node_taken_out_of_service_while_ssh_holds_stops_the_job_as_preempted(home, tpu_api, lab, job_file,
                                                                                 monkeypatch):
    monkeypatch.setenv("PODRUN_TPU_WATCH_INTERVAL", "1")
    job = Background("exec", lifecycle_spec(job_file, WAIT_FOR_PREEMPTION), "--down")
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    tpu_api.start_maintenance("life")
    assert job.finish(timeout=60) == PREEMPTED, job.text
    assert "TPU VM life was taken out of service (node READY, health UNHEALTHY_MAINTENANCE)" in job.text
    assert job_record(home, job_id_in(job.text))["state"] == "preempted"
    assert processes_of_job(job_id_in(job.text)) == []
    assert left_in_api(tpu_api) == ([], [])


@pytest.fixture
def metadata_server(lab):
    """The GCE metadata stand-in on the lab's bridge, where every lab host reaches it."""
    from metadata_stand_in import MetadataStandIn

    from lab import BRIDGE_IP

    server = MetadataStandIn()
    yield server, server.serve(BRIDGE_IP)
    server.shutdown()


def preempted_by_its_notice(tpu_api, metadata_server, spec) -> tuple[Background, float]:
    """The spec's job run on the stand-in's TPU with the metadata stand-in as its VMs' metadata server, which
    announces the preemption once every agent waits for it (the API never shows it): the job, and when."""
    server, address = metadata_server
    tpu_api.preemption_lag_s = math.inf  # the API never catches up: the notice alone decides
    spec.write_text(spec.read_text().replace("env: {", f"env: {{GCE_METADATA_HOST: '{address}', "))
    job = Background("exec", spec, "--down")
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    wait_until(lambda: server.waiting >= 4, "every agent waiting for a change of both values")
    announced_at = time.monotonic()
    server.set("preempted", "TRUE")
    return job, announced_at


@pytest.mark.slow
def test_the_vms_own_notice_stops_the_job_at_once_and_names_the_worker(home, tpu_api, lab, job_file, metadata_server):
    run = ('trap \'echo "SIGTERM on worker $PODRUN_WORKER"; exit 143\' TERM\n'
           'echo "attempt $PODRUN_ATTEMPT on worker $PODRUN_WORKER"\nsleep 600 & wait')
    job, announced_at = preempted_by_its_notice(tpu_api, metadata_server, lifecycle_spec(job_file, run, "spot: true"))
    job.wait_for(r"worker \d: the VM announced its preemption: stopping the job on every worker")
    assert job.finish(timeout=60) == PREEMPTED, job.text
    assert time.monotonic() - announced_at < 10  # well inside the ~30 s Google gives
    assert "[w0] SIGTERM on worker 0" in job.text and "[w1] SIGTERM on worker 1" in job.text
    assert job_record(home, job_id_in(job.text))["state"] == "preempted"
    assert processes_of_job(job_id_in(job.text)) == []
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_on_the_vms_notice_on_preempt_runs_everywhere_and_the_job_gets_the_notices_bound_not_its_stop_grace(
        home, tpu_api, lab, job_file, metadata_server):
    from podrun.remote.step import NOTICE_BOUND_S

    run = ('trap \'echo "SIGTERM on worker $PODRUN_WORKER, saving"\' TERM\n'  # and never done saving
           'echo "attempt $PODRUN_ATTEMPT on worker $PODRUN_WORKER"\nwhile :; do sleep 0.2; done')
    spec = lifecycle_spec(job_file, run, "spot: true", stop_grace="5m",
                          on_preempt='\'echo "on_preempt on worker $PODRUN_WORKER: $PODRUN_NOTICE"; sleep 600\'')
    job, announced_at = preempted_by_its_notice(tpu_api, metadata_server, spec)
    assert job.finish(timeout=90) == PREEMPTED, job.text
    took = time.monotonic() - announced_at
    assert NOTICE_BOUND_S <= took < NOTICE_BOUND_S + 5, took  # SIGKILL at the bound, not after stop_grace's 5 m
    for worker in (0, 1):
        assert f"[w{worker}] on_preempt on worker {worker}: the VM announced its preemption" in job.text
        assert f"[w{worker}] SIGTERM on worker {worker}, saving" in job.text
    assert processes_of_job(job_id_in(job.text)) == []  # on_preempt's sleep too
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_a_detached_jobs_supervisor_sees_the_node_go_while_ssh_holds_and_recovers_it(home, tpu_api, lab, job_file,
                                                                                     monkeypatch):
    monkeypatch.setenv("PODRUN_TPU_WATCH_INTERVAL", "1")  # the supervisor, forked from exec, reads it too
    run = 'echo "attempt $PODRUN_ATTEMPT on worker $PODRUN_WORKER"; exec sleep 600'
    started = podrun("exec", lifecycle_spec(job_file, run, restarts="{max: 1}", delete_after="always"), "--detach")
    assert started.returncode == 0 and "a supervisor" in started.stderr, started.stderr
    job_id = job_id_in(started.stderr)
    tpu_api.start_maintenance("life")
    wait_until(lambda: "attempt 1 on worker 1" in podrun("logs", job_id, "--worker", "1").stdout,
               "the supervisor to run the job again on a TPU made again", timeout=90)
    first = job_record(home, job_id)["attempts"][0]
    assert first["state"] == "preempted" and "health UNHEALTHY_MAINTENANCE" in first["summary"], first
    assert podrun("stop", job_id).returncode == 0
    assert processes_of_job(job_id) == []
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_a_preemption_whose_shutdown_kills_an_agent_before_its_connection_goes_is_judged_one(
        home, tpu_api, lab, job_file):
    """A VM's shutdown kills processes before its network goes: worker 0's agent killed by SIGKILL while its
    connection still holds is judged against the API as a lost worker is, and the job recovers from the
    preemption (was: reported at once as a failure, 137, and not restarted)."""
    tpu_api.preemption_lag_s = 2
    spec = lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, "spot: true", restarts="{max: 1, on: [preemption]}",
                          delete_after="always")
    job = Background("exec", spec)
    job.wait_for(r"\[w0\] attempt 0 on worker 0")
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    job_id = job_id_in(job.text)
    [program] = [pid for pid, command, environ in live_processes() if command.startswith("sleep 600")
                 and f"PODRUN_JOB_ID={job_id}".encode() in environ and b"PODRUN_WORKER=0" in environ]
    agent = int(Path(f"/proc/{program}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
    os.kill(agent, signal.SIGKILL)
    tpu_api.preempt("life")
    assert job.finish(timeout=120) == 0, job.text
    assert "its agent was killed by SIGKILL" not in job.text
    assert re.search(r"preempted \(node PREEMPTED", job.text), job.text
    assert "[w0] resumed on worker 0" in job.text
    assert left_in_api(tpu_api) == ([], [])
