"""A job judged by its progress (`progress`): each worker's step read from its output or a file, shown by
`podrun jobs`, and a stall that is no step for that long, whatever the job prints."""

from __future__ import annotations

import json
import re
import time

import pytest

from helpers import Background, job_id_in, podrun, processes_of_job, stderr_lines_without_traceback, wait_until

STALLED = 124

# steps, then the main thread hangs while a telemetry thread goes on printing: the output never stops;
# worker 2 waits for its data where the others wait in a collective
HEARTBEATS_AFTER_A_HANG = """\
import os, threading, time

def heartbeat():
    while True:
        print("alive", flush=True)
        time.sleep(0.5)

def all_reduce():
    time.sleep(HANG)

def load_batch():
    time.sleep(HANG)

for step in range(1, STEPS + 1):
    print(f"step {step} loss 0.{step}", flush=True)
    time.sleep(PAUSE)
threading.Thread(target=heartbeat, daemon=True).start()
load_batch() if os.environ["PODRUN_WORKER"] == "2" else all_reduce()
"""


def hanging(steps: int = 4, pause: float = 0.3, hang: float = 300) -> str:
    return f"STEPS, PAUSE, HANG = {steps}, {pause}, {hang}\n" + HEARTBEATS_AFTER_A_HANG


def stall_line(stderr: str) -> str:
    (line,) = [line for line in stderr_lines_without_traceback(stderr) if "stalled:" in line and "saving" in line]
    return line


@pytest.mark.slow
def test_a_job_that_prints_heartbeats_but_makes_no_step_is_stopped_as_stalled_at_its_last_step(home, job_file):
    spec = job_file("target: {local: {workers: 3}}\nrun: python3 train.py\nprogress: 'step (\\d+)'\nstall: 3s\n"
                    "stop_grace: 2s\n", {"train.py": hanging()})
    started = time.monotonic()
    result = podrun("exec", spec)
    took = time.monotonic() - started
    assert result.returncode == STALLED, result.stderr
    assert "] alive" in result.stdout  # it printed all along
    # the workers reached step 4 apart, by as much as a loaded machine delays them: each named with its own wait
    assert re.search(r"no step from any worker for 3\.0s: the job is at step 4 \((w[0-2](-[12])?(,[0-2])* at step 4 "
                     r"for 3\.\ds(, )?)+\)", stall_line(result.stderr)), stall_line(result.stderr)
    assert "podrun: w2 is in load_batch (train.py:13); the other 2 are in all_reduce (train.py:10)" in result.stderr
    assert took < 4 * 0.3 + 3 + 10, took  # the steps, the bound, the agents' start and stop: seconds, not minutes
    job_id = job_id_in(result.stderr)
    assert sorted(path.name for path in (home / "jobs" / job_id / "stacks" / "1").iterdir()) == \
        ["w0.txt", "w1.txt", "w2.txt"]
    assert not processes_of_job(job_id)
    (job,) = json.loads(podrun("jobs", "--json").stdout)
    assert (job["state"], job["exit_code"]) == ("stalled", STALLED)
    (steps,) = job["steps"]
    assert (steps["attempt"], steps["first"], steps["last"]) == (0, 1, 4)
    assert [worker["step"] for worker in job["workers"]] == [4, 4, 4]
    assert podrun("jobs").stdout.splitlines()[1].split()[4] == "4"  # the STEP column


@pytest.mark.slow
def test_without_progress_the_same_heartbeats_keep_the_job_from_stalling(home, job_file):
    spec = job_file("target: {local: {workers: 1}}\nrun: python3 train.py\nstall: 2s\n",
                    {"train.py": hanging(steps=2, pause=0.1, hang=4)})
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr  # "alive" was output enough
    (job,) = json.loads(podrun("jobs", "--json").stdout)
    assert job["steps"] == [] and job["workers"][0]["step"] is None


@pytest.mark.slow
def test_a_detached_job_is_judged_by_its_steps_on_its_workers(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: python3 train.py\nprogress: 'step (\\d+)'\nstall: 2s\n"
                    "stop_grace: 1s\n", {"train.py": hanging(steps=3, pause=0.2)})
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)

    def state() -> dict:
        return json.loads(podrun("jobs", "--json").stdout)[0]

    wait_until(lambda: state()["state"] == "stalled", "the detached job to stall", timeout=30)
    job = state()
    assert re.fullmatch(r"no step from any worker for 2\.0s: the job is at step 3 \((w0-1 at step 3 for 2\.\ds|"
                        r"w[01] at step 3 for 2\.\ds, w[01] at step 3 for 2\.\ds)\)", job["summary"]), job["summary"]
    (steps,) = job["steps"]  # from the workers' own samples, whenever `jobs` looked before the end
    assert (steps["first"], steps["last"]) == (1, 3) and [worker["step"] for worker in job["workers"]] == [3, 3]
    assert [step for step in steps["samples"][1::2]] == sorted(steps["samples"][1::2])
    wait_until(lambda: not processes_of_job(job_id), "the job's processes to end")


@pytest.mark.slow
def test_a_detached_job_whose_rank_0_alone_prints_its_step_keeps_its_steps_over_time(home, job_file):
    only_worker_0 = "import os, time\nif os.environ['PODRUN_WORKER'] == '0':\n" + "".join(
        f"    print('step {step}', flush=True)\n    time.sleep(1.2)\n" for step in range(1, 4))
    spec = job_file("target: {local: {workers: 2}}\nrun: python3 train.py\nprogress: 'step (\\d+)'\n",
                    {"train.py": only_worker_0})
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: not processes_of_job(job_id), "the job's end", timeout=30)  # nothing fetched meanwhile
    (job,) = json.loads(podrun("jobs", "--json").stdout)
    assert job["state"] == "succeeded", job
    (steps,) = job["steps"]
    assert (steps["first"], steps["last"], steps["samples"][1::2]) == (1, 3, [1, 2, 3])  # worker 1 printed none


@pytest.mark.slow
def test_a_step_written_to_a_file_is_progress_too(home, job_file):
    writes_its_step = ("import time\nfor step in range(1, 4):\n    open('step.txt', 'w').write(str(step))\n"
                       "    time.sleep(1.2)\nwhile True:\n    print('alive', flush=True)\n    time.sleep(0.5)\n")
    spec = job_file("target: {local: {workers: 1}}\nrun: python3 train.py\nprogress: {file: step.txt}\nstall: 3s\n"
                    "stop_grace: 1s\n", {"train.py": writes_its_step})
    result = podrun("exec", spec)
    assert result.returncode == STALLED, result.stderr
    assert "the job is at step 3 (w0 at step 3 for 3." in stall_line(result.stderr)


@pytest.mark.slow
def test_stall_auto_takes_its_bound_from_the_step_time(home, job_file, monkeypatch):
    monkeypatch.setenv("PODRUN_STALL_AUTO_FLOOR", "1")  # 10 x 0.2 s steps = 2 s, above this floor
    spec = job_file("target: {local: {workers: 1}}\nrun: python3 train.py\nprogress: 'step (\\d+)'\nstall: auto\n"
                    "stop_grace: 1s\n", {"train.py": hanging(steps=8, pause=0.2)})
    started = time.monotonic()
    result = podrun("exec", spec)
    assert result.returncode == STALLED, result.stderr
    assert "the job is at step 8" in stall_line(result.stderr)
    # 8 steps, then a bound of 10 steps (2 s): seconds, where a bound from anything but the step time
    # would be minutes (the cap, 7200 s); a wide margin, as a loaded machine starts Python slowly
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_a_running_job_shows_its_step_and_rate(home, job_file):
    counts = "import time\nfor step in range(1, 1000):\n    print(f'step {step}', flush=True)\n    time.sleep(0.05)\n"
    spec = job_file("target: {local: {workers: 2}}\nrun: python3 train.py\nprogress: 'step (\\d+)'\n",
                    {"train.py": counts})
    job = Background("exec", spec)
    try:
        job.wait_for(r"step 60$")
        wait_until(lambda: "/min" in podrun("jobs").stdout, "a steps-per-minute figure")
        row = podrun("jobs").stdout.splitlines()[1]
        step, rate = re.search(r"\) +(\d+) (\d+)/min ", row).groups()  # after STATE, `running (idle 0s)`
        assert int(step) >= 40 and 200 < int(rate) < 1300, row  # a step each 0.05 s and a print: < 1,200/min
    finally:
        job.process.terminate()
        job.finish()


def test_a_job_with_a_total_shows_the_share_done_and_the_time_left(home, job_file):
    counts = "import time\nfor step in range(1, 1000):\n    print(f'step {step}', flush=True)\n    time.sleep(0.05)\n"
    spec = job_file("target: {local: {workers: 1}}\nrun: python3 train.py\n"
                    "progress: {pattern: 'step (\\d+)', total: 1000}\n", {"train.py": counts})
    job = Background("exec", spec)
    try:
        job.wait_for(r"step 60$")
        wait_until(lambda: " left " in podrun("jobs").stdout, "a time left")
        row = podrun("jobs").stdout.splitlines()[1]
        step, share, rate, minutes, seconds = re.search(
            r"\) +(\d+)/1000 (\d+)% (\d+)/min (?:(\d+)m)?([\d.]+)s left ", row).groups()
        assert int(share) == int(step) // 10, row
        left_s = 60 * int(minutes or 0) + float(seconds)
        assert abs(left_s - 60 * (1000 - int(step)) / int(rate)) < 2, row  # the steps left at the recent rate
    finally:
        job.process.terminate()
        job.finish()


def test_a_supervised_detached_job_shows_its_step_and_rate_as_it_runs(home, job_file):
    """A detached job with restarts is its supervisor's to record: the supervisor's follow of the workers' logs
    keeps their steps in the record as they come (remote/log_follower.py), not only at the end."""
    counts = "import time\nfor step in range(1, 1000):\n    print(f'step {step}', flush=True)\n    time.sleep(0.05)\n"
    spec = job_file("target: {local: {workers: 2}}\nrun: python3 train.py\nprogress: 'step (\\d+)'\n"
                    "restarts: {max: 1, on: [failure]}\n", {"train.py": counts})
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    try:
        wait_until(lambda: re.search(r"supervised, idle \d+s\) +\d+ \d+/min ", podrun("jobs").stdout),
                   "a step and a steps-per-minute figure while it runs", timeout=30)
        row = podrun("jobs").stdout.splitlines()[1]
        step, rate = re.search(r"\) +(\d+) (\d+)/min ", row).groups()
        assert int(step) >= 20 and 200 < int(rate) < 1300, row
        assert "running (supervised" in row, row
    finally:
        assert podrun("stop", job_id).returncode == 0


@pytest.mark.slow
def test_a_detached_jobs_hub_takes_stall_auto_from_the_step_time_too(home, job_file, monkeypatch):
    monkeypatch.setenv("PODRUN_STALL_AUTO_FLOOR", "1")  # read by the launcher, handed to worker 0's hub
    spec = job_file("target: {local: {workers: 2}}\nrun: python3 train.py\nprogress: 'step (\\d+)'\nstall: auto\n"
                    "stop_grace: 1s\n", {"train.py": hanging(steps=8, pause=0.2)})
    started = time.monotonic()
    assert podrun("exec", spec, "--detach").returncode == 0

    def state() -> dict:
        return json.loads(podrun("jobs", "--json").stdout)[0]

    wait_until(lambda: state()["state"] == "stalled", "the hub to stop the job", timeout=30)
    assert "the job is at step 8" in state()["summary"]
    assert time.monotonic() - started < 8 * 0.2 + 2 + 15  # the cap (2 h) would never have stopped it


# tqdm's and Lightning's bar, which starts over each epoch: 3 epochs of 16 steps of 0.25 s, redrawn with `\r`;
# rank 0 alone draws it, as they do
EPOCH_BARS = """\
import os, sys, time

EPOCHS, STEPS, PAUSE = 3, 16, 0.25
if os.environ["PODRUN_WORKER"] == "0":
    for epoch in range(1, EPOCHS + 1):
        for step in range(STEPS + 1):
            done = step * 10 // STEPS
            sys.stderr.write(f"\\rEpoch {epoch}: {step * 100 // STEPS:3d}%|{'#' * done}{' ' * (10 - done)}| "
                             f"{step}/{STEPS} [00:0{step // 4}<00:0{(STEPS - step) // 4},  4.00it/s]")
            sys.stderr.flush()
            if step < STEPS:
                time.sleep(PAUSE)
        sys.stderr.write("\\n")
"""
# the stall: longer than a step (and than the agents' one report a second), shorter than an epoch (4 s)
EPOCH_SPEC = "target: {{local: {{workers: 2}}}}\nrun: python3 train.py\nprogress: '{pattern}'\nstall: 2.5s\nstop_grace: 1s\n"
FALL_LINE = (r"podrun: the step went back in lines matching 'Epoch \d+:.*?(\d+)/\d+': w0 from 16 to 0; a step is "
             r"progress (for stall, restarts and the record) only past the highest one reached; if it starts over "
             r"each epoch, name the epoch in a group of its own: progress: 'Epoch (?P<epoch>\d+):.*?(\d+)/\d+'")


@pytest.mark.slow
def test_a_per_epoch_bar_read_with_an_epoch_group_is_progress_through_every_epoch(home, job_file):
    spec = job_file(EPOCH_SPEC.format(pattern=r"Epoch (?P<epoch>\d+):.*?(\d+)/\d+"), {"train.py": EPOCH_BARS})
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr  # each new epoch's steps were progress
    assert "stalled" not in result.stderr and "went back" not in result.stderr
    (job,) = json.loads(podrun("jobs", "--json").stdout)
    assert job["state"] == "succeeded"
    (steps,) = job["steps"]
    # a running count through the epochs: (epoch - 1) * 16 + step, as the job's step and in its samples
    assert (steps["first"], steps["last"]) == (0, 48) and steps["epoch"] == {"epoch": 3, "step": 16, "first": 1,
                                                                              "steps": 16}
    assert steps["samples"][1::2] == sorted(steps["samples"][1::2]) and len(steps["samples"]) > 2 * 3
    assert [worker["step"] for worker in job["workers"]] == [48, None]
    assert podrun("jobs").stdout.splitlines()[1].split()[4] == "48"  # the STEP column


@pytest.mark.slow
def test_a_step_read_from_a_per_epoch_bar_that_went_back_is_said_once_and_in_the_stall(home, job_file):
    spec = job_file(EPOCH_SPEC.format(pattern=r"Epoch \d+:.*?(\d+)/\d+"), {"train.py": EPOCH_BARS})
    result = podrun("exec", spec)
    assert result.returncode == STALLED, result.stderr  # no step past 16, the first epoch's last, for 2.5 s
    lines = stderr_lines_without_traceback(result.stderr)
    assert [line for line in lines if "went back in" in line] == [FALL_LINE]  # once, before the stall
    assert lines.index(FALL_LINE) < lines.index(stall_line(result.stderr))
    assert re.search(r"stalled: no step from any worker for 2\.5s: the job is at step 16 \(w0 at step 16 for 2\.\ds, "
                     r"w1 no step yet\); the step went back, w0 from 16 to 0, and has not passed where it was since; "
                     r"saving", stall_line(result.stderr)), stall_line(result.stderr)
