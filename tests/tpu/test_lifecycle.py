"""A job's TPU lifecycle (README: A TPU's whole life): `podrun exec` creates the TPU its spec declares, names a
preemption as such, restarts the job as `restarts` says (each attempt with its own PODRUN_ATTEMPT and
logs), and leaves in the API exactly what the user asked to keep, attached, detached (its supervisor)
and after Ctrl-C. Against the Cloud TPU stand-in, whose workers are lab hosts; run under
`flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import signal
import time

import pytest

from helpers import (
    PREEMPTED,
    WAIT_FOR_PREEMPTION,
    Background,
    job_id_in,
    job_record,
    left_in_api,
    lifecycle_spec,
    podrun,
    processes_of_job,
    wait_until,
)


@pytest.mark.slow
def test_exec_creates_the_declared_tpu_through_a_queued_spot_request_and_deletes_it_after_success(
        home, tpu_api, lab, job_file):
    spec = lifecycle_spec(job_file, 'echo "hello from $PODRUN_WORKER of $PODRUN_NUM_WORKERS"', "queued: true, spot: true",
                          delete_after="success")
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert "[w0] hello from 0 of 2" in result.stdout and "[w1] hello from 1 of 2" in result.stdout
    assert "life" in result.stderr and "v4-16" in result.stderr  # it says what it creates
    assert ("POST", "/v2/projects/podrun-test/locations/us-central2-b/queuedResources") in tpu_api.requests
    assert [method for method, _ in tpu_api.requests if method == "PATCH"] == []  # the key came with the request
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_a_tpu_of_another_type_under_the_spec_name_is_refused_in_one_line(home, tpu_api, lab, job_file):
    assert podrun("create", "v4-8", "--name", "life").returncode == 0
    result = podrun("exec", lifecycle_spec(job_file, "true"))
    assert result.returncode == 2  # the spec's target.tpu.accelerator_type, as --dry-run says it too
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "life exists as a v4-8" in lines[0] and "v4-16" in lines[0], result.stderr


@pytest.mark.slow
def test_dry_run_of_a_tpu_not_created_yet_says_what_exec_would_create_and_touches_nothing(home, tpu_api, job_file):
    result = podrun("exec", lifecycle_spec(job_file, "true", "spot: true"), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "TPU VM life does not exist: podrun exec creates it" in result.stdout
    assert "# worker 1: <worker 1>" in result.stdout
    assert all(method == "GET" for method, _ in tpu_api.requests)


@pytest.mark.slow
def test_a_preemption_mid_run_is_named_and_the_job_restarts_on_a_tpu_created_again(home, tpu_api, lab, job_file):
    spec = lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, "spot: true", restarts="{max: 1}", delete_after="always")
    job = Background("exec", spec)
    job.wait_for(r"\[w0\] attempt 0 on worker 0")
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    tpu_api.preempt("life")
    job.wait_for(r"preempted")
    job.wait_for(r"\[w0\] resumed on worker 0", timeout=90)
    assert job.finish(timeout=90) == 0, job.text
    assert "restart 1 of 1" in job.text
    # the VMs made again have new host keys, which their guest attributes publish: not a word about keys
    assert "host key" not in job.text and "no external IPs" not in job.text
    nodes = tpu_api.node_requests()
    assert len(nodes) == 2 and all(node["networkConfig"] == {"enableExternalIps": True} for _, node in nodes)
    job_id = job_id_in(job.text)
    record = job_record(home, job_id)
    assert record["attempt"] == 1 and record["attempts"][0]["state"] == "preempted"
    earlier = podrun("logs", job_id, "--attempt", "0")
    assert "attempt 0 on worker 1" in earlier.stdout and "resumed" not in earlier.stdout
    last = podrun("logs", job_id)
    assert "attempt 1 on worker 1" in last.stdout and "resumed on worker 1" in last.stdout
    listed = podrun("jobs")
    assert "succeeded (1 restart)" in listed.stdout
    assert left_in_api(tpu_api) == ([], [])
    assert processes_of_job(job_id) == []


@pytest.mark.slow
def test_a_preemption_with_no_restart_left_exits_75_and_leaves_nothing_in_the_api(home, tpu_api, lab, job_file):
    job = Background("exec", lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, "queued: true, spot: true"))
    job.wait_for(r"\[w1\] attempt 0 on worker 1")
    tpu_api.preempt("life")
    assert job.finish() == PREEMPTED, job.text
    assert "preempted: TPU VM life was preempted (node PREEMPTED, queued resource life SUSPENDED)" in job.text
    assert "lost its connection" not in job.text
    job_id = job_id_in(job.text)
    assert job_record(home, job_id)["state"] == "preempted"
    assert "preempted" in podrun("jobs").stdout
    assert left_in_api(tpu_api) == ([], [])  # the dead node and its suspended request were deleted


def test_failure_restarts_run_again_with_the_attempt_number_until_one_succeeds(home, job_file, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.2")  # not the default 1 s, then 2 s: the waits are not under test
    # Only worker 1 fails, after it printed: worker 0 may be stopped before its echo when a failure stops it.
    spec = job_file("target: {local: {workers: 2}}\n"
                    "run: |\n"
                    "  echo \"attempt $PODRUN_ATTEMPT\"\n"
                    "  test \"$PODRUN_ATTEMPT\" = 2 && exit 0\n"
                    "  test \"$PODRUN_WORKER\" = 1 && exit 3\n"
                    "  exec sleep 600\n"
                    "restarts: {max: 2, on: [failure]}\n")
    result = podrun("exec", spec, "--no-collapse")  # worker 1's own line, whatever worker 0 printed meanwhile
    assert result.returncode == 0, result.stderr
    assert "restart 1 of 2" in result.stderr and "restart 2 of 2" in result.stderr
    for attempt in range(3):
        assert f"[w1] attempt {attempt}" in result.stdout
    job_id = job_id_in(result.stderr)
    assert "attempt 1" in podrun("logs", job_id, "--attempt", "1", "--worker", "1").stdout
    assert podrun("logs", job_id, "--attempt", "3").returncode == 2
    again = podrun("exec", spec, "--restarts", "1")
    assert again.returncode == 3 and "no restart left" in again.stderr


def test_failure_restarts_only_for_the_exit_codes_named(home, job_file, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.2")
    spec = job_file("target: {local: {workers: 2}}\n"
                    "run: 'test \"$PODRUN_ATTEMPT\" = 0 && exit 42; exit 3'\n"
                    "restarts: {max: 3, on: [failure], exit_codes: [42]}\n")
    result = podrun("exec", spec)
    assert result.returncode == 3, result.stderr
    assert "restart 1 of 3 in 0.2s: running again on the same workers" in result.stderr
    assert "no restart: exit code 3 is not one of restarts.exit_codes (42)" in result.stderr
    assert "restart 2" not in result.stderr


def test_a_job_that_keeps_failing_at_once_stops_restarting_early_with_growing_waits(home, job_file, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.2")
    spec = job_file("target: {local: {workers: 2}}\nrun: exit 3\nrestarts: {max: 10, on: [failure]}\n")
    result = podrun("exec", spec)
    assert result.returncode == 3, result.stderr
    assert "restart 1 of 10 in 0.2s" in result.stderr and "restart 2 of 10 in 0.4s" in result.stderr
    assert "no restart: the last 3 attempts each ended within 60s of starting" in result.stderr
    assert "restart 3" not in result.stderr


def test_a_restart_setting_podrun_cannot_use_is_one_line_before_anything_starts(home, job_file, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "soon")
    result = podrun("exec", job_file("target: {local: {workers: 2}}\nrun: exit 3\nrestarts: {on: [failure]}\n"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "podrun: error: PODRUN_RESTART_BACKOFF='soon': expected a number of seconds 0 or more, e.g. 1"]
    assert not (home / "jobs").exists() or not any((home / "jobs").iterdir())


@pytest.mark.parametrize("restarts, field, expected", [
    ("{on: [preemption], exit_codes: [42]}", "restarts.exit_codes", "does not hold failure"),
    ("{on: [failure], exit_codes: [0]}", "restarts.exit_codes.0", "an exit code from 1 to 255"),
])
def test_bad_restart_exit_codes_are_one_line(home, job_file, restarts, field, expected):
    spec = job_file(f"target: {{local: {{workers: 2}}}}\nrun: 'true'\nrestarts: {restarts}\n")
    result = podrun("validate", spec)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{spec}: {field}: " in lines[0] and expected in lines[0], result.stderr


@pytest.mark.slow
def test_ctrl_c_while_queued_deletes_the_request_even_with_a_second_ctrl_c(home, tpu_api, lab, job_file):
    tpu_api.withhold_capacity(3600)
    job = Background("exec", lifecycle_spec(job_file, "true", "queued: true"))
    job.wait_for("WAITING_FOR_RESOURCES")
    job.process.send_signal(signal.SIGINT)
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130, job.text
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_down_deletes_the_tpu_after_ctrl_c_mid_run(home, tpu_api, lab, job_file):
    job = Background("exec", lifecycle_spec(job_file, "echo started; exec sleep 600"), "--down")
    job.wait_for(r"\[w0-1\] started")
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130, job.text
    assert left_in_api(tpu_api) == ([], [])
    assert processes_of_job(job_id_in(job.text)) == []


@pytest.mark.slow
def test_a_detached_job_is_recovered_by_its_supervisor_and_stop_ends_both(home, tpu_api, lab, job_file):
    run = ('echo "attempt $PODRUN_ATTEMPT on worker $PODRUN_WORKER"; exec sleep 600')
    spec = lifecycle_spec(job_file, run, "spot: true", restarts="{max: 2}", delete_after="always")
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    assert "supervisor" in started.stderr
    job_id = job_id_in(started.stderr)
    assert "supervised" in podrun("jobs").stdout
    tpu_api.preempt("life")
    deadline = time.monotonic() + 90
    while "attempt 1 on worker 1" not in podrun("logs", job_id, "--worker", "1").stdout:
        assert time.monotonic() < deadline, podrun("logs", job_id).stdout
        time.sleep(0.5)
    assert job_record(home, job_id)["attempts"][0]["state"] == "preempted"
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    assert job_record(home, job_id)["state"] == "stopped"
    assert left_in_api(tpu_api) == ([], [])
    assert processes_of_job(job_id) == []


# (phase, the line that marks it, what the API keeps with delete_after: never) for a queued spot TPU
# that exec creates; `recovering`: after a preemption, while the TPU is deleted and created again
PHASES = [
    ("queued", r"READY: WAITING_FOR_RESOURCES", ([], [])),
    ("provisioning", r"READY: PROVISIONING", ([], [])),
    ("shipping", r"── ship", (["life"], ["life"])),
    ("running", r"\[w1\] attempt 0", (["life"], ["life"])),
    ("recovering", r"restart 1 of 1: creating the TPU again", ([], [])),
]


@pytest.mark.slow
@pytest.mark.parametrize("interrupts", [1, 2], ids=["ctrl-c", "ctrl-c twice"])
@pytest.mark.parametrize("phase, marker, kept", PHASES, ids=[phase for phase, _, _ in PHASES])
def test_an_interrupt_in_any_phase_leaves_only_what_the_user_keeps(home, tpu_api, lab, job_file, phase, marker, kept,
                                                                   interrupts):
    if phase == "queued":
        tpu_api.withhold_capacity(3600)
    if phase == "provisioning":
        tpu_api.operation_delay_s = 3  # each state of the request lasts 3 s
    # code never shipped before (the lab hosts keep earlier tests' code), big enough to take a moment
    code = {"data.txt": secrets.token_hex(4_000_000 if phase == "shipping" else 8)}
    job = Background("exec", lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, "queued: true, spot: true", code,
                                            restarts="{max: 1}"))
    if phase == "recovering":
        job.wait_for(r"\[w1\] attempt 0")
        tpu_api.operation_delay_s = 3  # the deletion and the new request take a while
        tpu_api.preempt("life")
    job.wait_for(marker, timeout=90)
    for _ in range(interrupts):
        job.process.send_signal(signal.SIGINT)
    assert job.finish(timeout=90) == 130, job.text
    assert "Traceback" not in job.text
    tpu_api.operation_delay_s = 0.3
    assert left_in_api(tpu_api) == kept, job.text
    if "job job-" in job.text:
        assert processes_of_job(job_id_in(job.text)) == []


@pytest.mark.slow
@pytest.mark.parametrize("delete_after, code, kept", [
    ("never", 0, ([], ["life"])), ("success", 0, ([], [])), ("success", 3, ([], ["life"])), ("always", 3, ([], [])),
])
def test_delete_after_keeps_or_deletes_the_tpu_as_the_job_ended(home, tpu_api, lab, job_file, delete_after, code,
                                                                 kept):
    result = podrun("exec", lifecycle_spec(job_file, f"exit {code}", delete_after=delete_after))
    assert result.returncode == code, result.stderr
    assert left_in_api(tpu_api) == kept


@pytest.mark.slow
def test_a_killed_supervisor_leaves_the_tpu_to_a_podrun_delete_that_stop_names(home, tpu_api, lab, job_file):
    spec = lifecycle_spec(job_file, "exec sleep 600", delete_after="always")
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0 and "a supervisor" in started.stderr, started.stderr
    job_id = job_id_in(started.stderr)
    os.kill(job_record(home, job_id)["supervisor"]["pid"], signal.SIGKILL)
    wait_until(lambda: "supervisor lost" in podrun("jobs").stdout, "podrun jobs to show the supervisor lost")
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    command = re.search(r"`(podrun delete life [^`]*)`", stopped.stderr)
    assert command, stopped.stderr
    assert processes_of_job(job_id) == []
    assert left_in_api(tpu_api) == ([], ["life"])  # the supervisor's duty is the user's now
    assert podrun(*shlex.split(command[1])[1:]).returncode == 0
    assert left_in_api(tpu_api) == ([], [])


def jobs_state(job_id: str) -> str:
    """The job's STATE column in `podrun jobs`, as a user reads it."""
    row = next(line for line in podrun("jobs").stdout.splitlines() if line.startswith(job_id))
    return re.split(r"\s{2,}", row)[3]


@pytest.mark.slow
@pytest.mark.parametrize("denied", [False, True])
def test_a_finished_jobs_state_says_its_tpu_is_being_deleted_until_it_is_or_that_it_failed(
        home, tpu_api, lab, job_file, tmp_path, denied):
    """A supervised spot TPU job with delete_after: always read `succeeded` while its queued resource was still
    in the API, billed: the state says so until the deletion is done, and says it when the deletion failed."""
    go = tmp_path / "go"
    spec = lifecycle_spec(job_file, f"while [ ! -e {go} ]; do sleep 0.1; done", "spot: true", delete_after="always")
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    tpu_api.operation_delay_s = 4  # each deletion takes that long from now on
    if denied:  # this account may not delete it: Google's 403
        tpu_api.deny(open(os.environ["CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"]).read().strip(), "tpu.nodes.delete")
    go.touch()

    wait_until(lambda: not jobs_state(job_id).startswith("running"), "the job's end", timeout=60)
    if not denied:
        assert jobs_state(job_id) == "succeeded; deleting its TPU"
        assert left_in_api(tpu_api) == ([], [])  # the deletion's own operation, once it finished
        wait_until(lambda: jobs_state(job_id) == "succeeded", "the deletion's end", timeout=60)
        assert job_record(home, job_id)["giving_back"] is None
    else:
        wait_until(lambda: "failed" in jobs_state(job_id), "the deletion's failure", timeout=60)
        assert jobs_state(job_id).startswith("succeeded; deleting its TPU failed: ")
        assert "tpu.nodes.delete" in job_record(home, job_id)["giving_back"]
        assert left_in_api(tpu_api) == ([], ["life"])
