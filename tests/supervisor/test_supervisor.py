"""Close the laptop (README: Close the laptop): with `supervisor: {host, podrun}` in the spec, `podrun exec`
hands the job over to that host, which runs its whole life (create the TPU, run, recover preemptions,
delete it) with its own credentials, and keeps its record and every worker's log; the laptop (this
process) never runs any of it, and `podrun jobs`, `logs` and `stop` reach the job through the supervisor.

A lab host plays the supervisor (the `supervisor` fixture: its own gcloud token, this checkout's
podrun); the TPU API stand-in answers on the lab's network (`tpu_api_on_lab`), where it tells who sent
each request. Run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

from podrun import __version__

from helpers import (
    LAPTOP_TOKEN,
    SUPERVISOR_HOST,
    SUPERVISOR_TOKEN,
    UNTIL_RELEASED,
    Background,
    anything_of_the_job,
    as_run,
    job_id_in,
    left_in_api,
    listed_as_json,
    packets_dropped,
    podrun,
    podrun_on_this_machine,
    processes_of_job,
    require_nft,
    sshd_sessions,
    supervised_tpu_spec,
    wait_until,
    worker_log_on_the_laptop,
)

# --- the lab itself: what the tests below stand on

def test_the_supervisor_host_reaches_the_api_on_the_labs_network_with_its_own_token(lab, tpu_api_on_lab, supervisor):
    from lab import BRIDGE_IP

    url = os.environ["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"]
    on_laptop = podrun("list")
    assert on_laptop.returncode == 0, on_laptop.stderr
    assert tpu_api_on_lab.callers() == {(BRIDGE_IP, LAPTOP_TOKEN)}
    sent = len(tpu_api_on_lab.received)
    # what the laptop would send it: the project, zone and endpoint; the token is the host's own
    command = (f"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU={url} CLOUDSDK_CORE_PROJECT=podrun-test "
               f"CLOUDSDK_COMPUTE_ZONE=us-central2-b {supervisor.podrun} list")
    there = subprocess.run([*lab.ssh_args(SUPERVISOR_HOST), command], capture_output=True, text=True, timeout=60)
    assert there.returncode == 0, there.stderr
    assert tpu_api_on_lab.callers(since=sent) == {(supervisor.ip, SUPERVISOR_TOKEN)}


def test_the_stand_in_on_the_labs_network_never_hands_out_the_supervisor_host(lab, tpu_api_on_lab, supervisor):
    # four lab hosts, one of them the supervisor's: a v4-32 (4 hosts) does not fit
    result = podrun("create", "v4-32", "--name", "big")
    assert result.returncode != 0 and "no more capacity" in result.stderr, result.stderr
    assert podrun("create", "v4-16", "--name", "life").returncode == 0
    assert SUPERVISOR_HOST not in [e.host_index for e in tpu_api_on_lab.node_endpoints_of("life")]


# --- handing jobs over

def row_of(job_id: str) -> str:
    """The job's row in the laptop's `podrun jobs` (a pipe: whole rows)."""
    listed = podrun("jobs")
    assert listed.returncode == 0, listed.stderr
    return next(line for line in listed.stdout.splitlines() if line.startswith(job_id))


@pytest.mark.slow
def test_a_preempted_spot_job_is_recovered_by_its_supervisor_alone_and_stop_leaves_nothing(
        home, lab, tpu_api_on_lab, supervisor, job_file):
    run = 'echo "attempt $PODRUN_ATTEMPT on worker $PODRUN_WORKER"; exec sleep 600'
    started = podrun("exec", supervised_tpu_spec(job_file, lab, supervisor, run), "--detach")
    assert started.returncode == 0, started.stderr
    handed_over = len(tpu_api_on_lab.received)
    job_id = job_id_in(started.stderr)
    assert supervisor.ip in started.stderr
    assert podrun_on_this_machine(home) == []  # the laptop may close now
    assert supervisor.record(job_id)["state"] == "running"
    wait_until(lambda: "attempt 0 on worker 1" in worker_log_on_the_laptop(job_id, 1),
               "the laptop's `podrun logs` to show the first attempt")

    tpu_api_on_lab.preempt("life")
    wait_until(lambda: "attempt 1 on worker 1" in worker_log_on_the_laptop(job_id, 1),
               "the laptop's `podrun logs` to show the attempt on the TPU created again", timeout=90)
    record = supervisor.record(job_id)
    assert record["attempt"] == 1 and record["attempts"][0]["state"] == "preempted"
    # the supervisor keeps every attempt's logs
    assert "attempt 0 on worker 1" in (supervisor.job_dir(job_id) / "w1.log").read_text()
    assert "attempt 1 on worker 1" in (supervisor.job_dir(job_id) / "attempt-1" / "w1.log").read_text()
    row = row_of(job_id)
    assert "running" in row and supervisor.ip in row
    assert podrun_on_this_machine(home) == []

    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    assert supervisor.record(job_id)["state"] == "stopped"
    assert listed_as_json(job_id)["state"] == "stopped"
    assert anything_of_the_job(job_id) == []
    assert left_in_api(tpu_api_on_lab) == ([], [])
    # the supervisor alone spoke to the API once it had the job, with its own token; every change was its
    assert tpu_api_on_lab.callers(since=handed_over) == {(supervisor.ip, SUPERVISOR_TOKEN)}
    changes = {(request.client, request.token) for request in tpu_api_on_lab.received if request.method != "GET"}
    assert changes == {(supervisor.ip, SUPERVISOR_TOKEN)}


@pytest.mark.slow
def test_jobs_and_logs_on_the_laptop_show_a_detached_job_through_its_supervisor(home, lab, hosts_spec, supervisor,
                                                                                tmp_path):
    release = tmp_path / "release"
    spec = hosts_spec(supervisor.spec + as_run(UNTIL_RELEASED.format(release=release)))
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    assert supervisor.ip in started.stderr
    assert podrun_on_this_machine(home) == []

    row = row_of(job_id)
    assert "running" in row and supervisor.ip in row
    listed = listed_as_json(job_id)
    assert listed["state"] == "running" and supervisor.ip in listed["supervised_by"]["host"]
    following = Background("logs", "-f", job_id)
    following.wait_for(r"^\[w1\] started on worker 1$")
    release.touch()
    following.wait_for(r"^\[w2\] finished on worker 2$")
    assert following.finish(timeout=60) == 0, following.text

    everything = podrun("logs", job_id)
    assert everything.returncode == 0, everything.stderr
    for worker in range(3):
        assert f"[w{worker}] started on worker {worker}" in everything.stdout
        assert f"[w{worker}] finished on worker {worker}" in everything.stdout
    one = podrun("logs", job_id, "--worker", "1")
    assert one.stdout.splitlines() == ["started on worker 1", "finished on worker 1"], one.stdout
    # what the laptop showed is the supervisor's copy
    assert (supervisor.job_dir(job_id) / "w1.log").read_text().splitlines() == one.stdout.splitlines()
    assert supervisor.record(job_id)["state"] == "succeeded"
    listed = listed_as_json(job_id)
    assert listed["state"] == "succeeded" and supervisor.ip in listed["supervised_by"]["host"]


@pytest.mark.slow
def test_an_attached_job_through_a_supervisor_streams_its_lines_and_exits_with_the_jobs_code(home, lab, hosts_spec,
                                                                                           supervisor, tmp_path):
    # worker 2 fails once the others are done (fail fast would stop them before they print)
    run = (f'echo "hello from worker $PODRUN_WORKER on $(hostname)"\n'
           f'touch {tmp_path}/done-$PODRUN_WORKER\n'
           f'[ "$PODRUN_WORKER" = 2 ] || exit 0\n'
           f'until [ -e {tmp_path}/done-0 ] && [ -e {tmp_path}/done-1 ]; do sleep 0.1; done\n'
           f'exit 7\n')
    spec = hosts_spec(supervisor.spec + as_run(run))
    result = podrun("exec", spec)
    assert result.returncode == 7, result.stderr
    assert supervisor.ip in result.stderr
    for worker in range(3):
        assert f"[w{worker}] hello from worker {worker} on podrun-lab{worker}" in result.stdout
    job_id = job_id_in(result.stderr)
    assert supervisor.record(job_id)["state"] == "failed"
    assert anything_of_the_job(job_id) == []


@pytest.mark.slow
def test_ctrl_c_on_the_laptop_stops_a_supervised_job_everywhere(home, lab, hosts_spec, supervisor):
    spec = hosts_spec(supervisor.spec + 'run: echo "waiting on worker $PODRUN_WORKER"; exec sleep 600\n')
    job = Background("exec", spec)
    for worker in range(3):
        job.wait_for(rf"^\[w{worker}\] waiting on worker {worker}$")
    job_id = job_id_in(job.text)
    # the laptop runs its own `exec` and nothing else of the job: the workers' and their watcher's
    # processes are on the lab hosts
    assert [line.split()[0] for line in podrun_on_this_machine(home)] == [str(job.process.pid)]
    assert len(processes_of_job(job_id)) >= 3
    job.process.send_signal(signal.SIGINT)
    assert job.finish(timeout=60) == 130, job.text
    assert "Traceback" not in job.text
    assert anything_of_the_job(job_id) == []
    assert supervisor.record(job_id)["state"] == "stopped"
    assert listed_as_json(job_id)["state"] == "stopped"


@contextlib.contextmanager
def cut_off(lab, supervisor, how: str):
    """The supervisor out of the laptop's reach until the block ends, while it goes on with its jobs:
    its sshd stopped (the host answers, its port refuses), or every packet from this machine to its
    port 22 dropped (a host that does not answer at all; its own links to the workers stay up)."""
    if how == "sshd stopped":
        lab.stop_sshd(SUPERVISOR_HOST)
        try:
            yield
        finally:
            lab.start_sshd(SUPERVISOR_HOST)
        return
    with packets_dropped(f"ip daddr {supervisor.ip} tcp dport 22"):
        yield


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sshd stopped", "packets dropped"])
def test_jobs_says_in_one_line_that_the_supervisor_is_unreachable_and_keeps_the_last_known_state(
        home, lab, hosts_spec, supervisor, how):
    if how == "packets dropped":
        require_nft()
    spec = hosts_spec(supervisor.spec + 'run: echo "waiting on worker $PODRUN_WORKER"; exec sleep 600\n')
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    assert "running" in row_of(job_id)

    with cut_off(lab, supervisor, how):
        asked_at = time.monotonic()
        listed = podrun("jobs", timeout=60)
        took_s = time.monotonic() - asked_at
    assert listed.returncode == 0, listed.stderr
    assert took_s < 20, f"podrun jobs took {took_s:.1f}s with its supervisor unreachable ({how})"
    said = listed.stderr.strip().splitlines()
    assert len(said) == 1 and supervisor.ip in said[0], listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(job_id))
    assert "running" in row  # as last read from the supervisor

    again = podrun("jobs")
    assert again.returncode == 0 and again.stderr == "", again.stderr
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    assert anything_of_the_job(job_id) == []


@pytest.mark.slow
def test_a_job_never_read_before_its_supervisor_is_cut_off_reads_running_unreachable_and_is_asked_again(
        home, lab, hosts_spec, supervisor):
    # the first `podrun jobs` after a detached handover finds the supervisor unreachable: the pointer
    # holds no workers yet, and must not read `succeeded 0/0 ok`, then or once the supervisor answers
    spec = hosts_spec(supervisor.spec + 'run: echo "waiting on worker $PODRUN_WORKER"; exec sleep 600\n')
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)

    with cut_off(lab, supervisor, "sshd stopped"):
        row = row_of(job_id)
        assert "running (on" in row and "supervisor unreachable" in row, row
        assert "succeeded" not in row and "ok" not in row, row
        assert listed_as_json(job_id)["state"] == "running"

    row = row_of(job_id)
    assert "running (on" in row and "unreachable" not in row and "3 running" in row, row
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    assert anything_of_the_job(job_id) == []


def test_a_handover_cut_off_before_the_host_says_it_started_the_job_is_recorded_here(home, lab, hosts_spec,
                                                                                       supervisor, tmp_path):
    """Issue 52's first defect: a host that has the job may make a TPU and bill it; the laptop records the job
    before it hands it over, says in one line what became of it, and `podrun jobs` shows it on that host. The
    host's podrun here takes the job and is then cut off before its first answer (its sshd sessions killed)."""
    handed = tmp_path / "handed-job.json"
    taker = tmp_path / "podrun-that-takes-the-job"
    taker.write_text(f"""#!/bin/sh
case "$1" in --version) echo "podrun {__version__}"; exit 0;; esac
read wanted
printf '@podrun:version=%s\\n' "$wanted"
read job || exit 0  # a handover begun early and given up: nothing came
printf '%s\\n' "$job" > {handed}
exec sleep 600
""")
    taker.chmod(0o755)
    spec = hosts_spec(f"supervisor: {{host: {supervisor.address}, podrun: {taker}}}\nrun: sleep 600\n")
    handing = Background("exec", spec, "--detach")
    wait_until(lambda: handed.exists() and handed.read_text().endswith("\n"), "the host to have the job", timeout=30)
    for pid in sshd_sessions(lab.hosts[SUPERVISOR_HOST].namespace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert handing.finish(timeout=30) == 255, handing.text
    job_id = json.loads(handed.read_text())["job_id"]
    assert handing.lines[-1].startswith(f"podrun: the link to the supervisor {supervisor.address} broke as it took job "
                                        f"{job_id} ("), handing.text
    assert handing.lines[-1].endswith(f"`podrun jobs` shows it, on {supervisor.address}, until the host answers; "
                                      f"`podrun stop {job_id}` stops it"), handing.text
    assert "Traceback" not in handing.text
    row = next((line for line in podrun("jobs", timeout=60).stdout.splitlines() if line.startswith(job_id)), "")
    assert f"running (on {supervisor.address}" in row, row
