"""Notifications (the spec's `notify`; docs/notifications.md): a webhook stand-in on 127.0.0.1
(tests/webhook_stand_in.py) gets one JSON POST per event of a job that fails, restarts and succeeds,
whoever sends it: the attached launcher, a detached job's supervisor, or worker 0's agent of a detached
job that nothing watches. A webhook that refuses or never answers costs the job nothing but a bounded
wait at its end, and the record says what became of each message."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from podrun.notify import DRAIN_S
from podrun.remote import hub

from helpers import (
    FAILS_ONCE,
    FAILS_ONCE_CAUSE,
    Background,
    failed_restarted_succeeded,
    job_id_in,
    job_record,
    notification,
    podrun,
    wait_until,
)
from webhook_stand_in import TOKEN_PATH


@pytest.fixture(autouse=True)
def quick_restarts(monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.2")  # the restart's wait is not under test


def notified(job_file, url: str, body: str, workers: int = 2, on: str = "") -> Path:
    return job_file(f"target: {{local: {{workers: {workers}}}}}\nnotify: {{url: '{url}'{on}}}\n" + body,
                    name="notified")


def events_of(home: Path, job_id: str) -> list[tuple]:
    return [(event["event"], event["attempt"], event["delivered"], event["tries"], event["by"])
            for event in job_record(home, job_id)["events"]]


def no_token_in(home: Path, job_id: str, *outputs: str) -> None:
    """The webhook's URL is a secret: neither what podrun said nor any file of the job's holds its path."""
    for output in outputs:
        assert TOKEN_PATH not in output
    for path in (home / "jobs" / job_id).rglob("*"):
        if path.is_file():
            assert TOKEN_PATH.encode() not in path.read_bytes(), path


def test_an_attached_job_that_fails_restarts_and_succeeds_tells_each_event_in_order(home, job_file, webhook):
    stand_in, url = webhook()
    result = podrun("exec", notified(job_file, url, FAILS_ONCE))
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)
    # all delivered before exec exits: it waits for the deliveries under way
    assert stand_in.received == failed_restarted_succeeded(job_id, "notified", "worker 1 exited with code 3 in run",
                                                                FAILS_ONCE_CAUSE)
    assert events_of(home, job_id) == [("failure", 0, True, 1, "launcher"), ("restart", 1, True, 1, "launcher"),
                                       ("success", 1, True, 1, "launcher")]
    host = url.split("/")[2]
    assert {event["to"] for event in job_record(home, job_id)["events"]} == {host}
    no_token_in(home, job_id, result.stdout, result.stderr)


def test_a_detached_job_is_told_of_by_its_supervisor_while_the_laptop_is_gone(home, job_file, webhook):
    stand_in, url = webhook()
    started = podrun("exec", notified(job_file, url, FAILS_ONCE), "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    assert "a supervisor (pid" in started.stderr
    assert stand_in.wait_for(3) == failed_restarted_succeeded(job_id, "notified", "worker 1 exited with code 3",
                                                                FAILS_ONCE_CAUSE)
    wait_until(lambda: len(job_record(home, job_id)["events"]) == 3, "the supervisor to record the deliveries")
    assert events_of(home, job_id) == [("failure", 0, True, 1, "launcher"), ("restart", 1, True, 1, "launcher"),
                                       ("success", 1, True, 1, "launcher")]
    no_token_in(home, job_id, started.stderr)


def test_a_detached_job_that_nothing_watches_is_told_of_by_its_worker_0_once_every_worker_is_done(
        home, job_file, webhook):
    stand_in, url = webhook()
    # worker 0 is done long before worker 1 fails: it tells the end only once worker 1's is known
    started = podrun("exec", notified(job_file, url, 'run: test "$PODRUN_WORKER" = 0 || { sleep 1; exit 4; }\n'),
                     "--detach")
    assert started.returncode == 0, started.stderr
    assert "supervisor" not in started.stderr
    job_id = job_id_in(started.stderr)
    assert stand_in.wait_for(1) == [notification(job_id, "notified", "failure", "failed", 0, "worker 1 exited with code 4")]
    followed = podrun("logs", "-f", job_id)  # the job's end, read from its workers, with what worker 0 told
    assert followed.returncode == 4, followed.stderr
    assert job_record(home, job_id)["state"] == "failed"
    assert events_of(home, job_id) == [("failure", 0, True, 1, "worker 0")]
    no_token_in(home, job_id, started.stderr, followed.stderr)


def test_a_single_worker_detached_job_tells_its_success_and_only_what_on_asks_for(home, job_file, webhook):
    stand_in, url = webhook()
    spec = notified(job_file, url, "run: echo done\n", workers=1, on=", on: [success]")
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    assert stand_in.wait_for(1) == [notification(job_id, "notified", "success", "succeeded", 0,
                                                 "every worker exited with code 0")]
    wait_until(lambda: podrun("jobs", "--json").returncode == 0 and job_record(home, job_id)["state"] == "succeeded",
               "`podrun jobs` to see the job's end")
    assert events_of(home, job_id) == [("success", 0, True, 1, "worker 0")]
    failing = podrun("exec", notified(job_file, url, "run: exit 5\n", workers=1, on=", on: [success]"), "--detach")
    failed_id = job_id_in(failing.stderr)
    assert podrun("logs", "-f", failed_id).returncode == 5
    assert job_record(home, failed_id)["state"] == "failed"
    assert job_record(home, failed_id)["events"] == [] and stand_in.events() == [("success", 0)]


def test_a_webhook_answering_500_never_fails_the_job_and_the_record_says_so(home, job_file, webhook):
    stand_in, url = webhook(status=500)
    result = podrun("exec", notified(job_file, url, "run: echo done\n", workers=1))
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)
    host = url.split("/")[2]
    assert f"podrun: notification of success (attempt 0) to {host} not delivered: HTTP 500 (3 tries)" \
        in result.stderr.splitlines()
    assert stand_in.requests == 3
    record = job_record(home, job_id)
    assert record["state"] == "succeeded" and record["exit_code"] == 0
    assert [(e["event"], e["delivered"], e["tries"], e["error"]) for e in record["events"]] == \
        [("success", False, 3, "HTTP 500")]
    no_token_in(home, job_id, result.stderr)


def test_worker_0s_failed_delivery_is_in_the_record_once_the_job_is_collected(home, job_file, webhook):
    stand_in, url = webhook(status=500)
    started = podrun("exec", notified(job_file, url, "run: echo done\n", workers=1), "--detach")
    job_id = job_id_in(started.stderr)
    followed = podrun("logs", "-f", job_id)
    assert followed.returncode == 0, followed.stderr
    assert stand_in.requests == 3  # worker 0's agent tried before it wrote the run's end
    assert "not delivered: HTTP 500 (3 tries)" in followed.stderr
    record = job_record(home, job_id)
    assert record["state"] == "succeeded"
    assert [(e["event"], e["delivered"], e["tries"], e["error"], e["by"]) for e in record["events"]] == \
        [("success", False, 3, "HTTP 500", "worker 0")]


def test_a_secret_in_a_failures_reason_never_reaches_the_webhook(home, job_file, webhook, monkeypatch):
    stand_in, url = webhook()
    monkeypatch.setenv("API_TOKEN", "s3cr3t-value")
    body = 'secret_env: [API_TOKEN]\nrun: |\n  echo "RuntimeError: refused $API_TOKEN"\n  exit 3\n'
    result = podrun("exec", notified(job_file, url, body, workers=1, on=", on: [failure]"))
    assert result.returncode == 3, result.stderr
    job_id = job_id_in(result.stderr)
    assert stand_in.received == [notification(job_id, "notified", "failure", "failed", 0,
                                         "worker 0 exited with code 3 in run (RuntimeError: refused ***)",
                                         {"class": "exception", "worker": 0, "rank": None, "step": None,
                                          "text": "RuntimeError: refused ***", "said": "exception on worker 0"})]
    # nor what podrun says or records of it (the program's own stream and its log keep what it printed)
    assert "s3cr3t-value" not in result.stderr and "refused ***" in result.stderr, result.stderr
    assert "s3cr3t-value" not in (home / "jobs" / job_id / "job.json").read_text()
    assert "s3cr3t-value" not in podrun("jobs", "--json").stdout + podrun("report", job_id).stdout


def test_a_webhook_url_taken_from_the_environment_is_told_and_one_not_exported_is_refused_before_the_run(
        home, job_file, webhook, monkeypatch):
    stand_in, url = webhook()
    monkeypatch.setenv("HOOK_URL", url)
    spec = job_file("target: {local: {workers: 2}}\nnotify: {url_env: HOOK_URL}\n"
                    "run: echo done\n", name="notified")
    started = podrun("exec", spec, "--detach")  # worker 0's agent sends it: nothing watches this job
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    assert podrun("logs", "-f", job_id).returncode == 0
    assert stand_in.wait_for(1) == [notification(job_id, "notified", "success", "succeeded", 0,
                                                 "every worker exited with code 0")]
    no_token_in(home, job_id, started.stderr)

    monkeypatch.delenv("HOOK_URL")
    refused = podrun("exec", spec)
    assert (refused.returncode, refused.stderr.splitlines()) == (2, [
        f"podrun: error: {spec}: notify.url_env: HOOK_URL is not in podrun's environment; export the webhook's "
        f"URL as HOOK_URL first"])
    assert stand_in.events() == [("success", 0)]


@pytest.mark.slow
def test_a_webhook_that_never_answers_delays_the_jobs_end_by_the_documented_bound_at_most(home, job_file, webhook):
    stand_in, url = webhook(silent=True)
    job = Background("exec", notified(job_file, url, FAILS_ONCE))
    job.wait_for(r"^podrun: job \S+ succeeded")
    ended = time.monotonic()
    assert job.finish(timeout=60) == 0, job.text
    waited = time.monotonic() - ended
    assert waited <= DRAIN_S + 2, f"exec exited {waited:.1f}s after the job's end"
    job_id = job_id_in(job.text)
    events = job_record(home, job_id)["events"]
    # the first message gave up on its own; those behind it were still under way when the wait ended
    given_up = f"given up {DRAIN_S:g}s after the job ended, still under way"
    assert [(e["event"], e["delivered"], e["error"]) for e in events] == [
        ("failure", False, "no answer within 2s"), ("restart", False, given_up), ("success", False, given_up)]
    assert events[0]["tries"] == 3 and events[2]["tries"] == 0  # the success's tries had not begun
    said = [line for line in job.lines if "not delivered" in line]
    assert len(said) == 3 and all(re.match(r"podrun: notification of \w+ \(attempt \d\) to 127\.0\.0\.1:\d+ ", line)
                                  for line in said), said


@pytest.mark.slow
def test_a_detached_job_that_podrun_stop_stops_tells_nothing_and_a_stalled_one_tells_its_stall(
        home, job_file, webhook):
    stand_in, url = webhook()
    started = podrun("exec", notified(job_file, url, "run: echo started; exec sleep 600\n"), "--detach")
    job_id = job_id_in(started.stderr)
    wait_until(lambda: "started" in podrun("logs", job_id, "--worker", "1").stdout, "worker 1 to start")
    assert podrun("stop", job_id).returncode == 0
    # worker 0's agent tells before it writes the run's end, which the stop waited for
    assert job_record(home, job_id)["state"] == "stopped" and stand_in.requests == 0
    stalling = podrun("exec", notified(job_file, url, "stall: 1s\nrun: exec sleep 600\n"), "--detach")
    stalled_id = job_id_in(stalling.stderr)
    assert stand_in.wait_for(1) == [notification(stalled_id, "notified", "stall", "stalled", 0,
                                                 "no output from any worker for 1s")]


def test_the_message_carries_the_jobs_step_where_progress_reads_one(home, job_file, webhook):
    stand_in, url = webhook()
    body = ("progress: 'step (\\d+)'\nrun: |\n  for i in 1 2 3; do echo \"step $((PODRUN_ATTEMPT * 10 + i))\"; done\n"
            "  test \"$PODRUN_ATTEMPT\" = 1 || exit 3\nrestarts: {max: 1, on: [failure]}\n")
    result = podrun("exec", notified(job_file, url, body, workers=1))
    assert result.returncode == 0, result.stderr
    # the attempt's last step; a restart's, the best before it
    assert [(m["event"], m["attempt"], m["step"]) for m in stand_in.received] == [
        ("failure", 0, 3), ("restart", 1, 3), ("success", 1, 13)]
    assert "(attempt 0, step 3, unknown on worker 0): worker 0 exited with code 3" in stand_in.received[0]["text"]
    detached = podrun("exec", notified(job_file, url, body.replace("restarts: {max: 1, on: [failure]}\n", ""),
                                       workers=2), "--detach")
    job_id = job_id_in(detached.stderr)
    assert "supervisor" not in detached.stderr
    # worker 0's, from the hub's steps, once worker 1's agent came and went: under load its start may take
    # as long as the hub waits for it (hub.HELLO_WAIT_S)
    told = stand_in.wait_for(4, timeout=hub.Hub.HELLO_WAIT_S + 30)[3]
    assert (told["job"], told["event"], told["step"]) == (job_id, "failure", 3)
