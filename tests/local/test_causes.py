"""Why it failed (launch/causes.py): the first cause named apart from its cascade, in the line and in
`report --json`, and a configuration error that is not restarted. Real torch, real gloo."""

from __future__ import annotations

import json
import os
import re

import pytest

from helpers import job_id_in, podrun, wait_until, worker_exit

# worker 2 fails a real allocation at step 5 while workers 0 and 1 wait for it in an all-reduce
OOM_IN_A_COLLECTIVE = """\
import datetime, os, torch, torch.distributed as dist
rank = int(os.environ["PODRUN_WORKER"])
dist.init_process_group("gloo", rank=rank, world_size=3, timeout=datetime.timedelta(seconds=60))
for step in range(1, 6):
    print(f"step {step}", flush=True)
    if rank == 2 and step == 5:
        torch.empty(1 << 50, dtype=torch.uint8)  # a PiB: more than any address space holds
    dist.all_reduce(torch.ones(4))
"""


@pytest.mark.slow
def test_an_oom_on_one_worker_is_the_cause_and_the_others_its_cascade(home, job_file):
    spec = job_file("target: {local: {workers: 3}}\nrun: python3 train.py\nprogress: 'step (\\d+)'\n",
                    {"train.py": OOM_IN_A_COLLECTIVE})
    result = podrun("exec", spec, timeout=180)
    # the exception ends worker 2 with exit 1, unless gloo's thread is still joinable at the interpreter's
    # exit: then the C++ runtime aborts it (SIGABRT, 134). Either way the cause is the allocation.
    worker_end = {1: "exited with code 1", 134: "was killed by SIGABRT (exit code 134)"}
    assert result.returncode in worker_end, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("podrun: cause: ")]
    assert len(said) == 1, result.stderr
    assert said[0].startswith("podrun: cause: worker 2 failed first: out of memory (") and " at step 5" in said[0]
    assert "can't allocate memory" in said[0]
    assert "; workers 0-1 then failed in the collective" in said[0] or "; workers 0-1 were stopped" in said[0], said
    assert f"job {job_id_in(result.stderr)} failed: worker 2 {worker_end[result.returncode]} in run" in result.stderr
    cause = json.loads(podrun("report", "--json", job_id_in(result.stderr)).stdout)["attempts"][-1]["cause"]
    assert (cause["class"], cause["worker"], cause["rank"], cause["step"]) == ("oom", 2, None, 5), cause
    assert "can't allocate memory" in cause["text"]


def import_failing(job_file, workers: int, restarts: str):
    """`podrun exec` of a job whose every worker fails on an import (exit 1, checked)."""
    spec = job_file(f"target: {{local: {{workers: {workers}}}}}\nrun: python3 -c 'import podrun_no_such_module'\n"
                    f"restarts: {restarts}\n")
    result = podrun("exec", spec, env={**os.environ, "PODRUN_RESTART_BACKOFF": "0"})
    assert result.returncode == 1, result.stderr
    return result


def test_a_missing_module_is_a_configuration_error_that_is_not_restarted(home, job_file):
    result = import_failing(job_file, 2, "{max: 5, on: [failure]}")
    assert "restart 1 of 5" not in result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("podrun: no restart: ")]
    assert len(said) == 1 and re.fullmatch(  # both workers fail so: the first whose exit came is named
        r"podrun: no restart: worker [01] failed on a configuration error \(ModuleNotFoundError: No module named "
        r"'podrun_no_such_module'\), which fails the same way every time; `restarts.on: \[config\]` restarts it "
        r"anyway", said[0]), result.stderr
    record = json.loads(podrun("jobs", "--json").stdout)[0]
    assert (record["attempt"], record["cause"]["class"]) == (0, "config"), record


def test_restarts_on_config_restarts_it_anyway(home, job_file):
    result = import_failing(job_file, 1, "{max: 1, on: [config]}")
    assert "restart 1 of 1 in 0s: running again on the same workers" in result.stderr


def test_a_detached_jobs_cause_is_read_from_its_logs_and_shown_by_jobs_report_and_the_table(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: |\n  test \"$PODRUN_WORKER\" = 0 && exec sleep 300\n"
                    "  echo 'Traceback (most recent call last):'\n"
                    "  echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'\n  exit 1\n")
    launched = podrun("exec", "--detach", spec)  # its launcher is gone: the fetch of its logs classifies it
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    wait_until(lambda: all(worker_exit(home, w, job_id) for w in range(2)), "every worker's exit", timeout=30)
    record = next(job for job in json.loads(podrun("jobs", "--json").stdout) if job["id"] == job_id)
    assert record["cause"] == {"class": "oom", "worker": 1, "rank": None, "step": None,
                               "text": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}
    assert "failed (oom on worker 1)" in podrun("jobs").stdout
    assert re.search(r"^attempt 0: failed after \S+ \(oom on worker 1\): worker 1 exited with code 1$",
                     podrun("report", job_id).stdout, re.M)
