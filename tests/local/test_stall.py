"""A hung job is caught (`stall`): the silence named, every worker's stacks saved, the job stopped or
restarted; `podrun stacks` of a running job; how long ago a running job's last line came."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import Background, job_id_in, podrun, processes_of_job, stderr_lines_without_traceback, wait_until

# both workers silent: as one range when their silences round alike, else each (their last lines came apart)
BOTH_SILENT = r"w0-1 silent {s}\.\ds|w[01] silent {s}\.\ds, w[01] silent {s}\.\ds"
ANY_SILENT = r"(, )?w[\d,-]+ silent {s}\.\ds"  # one range of workers and its silence

# worker 1 hangs where a rank stuck in a collective would; worker 0 waits for it, as every other rank does
HANG = """\
import os, sys, time

def hang_in_collective():
    time.sleep(300)

def wait_for_peers():
    time.sleep(300)

print("step 1", flush=True)
hang_in_collective() if os.environ["PODRUN_WORKER"] == "1" else wait_for_peers()
"""
STALLED = 124
NEITHER_ALIKE = "podrun: w0 is in wait_for_peers (hang.py:7); w1 is in hang_in_collective (hang.py:4)"

# workers 0 and 1 wait in one function, worker 2 hangs in another: the odd one out
ODD_ONE_OUT = HANG.replace('os.environ["PODRUN_WORKER"] == "1"', 'os.environ["PODRUN_WORKER"] == "2"')
NAMED = "w2 is in hang_in_collective (hang.py:4); the other 2 are in wait_for_peers (hang.py:7)"

# a real gloo hang: rank 3 never comes to the all_reduce that ranks 0 to 2 wait in
GLOO_HANG = """\
import time
import torch
import torch.distributed as dist

def load_batch():
    time.sleep(300)

dist.init_process_group("gloo")
print("step 1", flush=True)
if dist.get_rank() == 3:
    load_batch()
dist.all_reduce(torch.ones(1))
"""


def stacks_of(home: Path, job_id: str, dump: int = 1) -> dict[str, str]:
    folder = home / "jobs" / job_id / "stacks" / str(dump)
    return {path.name: path.read_text() for path in sorted(folder.iterdir())}


@pytest.mark.slow
def test_a_stall_is_named_with_the_odd_worker_out_its_stacks_saved_for_every_worker_and_the_job_stopped(home, job_file):
    spec = job_file("run: python3 hang.py\nstall: 3s\nstop_grace: 2s\ntarget: {local: {workers: 3}}\n",
                    {"hang.py": ODD_ONE_OUT})
    result = podrun("exec", spec)
    assert result.returncode == STALLED, result.stderr
    job_id = job_id_in(result.stderr)
    lines = stderr_lines_without_traceback(result.stderr)
    said = lines.index(f"podrun: {NAMED}")  # between the stall's line and where the stacks are
    silences = rf"({ANY_SILENT.format(s=3)})+"
    assert re.search(rf"stalled: no output from any worker for 3\.\ds \({silences}\); saving", lines[said - 1])
    assert lines[said + 1] == f"podrun: stacks of every worker saved in {home / 'jobs' / job_id / 'stacks' / '1'}"
    saved = stacks_of(home, job_id)
    assert sorted(saved) == ["w0.txt", "w1.txt", "w2.txt"]
    assert "py-spy dump" in saved["w2.txt"] and "hang_in_collective (hang.py:4)" in saved["w2.txt"]
    assert "wait_for_peers (hang.py:7)" in saved["w0.txt"] and "wait_for_peers (hang.py:7)" in saved["w1.txt"]
    assert not processes_of_job(job_id)
    (job,) = json.loads(podrun("jobs", "--json").stdout)
    assert (job["state"], job["exit_code"]) == ("stalled", STALLED)


@pytest.mark.slow
def test_podrun_stacks_names_the_odd_one_out_and_all_shows_every_stack(home, job_file):
    spec = job_file("run: python3 hang.py\ntarget: {local: {workers: 3}}\n", {"hang.py": ODD_ONE_OUT})
    job_id = job_id_in(podrun("exec", "--detach", spec).stderr)
    try:
        wait_until(lambda: podrun("logs", job_id, "--no-collapse").stdout.count("step 1") == 3, "every worker's first line")
        summed_up = podrun("stacks", job_id)
        assert summed_up.returncode == 0, summed_up.stderr
        assert summed_up.stdout == NAMED + "\n"
        assert f"the stacks, whole, saved in {home / 'jobs' / job_id / 'stacks' / '1'}" in summed_up.stderr
        whole = podrun("stacks", job_id, "--all")
        assert whole.returncode == 0, whole.stderr
        workers = whole.stdout.split("── worker ")[1:]
        assert [section.split(" ", 1)[0] for section in workers] == ["0", "1", "2"]
        assert all("wait_for_peers (hang.py:7)" in workers[index] for index in (0, 1))
        assert "hang_in_collective (hang.py:4)" in workers[2] and "wait_for_peers" not in workers[2]
    finally:
        podrun("stop", job_id)
    assert not processes_of_job(job_id)


@pytest.mark.slow
def test_under_torchrun_a_stall_names_the_rank_that_is_elsewhere(home, job_file):
    """Each rank runs in a session of its own (torchrun's start_new_session): its stacks are the job's too."""
    pytest.importorskip("torch")
    spec = job_file("run: train.py\ntorchrun: {nproc_per_node: 2}\nstall: 10s\nstop_grace: 2s\n"
                    "target: {local: {workers: 2}}\n", {"train.py": GLOO_HANG})
    result = podrun("exec", spec, timeout=240)
    assert result.returncode == STALLED, result.stderr
    assert re.search(r"^podrun: w1 r3 is in load_batch \(train\.py:6\); the other 3 are in all_reduce "
                     r"\(torch/distributed/distributed_c10d\.py:\d+\)$", result.stderr, re.M), result.stderr


@pytest.mark.slow
def test_without_py_spy_the_stacks_say_what_the_kernel_shows(home, job_file):
    spec = job_file("run: python3 hang.py\nstall: 1s\nstop_grace: 1s\ntarget: {local: {workers: 1}}\n"
                    "env: {PATH: /usr/bin:/bin}\n", {"hang.py": HANG})
    result = podrun("exec", spec)
    assert result.returncode == STALLED, result.stderr
    (text,) = stacks_of(home, job_id_in(result.stderr)).values()
    assert "=== pid " in text and "python3 hang.py" in text
    assert "py-spy is not on the job's PATH" in text
    assert "wchan" in text and "hrtimer_nanosleep" in text


@pytest.mark.slow
def test_a_stall_restarts_the_job_when_restarts_on_holds_stall(home, job_file):
    spec = job_file("run: |\n  echo \"attempt $PODRUN_ATTEMPT\"\n  [ \"$PODRUN_ATTEMPT\" = 1 ] || exec sleep 300\n"
                    "stall: 1s\nstop_grace: 1s\nrestarts: {max: 1, on: [stall]}\ntarget: {local: {workers: 2}}\n")
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)
    assert "restart 1 of 1 in 1s: running again on the same workers (no output from any worker for 1." in result.stderr
    (job,) = json.loads(podrun("jobs", "--json").stdout)
    assert (job["state"], job["attempt"], job["attempts"][0]["state"]) == ("succeeded", 1, "stalled")
    assert sorted(stacks_of(home, job_id)) == ["w0.txt", "w1.txt"]
    assert not processes_of_job(job_id)


@pytest.mark.slow
def test_a_detached_job_is_caught_by_its_agents_with_no_launcher_and_its_stacks_fetched(home, job_file):
    spec = job_file("run: python3 hang.py\nstall: 2s\nstop_grace: 1s\ntarget: {local: {workers: 2}}\n",
                    {"hang.py": HANG})
    launched = podrun("exec", "--detach", spec)
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    wait_until(lambda: not processes_of_job(job_id), "worker 0's agent to stop the stalled job", timeout=20)
    fetched = podrun("stacks", job_id)  # fetches the job's end first: the stacks its agents saved, summed up
    assert fetched.returncode == 0 and fetched.stdout == "", fetched.stderr
    assert f"{NEITHER_ALIKE}\npodrun: stacks of every worker saved in " in fetched.stderr
    followed = podrun("logs", "-f", job_id)
    assert followed.returncode == STALLED, followed.stderr
    assert re.search(rf"stalled: no output from any worker for 2\.\ds \({BOTH_SILENT.format(s=2)}\)", followed.stderr)
    saved = stacks_of(home, job_id)
    assert "hang_in_collective (hang.py:4)" in saved["w1.txt"] and "wait_for_peers (hang.py:7)" in saved["w0.txt"]
    assert "stalled" in podrun("jobs").stdout
    later = podrun("stacks", job_id)  # the processes are gone: what the stall saved
    assert later.returncode == 0, later.stderr
    assert later.stdout == NEITHER_ALIKE.removeprefix("podrun: ") + "\n"
    assert f"the stacks its stall saved in {home / 'jobs' / job_id / 'stacks' / '1'}:" in later.stderr


@pytest.mark.slow
def test_podrun_stacks_shows_a_detached_jobs_stacks_per_worker_and_process_and_saves_them(home, job_file):
    spec = job_file("run: python3 hang.py\ntarget: {local: {workers: 2}}\n", {"hang.py": HANG})
    job_id = job_id_in(podrun("exec", "--detach", spec).stderr)
    try:
        wait_until(lambda: "step 1" in podrun("logs", job_id, "--worker", "1").stdout, "worker 1's first line")
        shown = podrun("stacks", "--worker", "1", "--all")
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("── worker 1 (local/w1) ──\n=== pid ")
        assert "python3 hang.py ===\npy-spy dump --pid" in shown.stdout and "hang_in_collective" in shown.stdout
        assert sorted(stacks_of(home, job_id)) == ["w1.txt"]
        both = podrun("stacks", job_id, "--all")
        assert "── worker 0 (local/w0) ──" in both.stdout and "wait_for_peers" in both.stdout
        assert sorted(stacks_of(home, job_id, dump=2)) == ["w0.txt", "w1.txt"]
        assert f"saved in {home / 'jobs' / job_id / 'stacks' / '2'}" in both.stderr
    finally:
        podrun("stop", job_id)
    assert not processes_of_job(job_id)
    ended = podrun("stacks", job_id)
    assert ended.returncode == 1 and "is stopped: stacks come from a running job's processes" in ended.stderr


def test_jobs_shows_how_long_ago_a_running_jobs_last_line_came(home, job_file, tmp_path):
    release = tmp_path / "release"
    spec = job_file(f"run: |\n  echo up\n  while [ ! -e {release} ]; do sleep 0.05; done\n")
    job = Background("exec", spec)
    try:
        job.wait_for(r"\[w0-1\] up")
        wait_until(lambda: re.search(r"running \(idle [1-9]\d*s\)", podrun("jobs").stdout), "an idle time of 1s")
        (listed,) = json.loads(podrun("jobs", "--json").stdout)
        assert all(listed["started_at"] < worker["output_at"] <= listed["started_at"] + 60
                   for worker in listed["workers"])
    finally:
        release.touch()
        assert job.finish() == 0


def test_on_ssh_hosts_podrun_stacks_and_a_detached_stall_name_where_each_worker_hangs(home, lab, hosts_spec):
    # stall: 10s, so that `podrun stacks` comes well within it on a loaded machine (with 5 s, a fresh-clone CI run
    # once saw the stall stop the job first: "the job's agent on this worker has ended")
    spec = hosts_spec("run: python3 hang.py\nstall: 10s\nstop_grace: 1s\n", hosts=(0, 1), files={"hang.py": HANG})
    launched = podrun("exec", "--detach", spec)
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    wait_until(lambda: "step 1" in podrun("logs", job_id, "--worker", "1").stdout, "worker 1's first line")
    shown = podrun("stacks", job_id)  # within the 10 s: the job still runs
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == NEITHER_ALIKE.removeprefix("podrun: ") + "\n"
    wait_until(lambda: not processes_of_job(job_id), "worker 0's agent to stop the stalled job", timeout=30)
    followed = podrun("logs", "-f", job_id)
    assert followed.returncode == STALLED, followed.stderr
    assert NEITHER_ALIKE in followed.stderr
    saved = stacks_of(home, job_id, dump=2)
    assert "hang_in_collective (hang.py:4)" in saved["w1.txt"] and "wait_for_peers (hang.py:7)" in saved["w0.txt"]


@pytest.mark.parametrize("variable", ["PODRUN_STALL_AUTO_FLOOR", "PODRUN_RELAY_FANOUT"])
def test_a_setting_podrun_cannot_use_is_one_line_before_anything_ships(home, job_file, monkeypatch, variable):
    monkeypatch.setenv(variable, "soon")
    spec = job_file("target: {local: {workers: 2}}\nprogress: 'step (\\\\d+)'\nstall: auto\nrun: echo step 1\n",
                    files={"train.py": "print(1)\n"})
    result = podrun("exec", spec)
    assert result.returncode == 2, result.stderr
    lines = stderr_lines_without_traceback(result.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"podrun: error: {variable}='soon': expected"), lines
    assert not (home / "jobs").exists() or not any((home / "jobs").iterdir())  # no job was started
