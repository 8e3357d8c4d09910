"""The supervisor's life (README: the supervisor's life): a job kept by a supervisor host outlives every
podrun process there. Killed with -9 (as a reboot kills them), the job's workers go on under their own
watch; `podrun supervisor start` there adopts the job again, wherever it was: in its run, in a
preemption's recovery, in its TPU's creation. Left without a supervisor past PODRUN_SUPERVISOR_AWAY,
the workers stop the job themselves.

The supervisor host is a lab host (the `supervisor` fixture); every process podrun has there is killed
as its VM's reboot would (its namespace's processes but its sshd). Run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import hashlib
import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
from metadata_stand_in import VM_TOKEN

from helpers import (
    SUPERVISOR_HOST,
    UNTIL_RELEASED,
    Background,
    anything_of_the_job,
    as_run,
    job_id_in,
    left_in_api,
    listed_as_json,
    podrun,
    processes_of_job,
    supervised_tpu_spec,
    wait_until,
    worker_log_on_the_laptop,
)

pytestmark = pytest.mark.slow


def kill_everything_on(lab) -> list[int]:
    """Every process on the supervisor host but its sshd, killed with -9: what its reboot does to podrun."""
    host = lab.hosts[SUPERVISOR_HOST]
    pids = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True, text=True).stdout.split()
    killed = [pid for pid in map(int, pids) if pid != host.sshd.pid]
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    return killed


def agents_and_shells(job_id: str) -> list[str]:
    """The job's processes but the short ones its run starts again and again (UNTIL_RELEASED's sleeps)."""
    return [process for process in processes_of_job(job_id) if "sleep 0.1" not in process]


def on_host(lab, supervisor, command: str) -> subprocess.CompletedProcess:
    """A command on the supervisor host in a login's bare environment (as cron or a unit runs it there)."""
    return lab.run(supervisor.index, f"env -i HOME=/root PATH=/usr/bin:/bin sh -c {shlex.quote(command)}")


def adopt_again(lab, supervisor, job_id: str) -> None:
    """`podrun supervisor start` on the host, which says it adopted the job again."""
    adopted = supervisor_start(lab, supervisor)
    assert f"job {job_id}: adopted again" in adopted.stderr, adopted.stderr


def supervisor_start(lab, supervisor) -> subprocess.CompletedProcess:
    started = on_host(lab, supervisor, f"{supervisor.podrun} supervisor start")
    assert started.returncode == 0, started.stderr
    return started


def state_there(supervisor, job_id: str) -> str:
    return supervisor.record(job_id)["state"]


def test_a_job_outlives_its_killed_supervisor_and_a_supervisor_started_again_adopts_it(
        home, lab, hosts_spec, supervisor, tmp_path):
    release = tmp_path / "release"
    spec = hosts_spec(supervisor.spec + as_run(UNTIL_RELEASED.format(release=release)), hosts=(0, 1))
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: "started on worker 1" in podrun("logs", job_id).stdout, "worker 1's first line")
    workers = agents_and_shells(job_id)

    assert kill_everything_on(lab)
    # its workers go on: the laptop reads it running, its supervisor gone
    listed = listed_as_json(job_id)
    assert listed["state"] == "running", listed
    assert "supervisor away" in podrun("jobs").stdout
    assert agents_and_shells(job_id) == workers

    adopt_again(lab, supervisor, job_id)
    # once adopted, a second start finds nothing to adopt: the job has its supervisor again
    assert "no job of this host's is without its supervisor" in supervisor_start(lab, supervisor).stderr
    assert "supervisor away" not in podrun("jobs").stdout

    release.touch()
    wait_until(lambda: state_there(supervisor, job_id) == "succeeded", "the adopted job to succeed", timeout=60)
    assert listed_as_json(job_id)["state"] == "succeeded"
    everything = podrun("logs", job_id)
    for worker in (0, 1):
        assert f"[w{worker}] started on worker {worker}" in everything.stdout
        assert f"[w{worker}] finished on worker {worker}" in everything.stdout
    assert anything_of_the_job(job_id) == []
    assert not (supervisor.job_dir(job_id) / "supervise.json").exists()  # nothing left to adopt


def test_a_job_whose_supervisor_stays_away_is_stopped_by_its_workers_within_the_bound(
        home, lab, hosts_spec, supervisor, monkeypatch):
    monkeypatch.setenv("PODRUN_SUPERVISOR_AWAY", "3")  # a setting the laptop hands over with the job
    # its program saves on SIGTERM and exits 0, as a training script does
    spec = hosts_spec(supervisor.spec + "run: trap 'echo saved; exit 0' TERM; echo \"up on worker $PODRUN_WORKER\"; "
                                        "sleep 600 & wait\n", hosts=(0, 1))
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: "up on worker 1" in podrun("logs", job_id).stdout, "worker 1's line")
    # followed, the job outlives its bound: its supervisor says it is there
    wait_until(lambda: (supervisor.job_dir(job_id) / "console" / "stderr").exists(), "the supervisor's console")
    assert processes_of_job(job_id)

    kill_everything_on(lab)
    took = wait_until(lambda: processes_of_job(job_id) == [], "the workers to stop the job themselves", timeout=30)
    assert took < 20

    adopt_again(lab, supervisor, job_id)  # follows it to the end it had
    wait_until(lambda: state_there(supervisor, job_id) != "running", "the adopted job's end", timeout=30)
    record = supervisor.record(job_id)
    assert record["state"] == "stopped", record["summary"]
    assert "its supervisor was away for" in record["summary"]
    assert record["exit_code"] == 143  # a stop, as `podrun stop`'s: not 1, like a failure
    assert listed_as_json(job_id)["state"] == "stopped"
    assert podrun("logs", "-f", job_id).returncode == 143


def test_a_spot_tpu_job_adopted_again_is_recovered_from_a_later_preemption_and_succeeds(
        home, lab, tpu_api_on_lab, supervisor, job_file, tmp_path):
    release = tmp_path / "release"
    run = f'echo "attempt $PODRUN_ATTEMPT on worker $PODRUN_WORKER"; until [ -e {release} ]; do sleep 0.1; done'
    started = podrun("exec", supervised_tpu_spec(job_file, lab, supervisor, run), "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: "attempt 0 on worker 1" in worker_log_on_the_laptop(job_id, 1), "attempt 0")

    kill_everything_on(lab)
    adopt_again(lab, supervisor, job_id)
    tpu_api_on_lab.preempt("life")  # recovered by the supervisor adopted again
    wait_until(lambda: "attempt 1 on worker 1" in worker_log_on_the_laptop(job_id, 1),
               "attempt 1 on the TPU created again", timeout=90)
    release.touch()
    wait_until(lambda: state_there(supervisor, job_id) == "succeeded", "the job to succeed", timeout=60)
    record = supervisor.record(job_id)
    assert record["attempt"] == 1 and record["attempts"][0]["state"] == "preempted"
    assert listed_as_json(job_id)["state"] == "succeeded"
    assert anything_of_the_job(job_id) == []
    assert left_in_api(tpu_api_on_lab) == ([], [])  # delete_after: always, by the supervisor adopted again


def test_a_tpu_job_left_without_its_supervisor_stops_and_worker_0_deletes_its_tpu_with_the_vms_token(
        home, lab, tpu_api_on_lab, supervisor, job_file, vm_metadata, monkeypatch):
    monkeypatch.setenv("PODRUN_SUPERVISOR_AWAY", "3")
    run = 'echo "attempt $PODRUN_ATTEMPT on worker $PODRUN_WORKER"; exec sleep 600'
    started = podrun("exec", supervised_tpu_spec(job_file, lab, supervisor, run), "--detach")  # delete_after: always
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: "attempt 0 on worker 1" in worker_log_on_the_laptop(job_id, 1), "attempt 0")
    worker_0 = tpu_api_on_lab.node_endpoints_of("life")[0]
    asked_before = len(tpu_api_on_lab.received)

    kill_everything_on(lab)
    wait_until(lambda: processes_of_job(job_id) == [], "the workers to stop the job themselves", timeout=30)
    wait_until(lambda: left_in_api(tpu_api_on_lab) == ([], []), "worker 0 to delete the TPU", timeout=30)
    deletions = {(request.client, request.token) for request in tpu_api_on_lab.received[asked_before:]
                 if request.method == "DELETE"}
    assert deletions == {(worker_0.internal_ip, VM_TOKEN)}  # worker 0, with its VM's own credentials
    said = (lab.hosts[worker_0.host_index].home / ".podrun" / "jobs" / job_id / "self_delete.txt").read_text()
    assert "the Cloud TPU API accepted the request" in said, said

    adopt_again(lab, supervisor, job_id)  # its TPU is gone: the job is over, nothing is made again
    wait_until(lambda: state_there(supervisor, job_id) != "running", "the adopted job's end", timeout=60)
    assert "its TPU was gone when a supervisor adopted it again" in supervisor.record(job_id)["summary"]
    assert tpu_api_on_lab.node_requests()[1:] == []  # created once, never again
    assert left_in_api(tpu_api_on_lab) == ([], [])


def test_a_preemption_recovery_cut_off_is_taken_up_by_a_supervisor_started_again(
        home, lab, tpu_api_on_lab, supervisor, job_file):
    run = 'echo "attempt $PODRUN_ATTEMPT on worker $PODRUN_WORKER"; exec sleep 600'
    started = podrun("exec", supervised_tpu_spec(job_file, lab, supervisor, run), "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: "attempt 0 on worker 1" in worker_log_on_the_laptop(job_id, 1), "attempt 0")

    tpu_api_on_lab.operation_delay_s = 5.0  # the recovery's deletion and creation take a while
    tpu_api_on_lab.preempt("life")
    wait_until(lambda: supervisor.record(job_id)["attempt"] == 1, "the supervisor to begin the recovery", timeout=60)
    kill_everything_on(lab)
    tpu_api_on_lab.operation_delay_s = 0.3

    adopt_again(lab, supervisor, job_id)
    wait_until(lambda: "attempt 1 on worker 1" in worker_log_on_the_laptop(job_id, 1),
               "attempt 1 on the TPU created again", timeout=90)
    console = (supervisor.job_dir(job_id) / "console" / "stderr").read_text()
    assert "adopted again; attempt 1 had not begun: creating the TPU again" in console

    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    assert state_there(supervisor, job_id) == "stopped"
    assert anything_of_the_job(job_id) == []
    assert left_in_api(tpu_api_on_lab) == ([], [])


def test_a_create_cut_off_is_begun_again_by_a_supervisor_started_again(
        home, lab, tpu_api_on_lab, supervisor, job_file):
    tpu_api_on_lab.operation_delay_s = 5.0  # the TPU's creation takes a while
    run = 'echo "attempt $PODRUN_ATTEMPT on worker $PODRUN_WORKER"; exec sleep 600'
    handing = Background("exec", supervised_tpu_spec(job_file, lab, supervisor, run), "--detach")
    handing.wait_for(r"waiting for life to be READY")
    job_id = job_id_in(handing.text)
    kill_everything_on(lab)
    assert handing.finish(timeout=30) != 0
    assert "`podrun supervisor start` there adopts it again" in handing.text, handing.text
    tpu_api_on_lab.operation_delay_s = 0.3

    adopt_again(lab, supervisor, job_id)
    wait_until(lambda: "attempt 0 on worker 1" in worker_log_on_the_laptop(job_id, 1),
               "the job begun again on the TPU its first launcher asked for", timeout=90)
    console = (supervisor.job_dir(job_id) / "console" / "stderr").read_text()
    assert "its launcher was cut off while its TPU was made: that request is deleted and made again" in console

    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    assert anything_of_the_job(job_id) == []
    assert left_in_api(tpu_api_on_lab) == ([], [])


def machines_crontabs() -> dict[str, bytes]:
    from lab import CRON_SPOOL

    spool = Path(CRON_SPOOL)
    return {path.name: path.read_bytes() for path in spool.iterdir()} if spool.is_dir() else {}


def test_supervisor_install_adds_one_boot_line_that_starts_the_adoption(lab, supervisor):
    before = machines_crontabs()
    try:
        installed = on_host(lab, supervisor, f"{supervisor.podrun} supervisor install")
        assert installed.returncode == 0, installed.stderr
        assert "added an @reboot line" in installed.stderr  # the lab's hosts run no systemd
        again = on_host(lab, supervisor, f"{supervisor.podrun} supervisor install")
        assert again.returncode == 0, again.stderr
        assert machines_crontabs() == before  # the host's crontab is its own, not this machine's
        table = lab.run(supervisor.index, "crontab -l").stdout
        lines = [line for line in table.splitlines() if line.startswith("@reboot")]
        assert len(lines) == 1, table
        # what cron runs at boot, run now: it adopts (here: nothing) and says so in its log
        booted = on_host(lab, supervisor, lines[0].removeprefix("@reboot "))
        assert booted.returncode == 0, (lines[0], lab.run(supervisor.index, "cat ~/.podrun/supervisor-start.log").stdout)
        log = lab.run(supervisor.index, "cat ~/.podrun/supervisor-start.log").stdout
        assert "no job of this host's is without its supervisor" in log
    finally:
        lab.run(supervisor.index, "crontab -r")  # the host's spool: the lab's own
    assert machines_crontabs() == before  # this machine's crontabs, byte for byte


# fails on its first attempt once released, then shows a digest of its secret on the next
FAILS_ONCE_RELEASED = ('echo "attempt $PODRUN_ATTEMPT got $(printf %s "$HF_TOKEN" | sha256sum | cut -c1-16)"\n'
                       '[ "$PODRUN_ATTEMPT" = 0 ] || exit 0\n'
                       'until [ -e {release} ]; do sleep 0.1; done\n'
                       'exit 3\n')


def cut_off_in_attempt_0(lab, supervisor, spec, secret: str) -> str:
    """The job started detached through the supervisor host, whose processes are killed once attempt 0 runs:
    then no file there holds `secret`. Its id."""
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: "attempt 0 got" in worker_log_on_the_laptop(job_id, 1), "attempt 0")
    kill_everything_on(lab)
    found = subprocess.run(["grep", "-rlF", secret, str(supervisor.home)], capture_output=True, text=True)
    assert found.stdout == "", f"the secret in files on the supervisor: {found.stdout}"
    return job_id


@pytest.mark.parametrize("given", [True, False], ids=["secret given to start", "secret not given"])
def test_a_restart_after_adoption_takes_the_secret_from_the_environment_of_supervisor_start(
        home, lab, hosts_spec, supervisor, tmp_path, monkeypatch, given):
    secret = "hf-" + os.urandom(8).hex()
    monkeypatch.setenv("HF_TOKEN", secret)
    release = tmp_path / "release"
    spec = hosts_spec(supervisor.spec + "secret_env: [HF_TOKEN]\nrestarts: {max: 1, on: [failure]}\n"
                      + as_run(FAILS_ONCE_RELEASED.format(release=release)), hosts=(0, 1))
    job_id = cut_off_in_attempt_0(lab, supervisor, spec, secret)
    adopted = on_host(lab, supervisor, f"{'HF_TOKEN=' + secret + ' ' if given else ''}{supervisor.podrun} "
                                       f"supervisor start")
    assert f"job {job_id}: adopted again" in adopted.stderr, adopted.stderr
    release.touch()

    def ended() -> bool:  # attempt 0's failure is the record's state for a moment, before the restart is tried
        record = supervisor.record(job_id)
        return record["state"] == "succeeded" or "HF_TOKEN" in (record.get("summary") or "")

    wait_until(ended, "the adopted job's restart to end", timeout=60)
    record = supervisor.record(job_id)
    if given:
        digest = hashlib.sha256(secret.encode()).hexdigest()[:16]
        assert record["state"] == "succeeded", record["summary"]
        assert f"attempt 1 got {digest}" in worker_log_on_the_laptop(job_id, 1)
    else:
        assert record["state"] == "failed"
        assert "HF_TOKEN is neither set in env nor in podrun's environment" in record["summary"], record["summary"]
    assert anything_of_the_job(job_id) == []


@pytest.mark.parametrize("given", ["url_env", "url"])
def test_a_webhook_outlives_its_supervisors_restart_only_from_the_environment_and_never_on_disk(
        home, lab, hosts_spec, supervisor, webhook, tmp_path, monkeypatch, given):
    from lab import BRIDGE_IP
    from webhook_stand_in import TOKEN_PATH

    stand_in, url = webhook(address=BRIDGE_IP)
    monkeypatch.setenv("HOOK_URL", url)
    release = tmp_path / "release"
    notify = "notify: {url_env: HOOK_URL}\n" if given == "url_env" else f"notify: {{url: '{url}'}}\n"
    spec = hosts_spec(supervisor.spec + notify + "restarts: {max: 1, on: [failure]}\n"
                      + as_run('test -z "${HOOK_URL-}" || exit 9\n'  # the workers never get it
                               + FAILS_ONCE_RELEASED.format(release=release)), hosts=(0, 1))
    job_id = cut_off_in_attempt_0(lab, supervisor, spec, TOKEN_PATH)
    adopted = on_host(lab, supervisor, f"HOOK_URL={shlex.quote(url)} {supervisor.podrun} supervisor start")
    assert f"job {job_id}: adopted again" in adopted.stderr, adopted.stderr
    release.touch()
    wait_until(lambda: state_there(supervisor, job_id) == "succeeded", "the adopted job's restart to succeed", timeout=60)
    console = (supervisor.job_dir(job_id) / "console" / "stderr").read_text()
    if given == "url_env":
        stand_in.wait_for(3)
        assert stand_in.events() == [("failure", 0), ("restart", 1), ("success", 1)]
        assert "adopted without its notifications" not in console
    else:
        assert stand_in.events() == [] and supervisor.record(job_id)["events"] == []
        assert (f"job {job_id}: adopted without its notifications: its webhook's URL was written in the spec, "
                f"and podrun keeps no URL on disk") in console
