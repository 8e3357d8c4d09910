"""JAX jobs: podrun gives JAX what jax.distributed.initialize needs off a TPU VM, and the example
runs one JAX runtime over two local CPU processes."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from helpers import REPO, podrun


@pytest.mark.slow
def test_the_jax_example_adds_up_across_two_local_processes(home):
    result = podrun("exec", REPO / "configs" / "jax-cpu.yaml", "--env", f"PATH={Path(sys.executable).parent}:/usr/bin:/bin",
                    timeout=300)
    assert result.returncode == 0, result.stderr
    for index in range(2):  # one CPU device per process; process 0 adds 1, process 1 adds 2
        assert re.search(rf"^\[w{index}\] +process {index} of 2, 2 devices: psum 3$", result.stdout, re.MULTILINE), \
            result.stdout


def test_jax_finds_its_coordinator_on_worker_0_of_a_hosts_target_unless_the_spec_says(home, job_file):
    spec = job_file("target: {hosts: [10.1.0.7, 10.1.0.8]}\nrun: python3 train.py\n", {"train.py": ""})
    plan = podrun("exec", spec, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.count("export JAX_COORDINATOR_ADDRESS=10.1.0.7:8476\n") == 2
    mine = podrun("exec", spec, "--dry-run", "--env", "JAX_COORDINATOR_ADDRESS=10.1.0.8:1234")
    assert mine.stdout.count("export JAX_COORDINATOR_ADDRESS=10.1.0.8:1234\n") == 2


@pytest.mark.slow
def test_the_jax_example_adds_up_across_two_lab_hosts(home, lab, hosts_spec):
    # JAX's CPU collectives (gloo) take their address from the host name and read no variable: on hosts
    # whose names resolve to loopback they cannot connect (the README's JAX section says so)
    spec = hosts_spec(f"workdir: {REPO / 'examples' / 'jax'}\nrun: python3 psum.py\ndevice: CPU", hosts=(0, 1))
    with lab.names_resolving_to_addresses([0, 1]):
        result = podrun("exec", spec, timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    for index in range(2):
        assert re.search(rf"^\[w{index}\] +process {index} of 2, 2 devices: psum 3$", result.stdout, re.MULTILINE), \
            result.stdout
