"""`podrun report` (README: Long runs): each job records its phases per worker per attempt in
job.json (and `podrun jobs --json`); the report states wall time, goodput, the rest by cause, the
attempts and the slowest worker of each phase, and writes report.html in the job's directory."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from helpers import WAIT_FOR_PREEMPTION, Background, job_id_in, lifecycle_spec, podrun, processes_of_job, wait_until

FAILS_FIRST = ("target: {local: {workers: 2}}\n"
               "setup: echo setting up\n"
               "run: |\n"
               "  for i in 1 2 3; do echo \"step $i\"; sleep 0.2; done\n"
               "  [ \"$PODRUN_ATTEMPT\" != 0 ] || { [ \"$PODRUN_WORKER\" = 1 ] && exit 3; exec sleep 600; }\n"
               "restarts: {max: 1, on: [failure]}\n")
TITLE = re.compile(r"<title>([^<]*)</title>")
STALLED = 124


def page_of(stdout: str) -> str:
    shown = re.search(r"^timeline: (\S+report\.html)$", stdout, re.MULTILINE)
    assert shown, stdout
    return Path(shown[1]).read_text()


def listed(job_id: str) -> dict:
    result = podrun("jobs", "--json", job_id)
    assert result.returncode == 0, result.stderr
    return next(job for job in json.loads(result.stdout) if job["id"] == job_id)


def test_a_job_that_failed_then_succeeded_reports_goodput_both_attempts_and_both_workers_phases(home, job_file,
                                                                                                 monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.2")
    ran = podrun("exec", job_file(FAILS_FIRST))
    assert ran.returncode == 0, ran.stderr
    job_id = job_id_in(ran.stderr)

    result = podrun("report", job_id)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    goodput = re.search(r"^wall time (\d+\.\d+)s; goodput (\d+\.\d)% \((\d+\.\d+)s in run\)$", out, re.MULTILINE)
    assert goodput, out
    wall_s, share, run_s = float(goodput[1]), float(goodput[2]), float(goodput[3])
    assert 0 < run_s < wall_s and abs(share - 100 * run_s / wall_s) < 1
    # two runs of at least 0.6 s each (three steps of 0.2 s), and a wait before the restart
    assert run_s >= 1.2, out
    recovery = r"infrastructure_recovery_from_disruption 0\.[2-9]\d?s"
    assert re.search(rf"^the rest: .*setup \d+\.\d+s.*{recovery}", out, re.MULTILINE), out
    assert re.search(r"^attempt 0: failed after \d+\.\d+s \(unknown on worker 1\): worker 1 exited with code 3 in run$",
                     out, re.MULTILINE), out
    assert re.search(r"^attempt 1: succeeded after \d+\.\d+s$", out, re.MULTILINE), out
    assert re.search(r"^run +\d+\.\d+s +w[01] \d+\.\d+s, \+\d+\.\d+s over the median worker$", out, re.MULTILINE), out

    titles = TITLE.findall(page_of(out))
    for worker in (0, 1):
        for attempt in (0, 1):
            for phase in ("connect", "setup", "run"):
                assert any(t.startswith(f"w{worker}: {phase}, attempt {attempt}: ") for t in titles), (worker, phase)
    assert any(t.startswith("w0: stop, attempt 0: ") for t in titles)  # worker 1's failure stopped it
    assert any(t.startswith("w1: ship, attempt 0: ") and "bytes" in t for t in titles)


def test_jobs_json_carries_each_workers_phase_times(home, job_file, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.2")
    ran = podrun("exec", job_file(FAILS_FIRST))
    job = listed(job_id_in(ran.stderr))
    runs = [entry for entry in job["phases"] if entry["phase"] == "run"]
    assert [entry["attempt"] for entry in runs] == [0, 1]
    for entry in runs:
        assert set(entry["workers"]) == {"0", "1"}
        for start, end in entry["workers"].values():
            assert job["started_at"] - 0.001 <= start < end <= job["ended_at"] + 0.001  # phases keep ms (timeline.now)
        # "step 1" to "step 3", as the launcher received them, per slot
        assert sum(map(int, entry["lines"]["1"]["counts"].split())) == 3
    restart = next(entry for entry in job["phases"] if entry["phase"] == "restart")
    assert restart["end"] - restart["start"] == pytest.approx(0.2, abs=0.01)


def test_a_stalled_job_reports_its_silence_as_stall(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: echo started; exec sleep 600\nstall: 1s\nstop_grace: 1s\n")
    ran = podrun("exec", spec)
    assert ran.returncode != 0 and "stalled" in ran.stderr
    result = podrun("report")  # the newest job
    stall = re.search(r"^the rest: .*stall (\d+\.\d+)s", result.stdout, re.MULTILINE)
    assert stall and float(stall[1]) >= 1.0, result.stdout
    assert any(t.startswith("job: stall, attempt 0: ") for t in TITLE.findall(page_of(result.stdout)))


def test_a_detached_jobs_stall_counts_as_stall_as_an_attached_jobs_does(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: echo started; exec sleep 600\nstall: 2s\nstop_grace: 1s\n")
    ran = podrun("exec", spec, "--detach")
    assert ran.returncode == 0, ran.stderr
    job_id = job_id_in(ran.stderr)
    wait_until(lambda: not processes_of_job(job_id), "worker 0's agent to stop the stalled job", timeout=20)
    assert podrun("logs", "-f", job_id).returncode == STALLED  # its end collected from the workers
    report = json.loads(podrun("report", "--json", job_id).stdout)
    assert report["state"] == "stalled"
    # from the last line to the stop: the 2 s of silence, and no more than the agents took to see it
    assert 2.0 <= report["parts_s"]["stall"] < 4.0, report
    assert report["goodput"] < 1 - report["parts_s"]["stall"] / report["wall_s"] + 1e-9
    assert sum(report["parts_s"].values()) == pytest.approx(report["wall_s"], abs=1e-6)
    (stall,) = [entry for entry in listed(job_id)["phases"] if entry["phase"] == "stall"]
    assert stall["why"].startswith("no output from any worker for 2.")


def test_report_json_parts_add_up_to_the_wall_time_and_without_steps_run_is_one_part(home, job_file, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.2")
    job_id = job_id_in(podrun("exec", job_file(FAILS_FIRST)).stderr)
    result = podrun("report", "--json", job_id)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # one object, nothing else
    assert sum(report["parts_s"].values()) == pytest.approx(report["wall_s"], abs=1e-6)
    assert report["parts_s"]["run"] >= 1.2 and "productive" not in report["parts_s"]
    assert report["goodput"] == pytest.approx(report["parts_s"]["run"] / report["wall_s"])
    assert report["parts_s"]["infrastructure_recovery_from_disruption"] == pytest.approx(0.2, abs=0.01)  # the wait
    assert report["steps"] == [] and report["lost_progress_steps"] == 0
    assert [(a["attempt"], a["state"]) for a in report["attempts"]] == [(0, "failed"), (1, "succeeded")]
    assert not (home / "jobs" / job_id / "report.html").exists()


def test_a_detached_jobs_run_ends_when_its_workers_say(home, job_file):
    ran = podrun("exec", job_file("target: {local: {workers: 2}}\nrun: echo hi; sleep 1\n"), "--detach")
    assert ran.returncode == 0, ran.stderr
    job_id = job_id_in(ran.stderr)
    assert podrun("logs", "-f", job_id).returncode == 0
    run = next(entry for entry in listed(job_id)["phases"] if entry["phase"] == "run")
    for start, end in run["workers"].values():
        assert end is not None and end - start >= 1.0
    result = podrun("report", job_id)
    assert "attempt 0: succeeded" in result.stdout and "No lines counted" in page_of(result.stdout)


def test_a_running_job_is_reported_up_to_now(home, job_file, tmp_path):
    release = tmp_path / "release"
    job = Background("exec", job_file(f"target: {{local: {{workers: 2}}}}\n"
                                      f"run: echo started; until [ -e {release} ]; do sleep 0.05; done\n"),
                     "--no-collapse")
    job.wait_for(r"^\[w1\] started$")
    result = podrun("report")  # the newest running job
    release.touch()
    assert job.finish() == 0, job.text
    assert result.returncode == 0, result.stderr
    assert re.search(r"^job \S+ is running$", result.stdout, re.MULTILINE), result.stdout
    assert "attempt 0: running after" in result.stdout
    titles = TITLE.findall(page_of(result.stdout))
    assert any(t.startswith("w1: run, attempt 0: ") for t in titles), titles


def test_report_of_an_unknown_job_says_so_in_one_line(home, job_file):
    assert podrun("exec", job_file("target: {local: {workers: 1}}\nrun: 'true'\n")).returncode == 0
    result = podrun("report", "no-such-job")
    assert result.returncode != 0 and result.stderr.count("\n") == 1 and "no job 'no-such-job'" in result.stderr


def synthetic_record(home: Path, workers: int) -> str:
    """A finished job of `workers` workers: worker 17 slow in setup, worker 900 silent, the rest alike
    (within a few milliseconds), two attempts, the first preempted."""
    start = time.time() - 3600
    job_id = "big-20260101-000000-abcd"
    phases, attempts = [], []
    for attempt, at in enumerate((start, start + 1800)):
        setup_end = {w: at + 60 + (w % 7) * 0.001 + (300 if w == 17 else 0) for w in range(workers)}
        run_end = at + 1700
        phases.append({"phase": "connect", "attempt": attempt, "start": at, "end": at + 20,
                       "workers": {str(w): [at, at + 20 - (w % 3) * 0.001] for w in range(workers)}})
        phases.append({"phase": "setup", "attempt": attempt, "start": at + 20, "end": max(setup_end.values()),
                       "workers": {str(w): [at + 20, setup_end[w]] for w in range(workers)}})
        phases.append({"phase": "run", "attempt": attempt, "start": at + 400, "end": run_end,
                       "workers": {str(w): [setup_end[17] + 0.01, run_end] for w in range(workers)},
                       "lines": {str(w): {"start": setup_end[17] + 0.01, "every_s": 8,
                                          "counts": " ".join([str(0 if w == 900 else 40)] * 100)} for w in range(workers)}})
        if attempt == 0:
            phases.append({"phase": "preempted", "attempt": 0, "start": run_end, "end": run_end,
                           "why": "worker 3: the VM was preempted"})
            phases.append({"phase": "recreate", "attempt": 1, "start": run_end + 1, "end": at + 1800})
            attempts.append({"attempt": 0, "state": "preempted", "exit_code": 75, "summary": "worker 3: preempted",
                             "started_at": start, "ended_at": run_end})
    record = {"id": job_id, "name": "big", "target": f"tpu:{workers}", "spec_path": "/x/big.yaml",
              "workers": [{"index": w, "address": f"10.0.{w // 256}.{w % 256}"} for w in range(workers)],
              "state": "succeeded", "started_at": start, "ended_at": start + 3500, "exit_code": 0,
              "launcher": {}, "attempt": 1, "attempts": attempts, "phases": phases}
    folder = home / "jobs" / job_id
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps(record))
    return job_id


def test_at_1024_workers_the_page_stays_small_with_bands_and_outliers_keep_their_own_row(home):
    job_id = synthetic_record(home, 1024)
    result = podrun("report", job_id)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^setup +\S+ +w17 11m20s, \+10m00s over the median worker$", result.stdout, re.MULTILINE), \
        result.stdout
    assert "printed nothing in run: w900" in result.stdout
    assert "preempted in attempt 0: worker 3: the VM was preempted" in result.stdout
    page = page_of(result.stdout)
    assert len(page) < 100_000, len(page)
    start = page.index('<svg id="timeline"')
    timeline = page[start:page.index("</svg>", start)]
    labels = re.findall(r'<text x="4" y="[\d.]+">([^<]+)<title>', timeline)
    assert labels[0] == "w0-16,18-899,901-1023 (1022)", labels
    assert set(labels) == {labels[0], "w17", "w900"}


@pytest.mark.slow
def test_report_of_a_supervised_job_is_written_on_the_laptop_from_the_supervisors_record(home, hosts_spec, supervisor):
    spec = hosts_spec(supervisor.spec + "run: echo \"hello from $PODRUN_WORKER\"\n", hosts=(0, 1))
    ran = podrun("exec", spec)
    assert ran.returncode == 0, ran.stderr
    job_id = job_id_in(ran.stderr)
    result = podrun("report", job_id)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^wall time \S+; goodput \d+\.\d%", result.stdout, re.MULTILINE), result.stdout
    assert "attempt 0: succeeded" in result.stdout
    page = page_of(result.stdout)
    assert str(home) in re.search(r"^timeline: (\S+)$", result.stdout, re.MULTILINE)[1]  # on the laptop
    titles = TITLE.findall(page)
    assert all(any(t.startswith(f"w{worker}: run, attempt 0: ") for t in titles) for worker in (0, 1)), titles


@pytest.mark.slow
def test_a_queued_tpu_preempted_once_reports_its_queue_wait_creation_and_recovery(home, tpu_api, lab, job_file):
    tpu_api.withhold_capacity(3)
    spec = lifecycle_spec(job_file, WAIT_FOR_PREEMPTION, "queued: true, spot: true", restarts="{max: 1}",
                          delete_after="always")
    job = Background("exec", spec)
    job.wait_for(r"\[w1\] attempt 0 on worker 1", timeout=90)
    tpu_api.preempt("life")
    assert job.finish(timeout=120) == 0, job.text
    result = podrun("report", job_id_in(job.text))
    assert result.returncode == 0, result.stderr
    rest = re.search(r"^the rest: (.*)$", result.stdout, re.MULTILINE)
    assert rest, result.stdout
    took = {cause: float(seconds) for cause, seconds in re.findall(r"(\w+) (\d+\.\d+)s", rest[1])}
    assert took["queue"] >= 2.5 and took["create"] > 0 and took["infrastructure_recovery_from_disruption"] > 0, result.stdout
    assert re.search(r"^preempted in attempt 0: ", result.stdout, re.MULTILINE), result.stdout
    assert "attempt 0: preempted" in result.stdout and "attempt 1: succeeded" in result.stdout
    titles = TITLE.findall(page_of(result.stdout))
    assert any(t.startswith("job: recreate, attempt 1: ") for t in titles)
    assert any(t.startswith("preempted: ") for t in titles)


def test_a_long_runs_line_counts_stay_bounded_and_keep_every_line():
    from podrun import timeline

    counter = {"start": 1000.0, "every_s": 1, "counts": []}
    for second in range(100_000):  # a line a second for 28 hours
        timeline.count_lines(counter, 1, 1000.0 + second + 0.5)
    assert len(counter["counts"]) <= timeline.MAX_SLOTS and sum(counter["counts"]) == 100_000
    assert counter["every_s"] == 1024 and counter["counts"][0] == 1024
