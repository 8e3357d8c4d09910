"""The README's main command: configs/cpu-smoke.yaml, real torchrun, 2 workers x 2 ranks, gloo DDP."""

from __future__ import annotations

import json
import re
import signal

import pytest

from helpers import REPO, Background, job_id_in, podrun, processes_of_job, wait_until

RANK_LINE = re.compile(r"^\[w(\d) r\d+\] rank (\d) world_size (\d) local_rank (\d) worker (\d) host \S+ checksum (\S+)$")


@pytest.mark.slow
def test_cpu_smoke_config_trains_ddp_across_two_local_workers(home):
    result = podrun("exec", "configs/cpu-smoke.yaml", timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    ranks = [RANK_LINE.match(line).groups() for line in result.stdout.splitlines() if RANK_LINE.match(line)]
    assert sorted(int(rank) for _, rank, *_ in ranks) == [0, 1, 2, 3], result.stdout
    for prefix_worker, rank, world_size, local_rank, env_worker, _ in ranks:
        assert world_size == "4"
        assert prefix_worker == env_worker == str(int(rank) // 2)  # ranks 0 and 1 live on worker 0
        assert local_rank == str(int(rank) % 2)
    assert len({checksum for *_, checksum in ranks}) == 1  # DDP kept every rank's parameters identical
    job_id = job_id_in(result.stderr)
    record = json.loads((home / "jobs" / job_id / "job.json").read_text())
    assert record["state"] == "succeeded" and [w["exit_code"] for w in record["workers"]] == [0, 0]
    for worker in (0, 1):
        log = (home / "jobs" / job_id / f"w{worker}.log").read_text()
        assert f"rank {2 * worker} world_size 4" in log and f"rank {2 * worker + 1} world_size 4" in log
    assert processes_of_job(job_id) == []


@pytest.mark.slow
def test_ctrl_c_of_the_smoke_job_is_a_stop_without_torchruns_tracebacks(home, tmp_path):
    """Ctrl-C (SIGINT to podrun, as a terminal sends it) while the 4 ranks train: torchrun's SignalException
    traceback, ~30 lines per worker, stays in the logs; the terminal says where; the row reads stopped."""
    long_run = (REPO / "configs" / "cpu-smoke.yaml").read_text().replace("--steps 5", "--steps 100000000")
    spec = tmp_path / "cpu-smoke.yaml"
    spec.write_text(long_run.replace("workdir: ../examples/ddp", f"workdir: {REPO / 'examples' / 'ddp'}"))
    job = Background("exec", spec)
    job_id = job_id_in(job.wait_for(r"^podrun: job "))
    wait_until(lambda: sum("train.py" in process for process in processes_of_job(job_id)) >= 4, "4 ranks", timeout=60)
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130, job.text
    assert "Traceback" not in job.text and "SignalException" not in job.text, job.text
    assert "(torchrun's traceback of the stop left out here; `podrun logs` has it)" in job.text
    assert job.text.splitlines()[-1] == f"podrun: job {job_id} stopped on every worker"
    row = next(line for line in podrun("jobs").stdout.splitlines() if line.startswith(job_id))
    assert " stopped " in row and "2 stopped" in row, row
    assert "SignalException" in podrun("logs", job_id, "--worker", "0").stdout  # every byte kept
    assert processes_of_job(job_id) == []
