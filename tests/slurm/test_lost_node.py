"""A node lost in an attempt, on the Slurm lab's real cluster (3 compute nodes): it dies as a machine does,
every process of its namespace killed (slurmd and sshd too). With `spares`, the next attempt runs a spare
node of the same allocation in its rank; without, a new allocation of the same count without it
(`--exclude`). The lab is made again after each test: its node is gone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

from helpers import Background, job_id_in, podrun

pytestmark = [pytest.mark.lab, pytest.mark.slow]

WHERE = ('echo "attempt $PODRUN_ATTEMPT on $(hostname) job $SLURM_JOB_ID"\n'
         'if [ "$PODRUN_ATTEMPT" = 0 ]; then exec sleep 600; fi\n')
RAN = re.compile(r"^\[w(\d)\] +attempt (\d) on (\S+) job (\d+)$", re.M)


@pytest.fixture
def dying(slurm_lab, cluster):
    """dying(name): that compute node dies; the whole lab is made again after the test."""
    def kill(name: str) -> None:
        node = next(node for node in slurm_lab.nodes if node.name == name)
        pids = subprocess.run(["ip", "netns", "pids", node.namespace], capture_output=True, text=True).stdout.split()
        for pid in map(int, pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    yield kill
    slurm_lab.stop()
    slurm_lab.start()


def ran(text: str) -> dict[tuple[int, int], tuple[str, str]]:
    """(worker, attempt) -> (node, Slurm job id), as each worker said."""
    return {(int(worker), int(attempt)): (node, job) for worker, attempt, node, job in RAN.findall(text)}


def run_until_worker_1_dies(slurm_spec, dying, options: str) -> tuple[Background, str]:
    spec = slurm_spec(f"run: |\n  {WHERE.replace(chr(10), chr(10) + '  ')}\nrestarts: {{max: 1, on: [failure]}}\n",
                      options=options)
    job = Background("exec", spec, "--no-collapse")
    job.wait_for(r"\[w1\] +attempt 0 on")
    lost = ran(job.text)[(1, 0)][0]
    dying(lost)
    return job, lost


def test_a_spare_node_takes_the_lost_nodes_rank_in_the_same_allocation(home, cluster, slurm_spec, dying):
    job, lost = run_until_worker_1_dies(slurm_spec, dying, ", spares: 1")
    assert job.finish(timeout=180) == 0, job.text
    where = ran(job.text)
    spare = where[(1, 1)][0]
    assert spare not in (lost, where[(0, 0)][0])
    assert where[(0, 1)] == where[(0, 0)]  # worker 0 kept its node and rank
    assert len({job_id for _, job_id in where.values()}) == 1, where  # no new allocation
    assert (f"podrun: worker 1: {lost} left out for the rest of the job (lost in attempt 0); spare {spare} takes its "
            f"place") in job.text, job.text
    record = json.loads(podrun("jobs", "--json").stdout)[0]
    assert record["state"] == "succeeded", record
    report = podrun("report", job_id_in(job.text)).stdout
    assert f"attempt 1: worker 1 on spare {spare}, {lost} left out" in report, report


def test_without_spares_the_next_attempt_runs_on_a_new_allocation_without_the_lost_node(
        home, cluster, slurm_spec, dying):
    job, lost = run_until_worker_1_dies(slurm_spec, dying, "")
    assert job.finish(timeout=120) == 0, job.text
    assert "restart 1 of 1 in 1s: running again on a new allocation" in job.text, job.text
    where = ran(job.text)
    assert lost not in {where[(0, 1)][0], where[(1, 1)][0]}, where
    assert where[(0, 1)][1] == where[(1, 1)][1] != where[(0, 0)][1], where  # one new allocation
    assert (f"podrun: worker 1: {lost} left out for the rest of the job (lost in attempt 0); no spare is left: the "
            f"next attempt runs on a new allocation without it") in job.text, job.text
    assert f"ExcNodeList={lost} " in cluster.slurm(f"scontrol show job --oneliner {where[(0, 1)][1]}").stdout
