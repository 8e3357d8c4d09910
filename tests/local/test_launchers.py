"""Other launchers' workloads from the example specs in configs/ (docs/launchers.md), run as a user runs them:
Hugging Face accelerate's own test script under podrun's torchrun, and what the obvious `accelerate launch`
command does instead."""

from __future__ import annotations

import re

import pytest

from helpers import REPO, job_id_in, podrun, processes_of_job


@pytest.mark.slow
def test_accelerates_own_test_script_runs_distributed_across_two_workers(home):
    result = podrun("exec", REPO / "configs" / "accelerate-cpu.yaml", "--no-collapse", timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    for prefix in ("[w0 r0]", "[w1 r1]"):
        assert f"{prefix} Distributed environment: DistributedType.MULTI_CPU  Backend: gloo" in result.stdout
        assert f"{prefix} Num processes: 2" in result.stdout
        assert f"\n{prefix} **Test reinstantiated state**\n" in result.stdout
    assert processes_of_job(job_id_in(result.stderr)) == []


@pytest.mark.slow
def test_accelerate_launch_cpu_alone_runs_one_process_per_worker_as_the_docs_warn(home, job_file):
    """`accelerate launch --cpu --num_machines N` starts the script as one process with no world: each worker
    is DistributedType.NO (the trap docs/launchers.md names, and why the spec uses torchrun)."""
    spec = job_file("target: {local: {workers: 2}}\n"
                    "run: >-\n  accelerate launch --cpu --num_machines $PODRUN_NUM_WORKERS --machine_rank $PODRUN_WORKER\n"
                    "  --main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT\n"
                    "  -m accelerate.test_utils.scripts.test_script\n")
    result = podrun("exec", spec, "--no-collapse", timeout=300)
    assert result.returncode == 0, result.stderr
    for prefix in ("[w0]", "[w1]"):
        assert f"{prefix} Distributed environment: DistributedType.NO" in result.stdout


@pytest.mark.slow
def test_deepspeed_trains_one_model_across_two_workers(home):
    pytest.importorskip("deepspeed", reason="the suite's packages (.ci/suite-packages-built-here.txt) hold deepspeed")
    result = podrun("exec", REPO / "configs" / "deepspeed-cpu.yaml", "--no-collapse", timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    ended = dict(re.findall(r"^\[w\d r(\d)\] rank \d world_size 2 weights (\S+)$", result.stdout, re.MULTILINE))
    assert sorted(ended) == ["0", "1"] and ended["0"] == ended["1"], result.stdout  # one model, data parallel
    assert re.search(r"^\[w1 r1\] step 3 loss ", result.stdout, re.MULTILINE), result.stdout
    assert processes_of_job(job_id_in(result.stderr)) == []
