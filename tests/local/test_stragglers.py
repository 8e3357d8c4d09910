"""`stragglers` (launch/stragglers.py): a worker that computes twice as long per step as the others, who wait
for it in a real gloo all-reduce, is named from py-spy's stacks within a few samples, in one line, in the
record (`podrun jobs`) and in a notification. Real torch, real py-spy (this interpreter's, on the job's PATH)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import Background, job_id_in, podrun

# every worker computes a step in compute(), worker 1 twice as long, then all-reduce: the others wait for it
UNEVEN = """\
import datetime, os, time, torch, torch.distributed as dist
rank = int(os.environ["PODRUN_WORKER"])
dist.init_process_group("gloo", rank=rank, world_size=3, timeout=datetime.timedelta(seconds=60))

def compute(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

for step in range(1, 1000):
    compute(0.4 if rank == 1 else 0.2)
    done = torch.tensor([float(rank == 0 and os.path.exists(os.environ["DONE"]))])  # worker 0 says when, for all
    dist.all_reduce(done)
    print(f"step {step}", flush=True)
    if done.item():
        break
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_worker_computing_twice_as_long_is_named_as_the_straggler(home, job_file, tmp_path, webhook):
    stand_in, url = webhook()
    done = tmp_path / "done"
    spec = job_file(f"target: {{local: {{workers: 3}}}}\nrun: python3 train.py\nstragglers: 1s\n"
                    f"progress: 'step (\\d+)'\nnotify: {{url: '{url}', on: [straggler]}}\n"
                    f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin', DONE: '{done}'}}\n",
                    {"train.py": UNEVEN})
    running = Background("exec", spec)
    found = running.wait_for(r"podrun: w1 held the others back in \d+ of the last \d+ samples", timeout=90)
    done.touch()
    assert running.finish() == 0, running.text
    line = next(line for line in running.text.splitlines() if "held the others back" in line)
    assert "(in compute (train.py:7); the others in all_reduce (torch/distributed/" in line, line
    record = json.loads(podrun("jobs", "--json").stdout)[0]
    assert record["straggler"]["worker"] == 1 and record["straggler"]["samples"] <= 10, record["straggler"]
    assert "w1 straggling" in podrun("jobs").stdout
    report = json.loads(podrun("report", "--json", record["id"]).stdout)
    assert report["attempts"][-1]["straggler"]["worker"] == 1, report["attempts"]
    told = stand_in.wait_for(1)
    assert stand_in.events() == [("straggler", 0)] and "w1 held the others back" in told[0]["reason"], told
    assert job_id_in(running.text) == record["id"] and found


def test_a_job_without_python_stacks_says_once_that_no_straggler_can_be_named(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: sleep 3\nstragglers: 0.5s\n")
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("podrun: stragglers: ")]
    assert said == ["podrun: stragglers: no Python stacks from any worker in 3 samples (py-spy is not on the job's "
                    "PATH, or the job runs no Python): no straggler can be named"], result.stderr


@pytest.mark.slow
def test_sampling_begins_with_run_not_during_the_checks_before_it(home, job_file):
    """preflight's network check takes seconds (two torch imports) while run's agents wait: no sample is
    taken then, so a run shorter than three periods never says it found no Python stacks."""
    spec = job_file("target: {local: {workers: 2}}\nrun: sleep 0.5\nstragglers: 0.5s\npreflight: [network]\n"
                    f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}\n")
    result = podrun("exec", spec, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "podrun: preflight: 2 workers healthy in " in result.stderr
    assert "podrun: stragglers: " not in result.stderr, result.stderr
