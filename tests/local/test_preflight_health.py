"""`preflight` on local workers (launch/health.py): the check runs on every worker with the job's own
python3, real torch and a real gloo all-reduce, says what it found in one line, and a failing worker stops
the job before its run starts. Lab hosts that differ or are throttled: tests/ssh/test_preflight_hosts.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import podrun

# the job's PATH leads to this interpreter, which has torch
ON_THIS_PYTHON = f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}\n"


@pytest.mark.slow
def test_a_healthy_job_says_what_the_check_found_and_runs(home, job_file):
    spec = job_file("target: {local: {workers: 3}}\nrun: echo ran on $PODRUN_WORKER\npreflight: true\n"
                    + ON_THIS_PYTHON)
    result = podrun("exec", spec, timeout=180)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("podrun: preflight: ")]
    assert len(said) == 1, result.stderr
    python = ".".join(map(str, sys.version_info[:3]))
    assert said[0].startswith("podrun: preflight: 3 workers healthy in "), said
    assert f": Python {python}, torch " in said[0] and " free or more; all-reduce of 16 MiB in " in said[0], said
    assert result.stderr.index("podrun: preflight: ") < result.stderr.index("── run (3 local workers) ──")
    assert "ran on 2" in result.stdout


def test_a_worker_short_of_disk_stops_the_job_before_run_naming_every_worker(home, job_file, tmp_path):
    marker = tmp_path / "ran"
    spec = job_file(f"target: {{local: {{workers: 2}}}}\nrun: touch {marker}\n"
                    "preflight: {checks: [disk, versions], min_free_gb: 100000}\n")
    result = podrun("exec", spec)
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("podrun: error: preflight: worker 0 (local/w0) has "), line
    assert "free where the job runs, below preflight.min_free_gb (100000); worker 1 (local/w1) has " in line, line
    assert line.endswith("; nothing of the job ran"), line
    assert "── run" not in result.stderr and not marker.exists()
    record = json.loads(podrun("jobs", "--json").stdout)[0]
    assert record["state"] == "failed" and record["summary"].startswith("preflight: worker 0"), record
