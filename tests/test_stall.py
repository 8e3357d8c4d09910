"""A hung job is caught (`stall`): the silence named, every worker's stacks saved, the job stopped or
restarted; `podrun stacks` of a running job; how long ago a running job's last line came."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import Background, job_id_in, podrun, processes_of_job, stderr_lines_without_traceback, wait_until

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


def stacks_of(home: Path, job_id: str, dump: int = 1) -> dict[str, str]:
    folder = home / "jobs" / job_id / "stacks" / str(dump)
    return {path.name: path.read_text() for path in sorted(folder.iterdir())}


def test_a_stall_is_named_its_stacks_saved_for_every_worker_and_the_job_stopped(home, job_file):
    spec = job_file("run: python3 hang.py\nstall: 3s\nstop_grace: 2s\ntarget: {local: {workers: 2}}\n",
                    {"hang.py": HANG})
    result = podrun("exec", spec)
    assert result.returncode == STALLED, result.stderr
    job_id = job_id_in(result.stderr)
    (stall_line,) = [line for line in stderr_lines_without_traceback(result.stderr) if "stalled:" in line
                     and "saving" in line]
    assert re.search(r"no output from any worker for 3\.\ds \(w0-1 silent 3\.\ds\)", stall_line), stall_line
    saved = stacks_of(home, job_id)
    assert sorted(saved) == ["w0.txt", "w1.txt"]
    assert "py-spy dump" in saved["w1.txt"] and "hang_in_collective (hang.py:4)" in saved["w1.txt"]
    assert "wait_for_peers (hang.py:7)" in saved["w0.txt"]
    assert not processes_of_job(job_id)
    (job,) = json.loads(podrun("jobs", "--json").stdout)
    assert (job["state"], job["exit_code"]) == ("stalled", STALLED)


def test_without_py_spy_the_stacks_say_what_the_kernel_shows(home, job_file):
    spec = job_file("run: python3 hang.py\nstall: 1s\nstop_grace: 1s\ntarget: {local: {workers: 1}}\n"
                    "env: {PATH: /usr/bin:/bin}\n", {"hang.py": HANG})
    result = podrun("exec", spec)
    assert result.returncode == STALLED, result.stderr
    (text,) = stacks_of(home, job_id_in(result.stderr)).values()
    assert "=== pid " in text and "python3 hang.py" in text
    assert "py-spy is not on the job's PATH" in text
    assert "wchan" in text and "hrtimer_nanosleep" in text
