"""A torchrun rank as the user sees it, behind podrun's rank_output.py (issue 49, part 4): a rank killed
by SIGKILL (as the OOM killer kills) dies of signal 9 for torchrun and podrun, which says so, and
restarts on `exit_codes: [137]`; a rank's blank lines show, as a worker's own do; torch's own mark on a rank's
traceback (`[rank0]: Traceback`) shows once, with one space, the traceback's indentation kept."""

from __future__ import annotations

import sys

import pytest

from helpers import job_id_in, podrun, processes_of_job

# rank 1 of the first attempt kills itself with SIGKILL; rank 0 waits to be stopped
KILLED_BY_SIGKILL = """\
import os, signal, time
rank, attempt = int(os.environ["RANK"]), os.environ["PODRUN_ATTEMPT"]
print(f"rank {rank} up in attempt {attempt}", flush=True)
if attempt == "0":
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
print(f"rank {rank} done in attempt {attempt}", flush=True)
"""
BLANK_LINES = 'print("a")\nprint("")\nprint("b")\n'
# init_process_group puts torch's excepthook in place: it writes the traceback as `[rank0]: ` + each line
TRACEBACK = """\
import torch.distributed as dist
dist.init_process_group("gloo")
print(" one space of its own", flush=True)
def load():
    raise ValueError("no data in /data/shard-0")
load()
"""


def torchrun_job(job_file, port: int, script: str, ranks: int = 2, extra: str = ""):
    return job_file(f"target: {{local: {{workers: 1}}}}\ntorchrun: {{nproc_per_node: {ranks}, port: {port}}}\n"
                    f"run: train.py\n{extra}", files={"train.py": script})


def rank_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("[w0 r")]


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_is_a_death_by_signal_9(home, job_file):
    result = podrun("exec", torchrun_job(job_file, 29541, KILLED_BY_SIGKILL), timeout=120)
    assert result.returncode == 137, result.stderr
    assert "podrun: worker 0 (local/w0) rank 1 exited with code 137 in run" in result.stderr
    # the cause is the signal, not the rank's last line before it
    assert "failed: worker 0 rank 1 exited with code 137 in run (killed by SIGKILL)" in result.stderr.splitlines()[-1]
    assert "[w0 r1] killed by SIGKILL" in result.stdout.splitlines()
    # torchrun saw the rank die of signal 9, not rank_output.py's own traceback and exit 1
    assert "exitcode  : -9 (pid:" in result.stdout, result.stdout
    assert "OSError" not in result.stdout and "rank_output.py\", line" not in result.stdout
    assert processes_of_job(job_id_in(result.stderr)) == []


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_restarts_on_exit_code_137(home, job_file):
    spec = torchrun_job(job_file, 29542, KILLED_BY_SIGKILL, extra="restarts: {max: 1, on: [failure], exit_codes: [137]}\n")
    result = podrun("exec", spec, "--no-collapse", timeout=120)
    assert result.returncode == 0, result.stderr
    assert ("running again on the same workers (worker 0 rank 1 exited with code 137 in run (killed by SIGKILL))"
            in result.stderr)
    assert "succeeded after 1 restart" in result.stderr.splitlines()[-1]
    assert "[w0 r1] rank 1 done in attempt 1" in result.stdout.splitlines()


@pytest.mark.slow
def test_a_ranks_blank_lines_show_as_without_torchrun_and_in_logs(home, job_file):
    plain = podrun("exec", job_file(f"target: {{local: {{workers: 1}}}}\nrun: {sys.executable} train.py\n",
                                    files={"train.py": BLANK_LINES}, name="plain"))
    assert plain.stdout.splitlines() == ["[w0] a", "[w0] ", "[w0] b"], plain.stdout
    result = podrun("exec", torchrun_job(job_file, 29543, BLANK_LINES, ranks=1), timeout=120)
    assert result.returncode == 0, result.stderr
    assert rank_lines(result.stdout) == ["[w0 r0] a", "[w0 r0] ", "[w0 r0] b"], result.stdout
    logs = podrun("logs", job_id_in(result.stderr))
    assert rank_lines(logs.stdout) == ["[w0 r0] a", "[w0 r0] ", "[w0 r0] b"], logs.stdout


@pytest.mark.slow
def test_torchs_own_rank_mark_on_a_traceback_shows_once_with_one_space(home, job_file):
    result = podrun("exec", torchrun_job(job_file, 29544, TRACEBACK, ranks=1), timeout=120)
    assert result.returncode == 1, result.stderr
    job_id = job_id_in(result.stderr)
    for shown in (result.stdout, podrun("logs", job_id).stdout):
        lines = rank_lines(shown)
        assert lines[0] == "[w0 r0]  one space of its own", shown  # the job's own leading space stays
        assert lines[1:] == [
            "[w0 r0] Traceback (most recent call last):",
            f'[w0 r0]   File "{home}/local/w0/podrun/job/run/train.py", line 6, in <module>',
            "[w0 r0]     load()",
            f'[w0 r0]   File "{home}/local/w0/podrun/job/run/train.py", line 5, in load',
            '[w0 r0]     raise ValueError("no data in /data/shard-0")',
            "[w0 r0] ValueError: no data in /data/shard-0"], shown
    assert "(ValueError: no data in /data/shard-0)" in result.stderr.splitlines()[-1]
    assert "[rank0]:Traceback (most recent call last):\n" in (home / "jobs" / job_id / "w0.log").read_text()
