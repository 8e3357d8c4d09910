"""`podrun exec` on local CPU workers: real processes, asserted on what a user sees."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, Background, job_id_in, podrun, processes_of_job, run_cli, stderr_lines_without_traceback


def test_every_worker_gets_the_environment_contract(home, job_file):
    spec = job_file("""
        target: {local: {workers: 3}}
        run: env | grep -E '^(PJRT_DEVICE|PODRUN_(JOB_ID|WORKER|NUM_WORKERS|WORKER_IPS)|MASTER_(ADDR|PORT)|QUOTED)='
        env: {QUOTED: "it's $HOME `x` \\"q\\" ü"}
        torchrun: null
    """)
    result = podrun("exec", "--no-collapse", spec)  # each worker's lines apart, those they share too
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)
    for index in range(3):
        lines = {line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith(f"[w{index}] ")}
        assert lines == {
            "PJRT_DEVICE=CPU", f"PODRUN_JOB_ID={job_id}", f"PODRUN_WORKER={index}", "PODRUN_NUM_WORKERS=3",
            "PODRUN_WORKER_IPS=127.0.0.1,127.0.0.1,127.0.0.1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500",
            "QUOTED=it's $HOME `x` \"q\" ü",
        }


def test_workers_are_separate_process_groups_with_their_own_code_copy(home, job_file):
    spec = job_file("""
        run: |
          test -f from-worker-0 && echo "sees worker 0's file"
          touch from-worker-$PODRUN_WORKER
          echo "pgid $(ps -o pgid= $$ | tr -d ' ') dir $PWD"
          cat data.txt
        """, files={"data.txt": "shipped data\n"})
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert "sees worker 0's file" not in result.stdout
    lines = result.stdout.splitlines()
    assert lines.count("[w0-1] shipped data") == 1
    info = [line.split() for line in lines if " pgid " in line]
    assert len(info) == 2
    (w0, _, pgid0, _, dir0), (w1, _, pgid1, _, dir1) = sorted(info)
    assert pgid0 != pgid1
    assert dir0 != dir1 and dir0.startswith(str(home)) and dir1.startswith(str(home))


def test_a_failing_worker_stops_the_others_and_sets_the_exit_code(home, job_file):
    spec = job_file("""
        run: |
          echo "started $PODRUN_WORKER"
          if [ "$PODRUN_WORKER" = 1 ]; then echo "about to fail"; exit 3; fi
          sleep 300
    """)
    started = time.monotonic()
    result = podrun("exec", spec)
    elapsed = time.monotonic() - started
    assert result.returncode == 3
    assert elapsed < 5, f"fail-fast took {elapsed:.1f}s"
    assert "worker 1 (local/w1) exited with code 3 in run" in result.stderr
    assert "  about to fail" in result.stderr  # its last lines
    job_id = job_id_in(result.stderr)
    assert processes_of_job(job_id) == []
    record = json.loads((home / "jobs" / job_id / "job.json").read_text())
    assert record["state"] == "failed" and record["exit_code"] == 3
    assert [w["exit_code"] for w in record["workers"]] == [143, 3]  # worker 0 was stopped by SIGTERM


def test_a_worker_killed_by_a_signal_is_named_with_the_signal(home, job_file):
    spec = job_file("""
        run: if [ "$PODRUN_WORKER" = 0 ]; then kill -9 $$; fi; sleep 300
    """)
    result = podrun("exec", spec)
    assert result.returncode == 137
    assert "worker 0 (local/w0) was killed by SIGKILL (exit code 137) in run" in result.stderr
    assert processes_of_job(job_id_in(result.stderr)) == []


def test_a_worker_whose_agent_is_killed_by_a_signal_exits_128_plus_the_signal_as_the_table_says(home, job_file):
    spec = job_file('run: echo "agent $PPID"; exec sleep 300\n')
    job = Background("exec", spec)
    line = job.wait_for(r"^\[w1\] agent \d+$")
    os.kill(int(line.split()[-1]), signal.SIGKILL)
    assert job.finish() == 137  # 128 + 9 (docs/exit-codes.md), not 247 (-9 as a byte)
    job_id = job_id_in(job.text)
    assert "worker 1 (local/w1) failed to run: its agent was killed by SIGKILL (exit code 137)" in job.text, job.text
    record = json.loads((home / "jobs" / job_id / "job.json").read_text())
    assert (record["exit_code"], record["workers"][1]["exit_code"]) == (137, 137)
    assert "w1=137" in podrun("jobs").stdout
    for left in processes_of_job(job_id):  # worker 1's own step: its agent is what would have stopped it
        os.kill(int(left.split()[0]), signal.SIGKILL)


def test_ctrl_c_stops_every_worker_and_exits_130(home, job_file):
    spec = job_file("""
        run: |
          trap 'echo "worker $PODRUN_WORKER got TERM"; exit 1' TERM
          echo "worker $PODRUN_WORKER up"
          sleep 300 & wait
    """)
    podrun_process = Background("exec", spec)
    podrun_process.wait_for(r"^\[w0\] worker 0 up")
    podrun_process.wait_for(r"^\[w1\] worker 1 up")
    podrun_process.process.send_signal(signal.SIGINT)
    assert podrun_process.finish() == 130
    job_id = job_id_in(podrun_process.text)
    assert processes_of_job(job_id) == []
    assert "[w0] worker 0 got TERM" in podrun_process.lines
    log = (home / "jobs" / job_id / "w1.log").read_text()
    assert log == "worker 1 up\nworker 1 got TERM\n"  # complete up to the stop
    assert json.loads((home / "jobs" / job_id / "job.json").read_text())["state"] == "stopped"


def test_a_reader_that_goes_away_stops_the_job_like_ctrl_c_and_logs_keep_the_output(home, job_file):
    spec = job_file("""
        run: |
          seq 1 20000
          while true; do echo "worker $PODRUN_WORKER ticks"; sleep 0.05; done
    """)
    exec_process = subprocess.Popen([sys.executable, "-m", "podrun", "exec", str(spec)], cwd=REPO,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert exec_process.stdout.readline().endswith(" 1\n")
    exec_process.stdout.close()  # as `podrun exec job.yaml | head -1` does
    assert exec_process.wait(timeout=30) == 141  # 128 + SIGPIPE, as a shell reports for `yes | head`
    stderr = exec_process.stderr.read()
    assert ("podrun: stdout was closed: stopping the job on every worker (its logs keep all output)"
            in stderr_lines_without_traceback(stderr))
    job_id = job_id_in(stderr)
    assert processes_of_job(job_id) == []
    assert json.loads((home / "jobs" / job_id / "job.json").read_text())["state"] == "stopped"

    logs_process = subprocess.Popen([sys.executable, "-m", "podrun", "logs", job_id], cwd=REPO,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert logs_process.stdout.readline() in ("[w0] 1\n", "[w1] 1\n")
    logs_process.stdout.close()  # 20,000 lines per worker: more than a pipe holds
    assert logs_process.wait(timeout=30) == 141
    assert stderr_lines_without_traceback(logs_process.stderr.read()) == []


def test_processes_a_worker_leaves_behind_are_cleaned_up_after_success(home, job_file):
    spec = job_file("""
        run: |
          sleep 300 &
          setsid sleep 301 < /dev/null > /dev/null 2>&1 &
          # exit only once the second sleep has really left our session (and with it our group)
          while [ "$(ps -o sid= -p $!)" = "$(ps -o sid= -p $$)" ]; do sleep 0.01; done
          echo "left two sleeps behind"
    """)
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("[w0-1] left two sleeps behind") == 1
    assert processes_of_job(job_id_in(result.stderr)) == []


def test_a_failing_setup_means_run_starts_nowhere(home, job_file):
    spec = job_file("""
        setup: if [ "$PODRUN_WORKER" = 0 ]; then echo "no such package"; exit 4; fi
        run: echo "run started on $PODRUN_WORKER"
    """)
    result = podrun("exec", spec)
    assert result.returncode == 4
    assert "worker 0 (local/w0) exited with code 4 in setup" in result.stderr
    assert "run started" not in result.stdout


def test_dry_run_prints_the_plan_and_starts_nothing(home, job_file):
    spec = job_file("""
        env: {WANDB_API_KEY: hunter2, PLAIN: visible}
        secret_env: [PLAIN_SECRET]
        run: train.py --lr 0.1
        torchrun: {nproc_per_node: 4, port: 29411}
    """, files={"train.py": ""})
    result = podrun("exec", spec, "--dry-run", env={"PLAIN_SECRET": "s3cret", "PATH": "/usr/bin:/bin",
                                                     "PODRUN_HOME": str(home)})
    assert result.returncode == 0, result.stderr
    assert "hunter2" not in result.stdout and "s3cret" not in result.stdout
    assert "export WANDB_API_KEY='<secret>'" in result.stdout
    assert "export PLAIN_SECRET='<secret>'" in result.stdout
    assert "export PLAIN=visible" in result.stdout
    for index in (0, 1):
        assert (f"torchrun --nnodes=2 --node_rank={index} --nproc_per_node=4 "
                f'--rdzv_endpoint=127.0.0.1:29411 "$PODRUN_JOB_DIR/rank_output.py" train.py --lr 0.1') in result.stdout
        assert f"export PODRUN_WORKER={index}" in result.stdout
    assert not home.exists()  # no job record, no worker directories


def test_dry_run_writes_no_digest_cache_where_exec_writes_one(home, job_file, monkeypatch):
    from podrun.shipping import digests, scan

    monkeypatch.setattr(digests, "RACY_S", -3600)  # every file counts as old enough to remember
    spec = job_file("run: echo", files={"train.py": "print(1)\n"})
    assert run_cli("exec", str(spec), "--dry-run")[0] == 0
    assert not home.exists()
    scan.scan(spec.parent / "code")  # what exec does
    assert list((home / "cache" / "digests").iterdir())


def test_numbers_in_env_reach_the_worker_as_written(home, job_file):
    spec = job_file("""
        run: echo "$PY $HEX $UNDERSCORED $EXPONENT $PLAIN $QUOTED"
        env: {PY: 3.10, HEX: 0x1F, UNDERSCORED: 1_000, EXPONENT: 1e3, PLAIN: 7, QUOTED: "3.10"}
        target: {local: {workers: 1}}
    """)
    dry = podrun("exec", spec, "--dry-run")
    assert "export PY=3.10\nexport HEX=0x1F\nexport UNDERSCORED=1_000\nexport EXPONENT=1e3\n" in dry.stdout
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[w0] 3.10 0x1F 1_000 1e3 7 3.10\n"


def test_dry_run_says_which_environment_each_worker_starts_from(home, job_file):
    spec = job_file("run: echo")
    result = podrun("exec", spec, "--dry-run", env={"PATH": "/usr/bin:/bin", "PODRUN_HOME": str(home)})
    assert result.stdout.startswith("# target: 2 local workers\n# steps: run, once the code is in ~/podrun/job/")
    assert "\n\n# worker 0: " in result.stdout
    for index in (0, 1):
        assert (f"# worker {index}: local/w{index} (internal IP 127.0.0.1)\n"
                f"# environment: podrun's own environment, inherited: PATH=/usr/bin:/bin and ") in result.stdout


def test_unchanged_code_is_not_shipped_again_and_ignored_files_never_ship(home, job_file):
    files = {"keep.py": "", ".gitignore": "*.ckpt\nlogs/\n", ".podrunignore": "data/\n",
             "model.ckpt": "", "logs/run.txt": "", "data/big.bin": "", "sub/.gitignore": "local.txt\n",
             "sub/local.txt": "", "sub/kept.txt": "", ".git/HEAD": ""}
    spec = job_file("run: find . -type f | sort", files=files)
    first = podrun("exec", spec, "--worker", "0")
    assert first.returncode == 0, first.stderr
    shipped = [line.removeprefix("[w0] ./") for line in first.stdout.splitlines()]
    assert shipped == [".gitignore", ".podrunignore", "keep.py", "sub/.gitignore", "sub/kept.txt"]
    assert "shipped code (5 files) to 1 worker" in first.stderr
    again = podrun("exec", spec, "--worker", "0")
    assert "code unchanged on every worker" in again.stderr


def test_worker_selection_and_env_overrides(home, job_file):
    spec = job_file("run: echo \"$PODRUN_WORKER of $PODRUN_NUM_WORKERS says $GREETING\"\ntarget: {local: {workers: 4}}")
    result = podrun("exec", spec, "--worker", "1,3", "--env", "GREETING=hi there")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[w1] 1 of 4 says hi there", "[w3] 3 of 4 says hi there"]


def test_output_lines_keep_their_prefix_and_bytes_reach_the_log_unchanged(home, job_file):
    spec = job_file("""
        run: printf 'progress 1\\rprogress 2\\rdone\\nno newline at the end \\377'
        target: {local: {workers: 1}}
    """)
    result = podrun("exec", spec, text=False)
    assert result.returncode == 0
    assert result.stdout == b"[w0] done\n[w0] no newline at the end \xff\n"  # a redrawn line: its final text
    job_id = job_id_in(result.stderr.decode())
    assert (home / "jobs" / job_id / "w0.log").read_bytes() == b"progress 1\rprogress 2\rdone\nno newline at the end \xff"



def test_the_failure_summary_names_the_exception_that_ended_the_worker(home, job_file):
    script = ("import os, sys\n"
              "if os.environ['PODRUN_WORKER'] == '1':\n"
              "    raise ConnectionError('rendezvous at 127.0.0.1:29500 timed out')\n")
    spec = job_file(f"run: {sys.executable} fail.py && sleep 300", files={"fail.py": script})
    result = podrun("exec", spec)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].endswith(
        "failed: worker 1 exited with code 1 in run (ConnectionError: rendezvous at 127.0.0.1:29500 timed out);"
        " every other worker was stopped")


@pytest.mark.slow
def test_a_large_workdir_is_refused_in_one_line_naming_what_weighs_most(home, job_file):
    spec = job_file("run: echo ran", files={"train.py": "", ".venv/lib/x.so": "", "wheels/a.whl": ""})
    for name, size in ((".venv/lib/x.so", 900 << 20), ("wheels/a.whl", 300 << 20)):
        os.truncate(spec.parent / "code" / name, size)  # sparse: no disk used
    result = podrun("exec", spec)
    assert result.returncode == 2
    (line,) = stderr_lines_without_traceback(result.stderr)
    assert line.startswith(f"podrun: error: {spec}: workdir: {spec.parent / 'code'}: 1.2 GB in 3 files would ship")
    assert "the heaviest: .venv/ 900.0 MB in 1 file, wheels/ 300.0 MB in 1 file, train.py 0 bytes" in line
    assert line.endswith("or pass --allow-large-workdir")
    assert result.stdout == "" and not home.exists()
    allowed = podrun("exec", spec, "--allow-large-workdir", "--worker", "0")
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout == "[w0] ran\n"
