"""`preflight` on lab hosts (launch/health.py, docs/running-jobs.md): a host whose python3 lacks the
framework, or whose link is throttled with `tc`, is named before anything of the job runs, and with a
spare it is left out and the spare takes its rank. Run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path

import pytest

from helpers import job_id_in, podrun, worker_log_on_the_laptop

pytestmark = pytest.mark.lab

# /root/bin leads the job's PATH: a host given a python3 there runs it, the others this interpreter (torch's)
JOB_PATH = f"env: {{PATH: '/root/bin:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin'}}\n"
RUNS = "device: CPU\nrun: echo ran on $PODRUN_WORKER on $(hostname)\n" + JOB_PATH


@pytest.fixture
def without_torch(lab):
    """without_torch(index): the host's python3 on the job's PATH is the system's, which has no torch."""
    made = []

    def give(index: int) -> None:
        bin_dir = lab.hosts[index].home / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "python3").symlink_to("/usr/bin/python3")
        made.append(bin_dir)

    yield give
    for bin_dir in made:
        (bin_dir / "python3").unlink()


@pytest.fixture
def throttled(lab):
    """throttled(index, rate): everything the host sends is held to `rate` (tc's token bucket on its eth0)."""
    done = []

    def throttle(index: int, rate: str) -> None:
        lab.run(index, f"tc qdisc add dev eth0 root tbf rate {rate} burst 32kb latency 400ms").check_returncode()
        done.append(index)

    yield throttle
    for index in done:
        with contextlib.suppress(Exception):
            lab.run(index, "tc qdisc del dev eth0 root")


def test_a_host_whose_python_lacks_the_framework_is_named_before_the_job_runs(home, lab, hosts_spec, without_torch):
    without_torch(2)
    spec = hosts_spec(RUNS + "preflight: true\n")
    result = podrun("exec", spec, timeout=180)
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"podrun: error: preflight: worker 2 \({lab.hosts[2].ip}\) has Python \S+ \(the others \S+\) and no "
        r"[a-z, ]*torch[a-z, ]* \(which the others have\) in the job's python3; nothing of the job ran", line), line
    assert "ran on" not in result.stdout and "── run" not in result.stderr


def test_a_throttled_host_is_named_by_the_network_check(home, lab, hosts_spec, throttled):
    throttled(1, "40mbit")
    spec = hosts_spec(RUNS + "preflight: {checks: [network], network_mib: 2}\n")
    result = podrun("exec", spec, timeout=180)
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"podrun: error: preflight: worker 1 \({lab.hosts[1].ip}\) sent at [\d.]+ [KM]B/s "
                        r"on the network, far below the median link's [\d.]+ [MG]B/s; nothing of the job ran", line), line


def test_a_host_failing_the_preflight_is_left_out_for_a_spare(home, lab, hosts_spec, without_torch, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0")
    without_torch(1)
    spec = hosts_spec(RUNS + "preflight: [versions]\nrestarts: {max: 1, on: [failure]}\n")
    spec.write_text(spec.read_text().replace("]}\n", f"], spares: [{lab.hosts[3].ip}]}}\n", 1))
    result = podrun("exec", spec, timeout=180)
    assert result.returncode == 0, result.stderr
    said = result.stderr
    assert f"podrun: preflight: worker 1 ({lab.hosts[1].ip}) has Python " in said
    assert (f"podrun: worker 1: {lab.hosts[1].ip} left out for the rest of the job (failed the preflight in attempt "
            f"0); spare {lab.hosts[3].ip} takes its place") in said
    assert "podrun: preflight: 3 workers healthy in " in said
    assert f"ran on 1 on {lab.hosts[3].hostname}" in worker_log_on_the_laptop(job_id_in(said), 1)
