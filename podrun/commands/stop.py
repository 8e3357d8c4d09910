"""`podrun stop`: a running job stopped on every worker, wherever it lives."""

from __future__ import annotations

import os
import time

from podrun import jobstore
from podrun.countdown import Countdown
from podrun.errors import PodrunError
from podrun.output import say

FOLLOW_POLL_S = 0.1
LAUNCHER_STOP_MARGIN_S = 15  # the launcher needs the job's grace period, the KILL, and a little


def stop_job(job: str | None) -> int:
    """`job`: an id, an id's beginning or a name; none: the newest running job."""
    record = jobstore.find(job) if job else _newest_running()
    if record.supervised_by:
        from podrun.supervisor import remote

        return remote.forward(record, ["stop", record.id])
    state = record.current_state()
    if state != jobstore.RUNNING:
        raise PodrunError(f"job {record.id} is not running (it is {state})")
    if record.supervised():
        return _stop_supervised(record)
    if record.detached:
        from podrun.launch import detached

        lost_supervisor = record.supervisor_lost()
        detached.stop(record)
        print(f"podrun: job {record.id} is {jobstore.load(record.id).current_state()}")
        if lost_supervisor and record.cleanup:
            say(f"its supervisor is gone, so what it was to delete is still there: `{record.cleanup}` deletes it")
        return 0
    import signal  # here, not at the top: `podrun jobs` and `podrun logs` start faster without it

    if "pid" not in record.launcher:  # its identity comes from /proc, which only Linux has
        raise PodrunError(f"job {record.id}: its launcher cannot be found on this system (stopping an attached job "
                          f"needs Linux's /proc); press Ctrl-C where it runs")
    os.kill(record.launcher["pid"], signal.SIGTERM)  # its launcher stops every worker, as on Ctrl-C
    wait_s = record.stop_grace_s + LAUNCHER_STOP_MARGIN_S
    deadline = time.monotonic() + wait_s
    with Countdown(record.stop_grace_s) as countdown:
        while (record := jobstore.load(record.id)).current_state() == jobstore.RUNNING:
            if time.monotonic() > deadline:
                raise PodrunError(f"job {record.id}: its launcher (pid {record.launcher['pid']}) did not stop it "
                                  f"within {wait_s:g}s")
            countdown.draw()
            time.sleep(FOLLOW_POLL_S)
    print(f"podrun: job {record.id} is {record.current_state()}")
    return 0


def _stop_supervised(record: jobstore.JobRecord) -> int:
    """A detached job with a supervisor (restarts, delete_after): it stops the job and cleans up, as
    after Ctrl-C; podrun waits for it to finish."""
    import signal

    assert record.supervisor is not None
    pid = record.supervisor["pid"]
    os.kill(pid, signal.SIGTERM)
    say(f"asked job {record.id}'s supervisor (pid {pid}) to stop it; waiting for it to finish")
    with Countdown(record.stop_grace_s) as countdown:
        while record.supervised():
            countdown.draw()
            time.sleep(FOLLOW_POLL_S)
    print(f"podrun: job {record.id} is {jobstore.load(record.id).current_state()}")
    return 0


def _newest_running() -> jobstore.JobRecord:
    running = next((record for record in jobstore.all_jobs() if record.current_state() == jobstore.RUNNING), None)
    if running is None:
        raise PodrunError("no job is running; `podrun jobs` lists them, `podrun stop JOB_ID` names one")
    say(f"stopping job {running.id}, the newest running job")
    return running
