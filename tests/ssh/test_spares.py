"""Spares (`target: {hosts: [...], spares: [...]}`, docs/targets/hosts.md): a host whose worker was lost
is left out for the rest of the job, and the next attempt runs a spare in its rank. The lost host dies as
a machine does: every process in its namespace, its sshd included, killed. Run under
`flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess

import pytest

from helpers import Background, job_id_in, job_record, podrun, wait_until, worker_log_on_the_laptop

pytestmark = pytest.mark.lab

# attempt 0 runs until its worker 1 is gone; attempt 1 checks that every rank is where it was, on its host
RUNS_UNTIL_A_HOST_DIES = """\
restarts: {max: 1, on: [failure]}
run: |
  echo "attempt $PODRUN_ATTEMPT: worker $PODRUN_WORKER of $PODRUN_NUM_WORKERS on $(hostname) rdzv $MASTER_ADDR"
  [ "$PODRUN_ATTEMPT" = 1 ] && exit 0
  sleep 60
"""


@pytest.fixture
def dying(lab):
    """dying(index): host `index` dies (every process of its namespace killed); its sshd is back after the test."""
    died = []

    def kill(index: int) -> None:
        host = lab.hosts[index]
        died.append(index)
        pids = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True, text=True).stdout.split()
        for pid in map(int, pids):
            with contextlib.suppress(ProcessLookupError):  # one that ended since it was listed
                os.kill(pid, signal.SIGKILL)
        host.sshd.wait()

    yield kill
    for index in died:
        lab.start_sshd(index)


def with_spares(hosts_spec, lab, body: str, spares=(3,)) -> object:
    spec = hosts_spec(body, hosts=(0, 1, 2))
    text = spec.read_text()
    entries = ", ".join(lab.hosts[i].ip for i in spares)
    spec.write_text(text.replace("]}\n", f"], spares: [{entries}]}}\n", 1))
    return spec


def test_a_job_whose_host_dies_goes_on_with_a_spare_in_its_rank_and_names_what_it_left_out(
        home, lab, hosts_spec, dying, webhook, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.1")
    stand_in, url = webhook()
    spec = with_spares(hosts_spec, lab, RUNS_UNTIL_A_HOST_DIES + f"notify: {{url: '{url}', on: [restart]}}\n")
    lost, spare = lab.hosts[1], lab.hosts[3]
    running = Background("exec", spec)
    running.wait_for("attempt 0: worker 1 of 3")
    dying(1)
    assert running.finish() == 0, running.text
    said = running.text
    job_id = job_id_in(said)
    assert f"worker 1 ({lost.ip}) lost its connection" in said
    assert (f"podrun: worker 1: {lost.ip} left out for the rest of the job (lost in attempt 0); spare {spare.ip} "
            f"takes its place") in said
    assert "restart 1 of 1 in 0.1s: running again with the spares in place" in said
    # the others kept their ranks and hosts; the spare is worker 1 and reaches worker 0 as before
    for index, host in ((0, lab.hosts[0]), (1, spare), (2, lab.hosts[2])):
        assert (f"attempt 1: worker {index} of 3 on {host.hostname} rdzv {lab.hosts[0].ip}"
                in worker_log_on_the_laptop(job_id, index))
    record = job_record(home, job_id)
    assert [worker["address"] for worker in record["workers"]] == [lab.hosts[0].ip, spare.ip, lab.hosts[2].ip]
    swaps = [entry for entry in record["phases"] if entry["phase"] == "swap"]
    assert [(s["attempt"], s["worker"], s["left"], s["spare"]) for s in swaps] == [(1, 1, lost.ip, spare.ip)]
    listed = podrun("jobs").stdout
    assert "succeeded (1 restart, 1 host left out)" in listed, listed
    report = podrun("report", job_id).stdout
    assert f"attempt 1: worker 1 on spare {spare.ip}, {lost.ip} left out: worker 1 lost its connection" in report
    assert [message["reason"] for message in stand_in.wait_for(1)] == [
        f"after failure: {record['attempts'][0]['summary']}; {lost.ip} left out, spare {spare.ip} in its place"]


def test_a_detached_jobs_supervisor_puts_a_spare_in_the_lost_hosts_rank(home, lab, hosts_spec, dying, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.1")
    started = podrun("exec", with_spares(hosts_spec, lab, RUNS_UNTIL_A_HOST_DIES), "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: "attempt 0: worker 1 of 3" in worker_log_on_the_laptop(job_id, 1), "attempt 0 on worker 1")
    dying(1)
    wait_until(lambda: job_record(home, job_id)["state"] == "succeeded", "the supervisor's restart on the spare")
    record = job_record(home, job_id)
    assert [worker["address"] for worker in record["workers"]] == [lab.hosts[0].ip, lab.hosts[3].ip, lab.hosts[2].ip]
    assert f"spare {lab.hosts[3].ip} takes its place" in (home / "jobs" / job_id / "supervisor.log").read_text()


def test_a_host_that_cannot_be_reached_as_an_attempt_begins_is_left_out_until_no_spare_is_left(
        home, lab, hosts_spec, dying, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.1")
    dying(2)  # dead before the job starts: its connect is refused
    spec = with_spares(hosts_spec, lab, "restarts: {max: 2, on: [failure]}\n"
                                        "run: echo worker $PODRUN_WORKER on $(hostname)\n", spares=(3,))
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)
    assert f"podrun: {lab.hosts[2].ip}: cannot connect: Connection refused" in result.stderr
    assert (f"podrun: worker 2: {lab.hosts[2].ip} left out for the rest of the job (lost in attempt 0); spare "
            f"{lab.hosts[3].ip} takes its place") in result.stderr
    assert f"worker 2 on {lab.hosts[3].hostname}" in worker_log_on_the_laptop(job_id, 2)
    assert json.loads(podrun("jobs", "--json").stdout)[0]["workers"][2]["address"] == lab.hosts[3].ip

    dying(3)  # the spare is gone too: once no spare is left, an unreachable host ends the job as without spares
    again = podrun("exec", spec)
    assert again.returncode == 1, again.stderr
    assert again.stderr.splitlines()[-1] == f"podrun: error: {lab.hosts[3].ip}: cannot connect: Connection refused"
    record = json.loads(podrun("jobs", "--json").stdout)[0]
    assert (record["state"], record["attempt"], [w["exit_code"] for w in record["workers"]]) == (
        "failed", 1, [None, None, 255])


def test_spares_are_checked_before_anything_runs(home, lab, hosts_spec):
    spec = with_spares(hosts_spec, lab, "run: echo\n", spares=(1,))
    result = podrun("exec", spec)
    assert (result.returncode, result.stderr.splitlines()) == (2, [
        f"podrun: error: {spec}: target.spares.0: {lab.hosts[1].ip} is one of the hosts already; expected a host "
        f"of its own"])
    local = hosts_spec("run: echo\n").parent / "local.yaml"
    local.write_text("target: {local: {workers: 2}, spares: [10.0.0.9]}\nrun: echo\n")
    refused = podrun("exec", local)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"podrun: error: {local}: target: spares: only a hosts target takes spares (this one is local)"]


def test_a_detached_exec_whose_first_attempt_cannot_reach_a_host_starts_the_spare_and_returns(
        home, lab, hosts_spec, dying, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.1")
    dying(2)
    spec = with_spares(hosts_spec, lab, "restarts: {max: 1, on: [failure]}\n"
                                        "run: echo worker $PODRUN_WORKER on $(hostname); sleep 20\n")
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    assert f"spare {lab.hosts[3].ip} takes its place" in started.stderr
    assert "a supervisor (pid" in started.stderr
    assert job_record(home, job_id)["state"] == "running", "exec --detach waited for the job to end"
    wait_until(lambda: f"worker 2 on {lab.hosts[3].hostname}" in worker_log_on_the_laptop(job_id, 2), "the spare's run")
    assert podrun("stop", job_id).returncode == 0
