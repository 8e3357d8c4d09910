"""`podrun jobs`, `podrun logs` (now, tail, follow) and `podrun stop`, against real jobs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

from podrun import jobstore

from helpers import (
    LONG_NAME,
    SAVES_ON_SIGTERM,
    Background,
    crashed,
    job_id_in,
    jobs_on_a_terminal,
    podrun,
    processes_of_job,
    recorded_job,
    wait_until,
)


def jobs(*args: str, columns: int | None = None):
    """`podrun jobs` with stdout a pipe, and COLUMNS only as given: under pytest, subprocesses that inherit
    the environment get COLUMNS=80 (set in the C environment of this process, not in os.environ)."""
    environment = {name: value for name, value in os.environ.items() if name != "COLUMNS"}
    return podrun("jobs", *args, env={**environment, **({"COLUMNS": str(columns)} if columns else {})})


def cells(table: str) -> list[list[str]]:
    """A `podrun jobs` table's rows, split into cells (two spaces or more apart; a cell holds single spaces)."""
    return [re.split(r" {2,}", line) for line in table.splitlines()]


def test_jobs_lists_state_exit_codes_and_duration(home, job_file):
    good = podrun("exec", job_file("run: echo fine", name="good"))
    # worker 1 fails while worker 0 runs on, so worker 0 is always the one stopped (by SIGTERM: 143)
    bad = podrun("exec", job_file("run: if [ $PODRUN_WORKER = 1 ]; then exit 5; fi; exec sleep 60", name="bad"))
    good_id, bad_id = job_id_in(good.stderr), job_id_in(bad.stderr)
    table = jobs()
    assert table.returncode == 0 and table.stderr == ""
    header, *rows = cells(table.stdout)
    assert header == ["ID", "NAME", "TARGET", "STATE", "EXIT CODES", "STARTED", "DURATION"]
    assert [row[:5] for row in rows] == [[bad_id, "bad", "local:2", "failed (unknown on worker 1)", "w1=5, 1 stopped"],
                                         [good_id, "good", "local:2", "succeeded", "2/2 ok"]]
    listed = json.loads(jobs("--json").stdout)  # newest first too, every field
    assert [(job["id"], job["state"], job["exit_code"]) for job in listed] == [(bad_id, "failed", 5),
                                                                               (good_id, "succeeded", 0)]
    assert listed[0]["workers"][1] == {"index": 1, "address": "local/w1", "exit_code": 5, "signal": None,
                                       "endpoint": {"kind": "local", "root": str(home / "local" / "w1")},
                                       "stop_reason": None, "rank": None, "output_at": None, "killed": False,
                                       "step": None, "step_at": None}


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
    listed = {job["id"]: job["state"] for job in json.loads(jobs("--json").stdout)}
    assert listed[job_id] == "lost"


def test_a_damaged_job_record_does_not_break_jobs_or_logs(home, job_file):
    ok = podrun("exec", job_file("run: echo ok"))
    (home / "jobs" / "half-written").mkdir()
    (home / "jobs" / "half-written" / "job.json").write_text('{"id": "half-wr')
    listed = jobs()
    assert listed.returncode == 0 and job_id_in(ok.stderr) in listed.stdout and "half-written" not in listed.stdout
    assert podrun("logs").stdout.splitlines() == ["[w0-1] ok"]
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
    listed = {job["id"]: job for job in json.loads(jobs("--json").stdout)}
    assert listed[job_id]["state"] == "running" and listed[job_id]["detached"]
    now = podrun("logs", job_id)
    assert sorted(now.stdout.splitlines()) == ["[w0] before 0", "[w1] before 1"]
    follower = Background("logs", "-f", job_id)
    release.touch()
    assert follower.finish(timeout=30) == 0
    *output, outcome = follower.lines
    assert sorted(output) == ["[w0] after 0", "[w0] before 0", "[w1] after 1", "[w1] before 1"]
    assert outcome.startswith(f"podrun: job {job_id} succeeded after ")  # the job's last word, on stderr
    # fetched from where the local copy ended: nothing twice
    assert (home / "jobs" / job_id / "w1.log").read_text() == "before 1\nafter 1\n"
    listed = {job["id"]: job for job in json.loads(jobs("--json").stdout)}
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




def test_jobs_fit_the_terminal_and_summarise_32_workers(home, monkeypatch):
    now = time.time()
    fail_fast = recorded_job(LONG_NAME, now - 30, [143] * 5 + [3] + [143] * 26, jobstore.FAILED, 3,
                             stopped=tuple(set(range(32)) - {5}))
    two_failed = recorded_job(LONG_NAME, now - 20, [0] * 5 + [3, 0, 137] + [0] * 24, jobstore.FAILED, 3)
    many_failed = recorded_job("flaky", now - 15, [1] * 5 + [0] * 27, jobstore.FAILED, 1)
    running = recorded_job("train", now - 10, [0] * 30 + [None] * 2, jobstore.RUNNING, None)
    stopped = recorded_job("train", now - 5, [143] * 32, jobstore.STOPPED, 143, stopped=tuple(range(32)))
    succeeded = recorded_job(LONG_NAME, now, [0] * 32)
    newest_first = [succeeded, stopped, running, many_failed, two_failed, fail_fast]
    summaries = ["32/32 ok", "32 stopped", "30/32 ok, 2 running", "w0=1 w1=1 w2=1 +2", "w5=3 w7=137", "w5=3, 31 stopped"]

    piped = jobs()  # a pipe gets whole rows, as from ps
    header, *rows = cells(piped.stdout)
    assert [(row[0], row[4]) for row in rows] == list(zip(newest_first, summaries))
    assert max(map(len, piped.stdout.splitlines())) > 120

    narrow = jobs_on_a_terminal(80, monkeypatch)
    assert max(map(len, narrow.splitlines())) <= 80, narrow
    header, *rows = cells(narrow)
    assert header == ["ID", "NAME", "TARGET", "STATE", "EXIT CODES", "STARTED", "DURATION"]
    assert [row[4] for row in rows] == summaries  # whole: only the name and the id give way at 80 columns
    assert [row[1] for row in rows][1:4] == ["train", "train", "flaky"]  # the widest gives way: short names stay
    for row, job_id in zip(rows, newest_first):  # an id keeps its beginning and its end
        head, _, end = row[0].partition("…")
        assert job_id.startswith(head) and job_id.endswith(end) and len(head) >= 5 and len(end) >= 5, row
    assert all(re.fullmatch(r"\d\d:\d\d|[A-Z][a-z]{2} \d\d", row[5]) for row in rows)  # as ps: today's time
    assert [row[6] for row in rows if row[3] != "running"] == ["1h02m"] * 5


def test_jobs_are_newest_first_limited_and_filtered(home):
    now = time.time()
    states = [jobstore.SUCCEEDED, jobstore.FAILED, jobstore.STOPPED]
    ids = [recorded_job("sweep" if serial % 2 else "eval", now - 100 + serial, [0, 0], states[serial % 3],
                        serial=serial) for serial in range(23)]
    newest_first = ids[::-1]

    default = jobs()
    assert [row[0] for row in cells(default.stdout)[1:]] == newest_first[:20]
    assert default.stderr == "podrun: 3 older jobs not shown; -n N or --all shows them\n"
    every = jobs("--all")
    assert [row[0] for row in cells(every.stdout)[1:]] == newest_first and every.stderr == ""
    few = jobs("-n", "2")
    assert [row[0] for row in cells(few.stdout)[1:]] == newest_first[:2]
    assert few.stderr == "podrun: 21 older jobs not shown; -n N or --all shows them\n"

    failed = jobs("--state", "failed")
    assert [row[0] for row in cells(failed.stdout)[1:]] == [job for job in newest_first if ids.index(job) % 3 == 1]
    assert {row[3] for row in cells(jobs("--state", "stopped,failed").stdout)[1:]} == {"stopped", "failed"}
    assert {row[3] for row in cells(jobs("--state", "stopped", "--state", "succeeded").stdout)[1:]} == {
        "stopped", "succeeded"}
    assert [row[0] for row in cells(jobs("eval").stdout)[1:]] == [job for job in newest_first
                                                                           if job.startswith("eval-")]
    by_prefix = jobs(newest_first[0][:-3], "--all")
    assert [row[0] for row in cells(by_prefix.stdout)[1:]] == [newest_first[0]]

    listed = json.loads(jobs("--json").stdout)  # everything, for scripts
    assert [job["id"] for job in listed] == newest_first
    assert [job["id"] for job in json.loads(jobs("--json", "-n", "1", "sweep").stdout)] == [newest_first[1]]

    wrong = jobs("--state", "done")
    assert wrong.returncode == 2 and not crashed(wrong.stderr)
    assert "argument --state: 'done': expected running, succeeded, failed, stopped, lost" in wrong.stderr


def test_logs_takes_an_id_prefix_or_a_name(home):
    now = time.time()
    ids = [recorded_job("train", now - 30 + serial, [0], serial=serial) for serial in range(7)]
    other = recorded_job("train-big", now, [0])
    for job_id in (*ids, other):
        (home / "jobs" / job_id / "w0.log").write_text(f"output of {job_id}\n")

    def logs_of(text: str) -> str:
        shown = podrun("logs", text)
        assert shown.returncode == 0, shown.stderr
        return shown.stdout

    assert logs_of(ids[2]) == f"[w0] output of {ids[2]}\n"
    assert logs_of(ids[2][:-2]) == f"[w0] output of {ids[2]}\n"  # a unique prefix
    assert logs_of("train") == f"[w0] output of {ids[-1]}\n"  # the newest of that name, not train-big
    assert logs_of("train-b") == f"[w0] output of {other}\n"
    ambiguous = podrun("logs", "tra")
    assert ambiguous.returncode == 1 and ambiguous.stderr.count("\n") == 1 and not crashed(ambiguous.stderr)
    assert ambiguous.stderr.startswith("podrun: error: job 'tra' is ambiguous: 8 job ids begin so (")
    assert ambiguous.stderr.endswith(", and 3 more); give more of the id\n")
    assert sum(job_id in ambiguous.stderr for job_id in (*ids, other)) == 5
    missing = podrun("logs", "nothing-like-it")
    assert missing.returncode == 1 and missing.stderr.startswith("podrun: error: no job 'nothing-like-it' in ")


def test_logs_and_stop_default_to_the_newest_running_job(home, job_file, tmp_path):
    release = tmp_path / "release"
    job = Background("exec", gated_job(job_file, release))
    job.wait_for(r"^\[w0\] before 0")
    job.wait_for(r"^\[w1\] before 1")
    running_id = job_id_in(job.text)
    finished = podrun("exec", job_file("run: echo done", name="quick"))  # newer, but over
    assert sorted(podrun("logs").stdout.splitlines()) == ["[w0] before 0", "[w1] before 1"]

    stopped = podrun("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stderr == (f"podrun: stopping job {running_id}, the newest running job\n"
                              f"podrun: stopping: SIGTERM sent, waiting up to 30s (stop_grace)\n")
    assert stopped.stdout == f"podrun: job {running_id} is stopped\n"
    assert job.finish() == 143 and processes_of_job(running_id) == []
    none_left = podrun("stop")
    assert none_left.returncode == 1
    assert none_left.stderr == "podrun: error: no job is running; `podrun jobs` lists them, `podrun stop JOB_ID` names one\n"
    assert podrun("logs").stdout.splitlines() == ["[w0-1] done"]  # none running: the newest
    assert job_id_in(finished.stderr) in jobs("-n", "1").stdout


PROGRESS_JOB = r"""
run: |
  printf 'first\nsecond\n'
  printf '\r 10%%|#  |\r 50%%|## |\r100%%|###|\n'
  printf 'last'
"""


def test_logs_tail_counts_lines_as_a_person_sees_them(home, job_file):
    job_id = job_id_in(podrun("exec", job_file(PROGRESS_JOB)).stderr)

    def tail(count: int) -> list[str]:
        shown = podrun("logs", job_id, "--worker", "0", "--tail", str(count))
        assert shown.returncode == 0, shown.stderr
        return shown.stdout.splitlines()

    assert tail(0) == []
    assert tail(1) == ["last"]  # a last line without a newline counts
    two = tail(2)  # the redrawn bar is one line: shown in its final state, or as its redraws (worker_output.py's choice)
    assert "second" not in two and "100%|###|" in two and two[-1] == "last"
    assert tail(3)[0] == "second"
    assert tail(4) == tail(100)  # more than the log has: all of it
    assert tail(100)[0] == "first"


def test_logs_follow_with_tail_0_shows_only_what_comes_next(home, job_file, tmp_path):
    release = tmp_path / "release"
    job = Background("exec", job_file(f"""
        target: {{local: {{workers: 1}}}}
        run: |
          i=0
          while [ ! -e {release} ]; do i=$((i+1)); echo "tick $i"; sleep 0.05; done
          echo end
    """))
    job.wait_for(r"^\[w0\] tick 5$")
    follower = Background("logs", "-f", "--tail", "0")
    follower.wait_for(r"^\[w0\] tick \d+$")
    release.touch()
    assert job.finish() == 0 and follower.finish(timeout=10) == 0
    ticks = [int(line.split()[-1]) for line in follower.lines if "tick" in line]
    assert ticks[0] > 5 and ticks == list(range(ticks[0], ticks[0] + len(ticks)))
    assert follower.lines[-2:] == ["[w0] end", f"podrun: job {job_id_in(job.text)} succeeded after " +
                                   follower.lines[-1].rpartition("after ")[2]]


def test_a_job_id_never_reuses_one_in_the_store(home, monkeypatch):
    """Jobs started in one second draw a random suffix each: a taken one is drawn again, not reused."""
    suffixes = iter([b"\x85\x75", b"\x85\x75", b"\x00\x01"])
    monkeypatch.setattr(os, "urandom", lambda count: next(suffixes))
    monkeypatch.setattr(time, "strftime", lambda pattern: "20261124-045114")
    first = jobstore.new_job_id("job")
    os.makedirs(os.path.join(home, "jobs", first))
    assert (first, jobstore.new_job_id("job")) == ("job-20261124-045114-8575", "job-20261124-045114-0001")


def test_a_job_podrun_stopped_is_stopped_whatever_its_program_exits_with_attached_or_detached(home, job_file):
    # what the README advises: save on SIGTERM, then exit 0
    attached = Background("exec", job_file(SAVES_ON_SIGTERM, name="attached"))
    attached.wait_for(r"^\[w1\] up 1")
    attached_id = job_id_in(attached.text)
    assert podrun("stop", attached_id).returncode == 0
    assert attached.finish() == 143

    launched = podrun("exec", "--detach", job_file(SAVES_ON_SIGTERM, name="detached"))
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    wait_until(lambda: sorted(podrun("logs", job_id).stdout.splitlines()) == ["[w0] up 0", "[w1] up 1"],
               "both workers to be up")
    follower = Background("logs", "-f", job_id)
    stopped = podrun("stop", job_id)
    assert stopped.returncode == 0 and f"job {job_id} is stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    assert follower.finish(timeout=30) == 143
    assert "[w0] saved 0" in follower.lines
    listed = {job["id"]: job for job in json.loads(jobs("--json").stdout)}
    for job in (attached_id, job_id):
        assert (listed[job]["state"], listed[job]["exit_code"]) == ("stopped", 143), listed[job]
        assert jobs_row(job)[3] == "stopped", jobs_row(job)
    assert jobs_row(job_id)[4] == "2 stopped"  # by their agents (an attached job's show the codes: 2/2 ok)
    wait_until(lambda: processes_of_job(job_id) == [], "the detached agents to finish")


def jobs_row(job_id: str) -> list[str]:
    return next(row for row in cells(jobs().stdout) if row[0] == job_id)


def test_a_detached_job_whose_workers_are_not_known_yet_stays_running_when_its_supervisor_is_gone(home):
    # as a supervisor records a job while its TPU is being created, then is killed: no worker to ask
    # (a supervisor host's `podrun jobs --json` reads it so, and the laptop's pointer takes what it says)
    gone = subprocess.Popen(["sleep", "60"])
    supervisor = jobstore.process_identity(gone.pid)
    gone.kill()
    gone.wait()
    record = jobstore.JobRecord(id=jobstore.new_job_id("creating"), name="creating", target="tpu", spec_path="job.yaml",
                                workers=[], detached=True, supervisor=supervisor)
    record.create()
    for _ in range(2):  # and it is not saved otherwise by the first listing
        listed = {job["id"]: job for job in json.loads(jobs("--json").stdout)}
        assert listed[record.id]["state"] == "running", listed[record.id]
    row = jobs_row(record.id)
    assert row[3].startswith("running (supervisor lost") and row[4] == "-", row
