"""`podrun jobs`, `podrun logs` (now, tail, follow) and `podrun stop`, against real jobs."""

from __future__ import annotations

import json
import signal

from conftest import Background, crashed, job_id_in, podrun, processes_of_job, wait_until


def test_jobs_lists_state_exit_codes_and_duration(home, job_file):
    good = podrun("exec", job_file("run: echo fine", name="good"))
    # worker 1 fails while worker 0 runs on, so worker 0 is always the one stopped (by SIGTERM: 143)
    bad = podrun("exec", job_file("run: if [ $PODRUN_WORKER = 1 ]; then exit 5; fi; exec sleep 60", name="bad"))
    good_id, bad_id = job_id_in(good.stderr), job_id_in(bad.stderr)
    table = podrun("jobs")
    assert table.returncode == 0
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "TARGET", "STATE", "EXIT", "CODES", "STARTED", "DURATION"]
    assert [row.split()[:5] for row in rows] == [[good_id, "good", "local:2", "succeeded", "0,0"],
                                                  [bad_id, "bad", "local:2", "failed", "143,5"]]
    listed = json.loads(podrun("jobs", "--json").stdout)
    assert [(job["id"], job["state"], job["exit_code"]) for job in listed] == [(good_id, "succeeded", 0),
                                                                               (bad_id, "failed", 5)]
    assert listed[1]["workers"][1] == {"index": 1, "address": "local/w1", "exit_code": 5, "signal": None,
                                       "endpoint": {"kind": "local", "root": str(home / "local" / "w1")},
                                       "stop_reason": None}


def test_logs_shows_the_newest_job_or_one_worker_tail(home, job_file):
    podrun("exec", job_file("run: echo older", name="old"))
    newest = podrun("exec", job_file("run: for i in 1 2 3 4 5; do echo \"w$PODRUN_WORKER line $i\"; done", name="new"))
    logs = podrun("logs")
    assert logs.returncode == 0
    assert logs.stdout.splitlines() == [f"[w{w}] w{w} line {i}" for w in (0, 1) for i in range(1, 6)]
    tail = podrun("logs", job_id_in(newest.stderr), "--worker", "1", "--tail", "2")
    assert tail.stdout == "w1 line 4\nw1 line 5\n"
    wrong = podrun("logs", job_id_in(newest.stderr), "--worker", "7")
    assert wrong.returncode == 2 and "has workers 0, 1" in wrong.stderr


def gated_job(job_file, release):
    """A job whose workers print "before N", wait until `release` exists, then print "after N"."""
    return job_file(f"""
        run: |
          echo "before $PODRUN_WORKER"
          while [ ! -e {release} ]; do sleep 0.05; done
          echo "after $PODRUN_WORKER"
    """)


def test_logs_follow_streams_a_running_job_and_ends_with_it(home, job_file, tmp_path):
    release = tmp_path / "release"
    spec = gated_job(job_file, release)
    job = Background("exec", spec)
    job.wait_for(r"^\[w0\] before 0")
    job.wait_for(r"^\[w1\] before 1")
    follower = Background("logs", "-f")
    follower.wait_for(r"^\[w0\] before 0")
    follower.wait_for(r"^\[w1\] before 1")
    release.touch()
    assert job.finish() == 0
    assert follower.finish(timeout=10) == 0
    assert "[w0] after 0" in follower.lines and "[w1] after 1" in follower.lines


def test_stop_from_another_terminal_stops_every_worker(home, job_file):
    job = Background("exec", job_file("run: echo \"up $PODRUN_WORKER\"; sleep 300"))
    job.wait_for(r"^\[w0\] up 0")
    job.wait_for(r"^\[w1\] up 1")
    job_id = job_id_in(job.text)
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0 and f"job {job_id} is stopped" in stopped.stdout
    assert job.finish() == 143
    assert processes_of_job(job_id) == []
    again = podrun("stop", job_id)
    assert again.returncode == 1 and "is not running (it is stopped)" in again.stderr


def test_workers_stop_on_their_own_when_the_launcher_is_killed(home, job_file):
    job = Background("exec", job_file("run: echo \"up $PODRUN_WORKER\"; sleep 300"))
    job.wait_for(r"^\[w0\] up 0")
    job.wait_for(r"^\[w1\] up 1")
    job_id = job_id_in(job.text)
    job.process.send_signal(signal.SIGKILL)
    job.finish()
    for index in (0, 1):  # each agent writes its exit file once its tree is gone
        exit_file = home / "local" / f"w{index}" / ".podrun" / "jobs" / job_id / "run.exit"
        wait_until(exit_file.exists, f"worker {index} to stop")
        assert json.loads(exit_file.read_text())["stop_reason"] == "the launcher is gone"
    assert processes_of_job(job_id) == []
    listed = {job["id"]: job["state"] for job in json.loads(podrun("jobs", "--json").stdout)}
    assert listed[job_id] == "lost"


def test_a_damaged_job_record_does_not_break_jobs_or_logs(home, job_file):
    ok = podrun("exec", job_file("run: echo ok"))
    (home / "jobs" / "half-written").mkdir()
    (home / "jobs" / "half-written" / "job.json").write_text('{"id": "half-wr')
    listed = podrun("jobs")
    assert listed.returncode == 0 and job_id_in(ok.stderr) in listed.stdout and "half-written" not in listed.stdout
    assert podrun("logs").stdout.splitlines() == ["[w0] ok", "[w1] ok"]
    broken = podrun("logs", "half-written")
    assert broken.returncode == 1 and not crashed(broken.stderr)
    assert broken.stderr.startswith("podrun: error: job 'half-written': its record") and broken.stderr.count("\n") == 1


def test_a_detached_job_runs_on_and_logs_follow_resumes_it_to_the_end(home, job_file, tmp_path):
    release = tmp_path / "release"
    spec = gated_job(job_file, release)
    launched = podrun("exec", "--detach", spec)
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    assert f"podrun logs -f {job_id}" in launched.stderr
    assert len(processes_of_job(job_id)) >= 2  # runs on without its launcher
    listed = {job["id"]: job for job in json.loads(podrun("jobs", "--json").stdout)}
    assert listed[job_id]["state"] == "running" and listed[job_id]["detached"]
    now = podrun("logs", job_id)
    assert sorted(now.stdout.splitlines()) == ["[w0] before 0", "[w1] before 1"]
    follower = Background("logs", "-f", job_id)
    release.touch()
    assert follower.finish(timeout=30) == 0
    assert sorted(follower.lines) == ["[w0] after 0", "[w0] before 0", "[w1] after 1", "[w1] before 1"]
    # fetched from where the local copy ended: nothing twice
    assert (home / "jobs" / job_id / "w1.log").read_text() == "before 1\nafter 1\n"
    listed = {job["id"]: job for job in json.loads(podrun("jobs", "--json").stdout)}
    assert listed[job_id]["state"] == "succeeded" and [w["exit_code"] for w in listed[job_id]["workers"]] == [0, 0]
    wait_until(lambda: processes_of_job(job_id) == [], "the detached agents to finish")


def test_stop_of_a_job_whose_launcher_has_no_process_identity_is_one_line(home, job_file):
    """Where /proc is missing (a launcher on macOS), a record carries no launcher pid."""
    import json

    job_id = job_id_in(podrun("exec", job_file("run: echo ok")).stderr)
    record_path = home / "jobs" / job_id / "job.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "state": "running", "launcher": {}}))
    result = podrun("stop", job_id)
    assert result.returncode == 1 and not crashed(result.stderr)
    assert result.stderr == (f"podrun: error: job {job_id}: its launcher cannot be found on this system (stopping an "
                             f"attached job needs Linux's /proc); press Ctrl-C where it runs\n")
