"""Long jobs: a detached job fails fast with no launcher left, stops are graceful (SIGTERM once, then
the grace period), torchrun's failed rank decides the exit code, and a taken rendezvous port is
named before anything starts, on local targets too."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

from conftest import Background, job_id_in, podrun, processes_of_job, wait_until

# worker 1 fails after a second; the others run until they are stopped, saying so once per SIGTERM
ONE_FAILS = """\
run: |
  if [ "$PODRUN_WORKER" = 1 ]; then sleep 1; echo "worker 1 fails"; exit 3; fi
  trap 'echo "worker $PODRUN_WORKER got SIGTERM"; exit 143' TERM
  echo "worker $PODRUN_WORKER runs"; sleep 300 & wait
"""


def worker_exit(home, worker: int, job_id: str) -> dict | None:
    exit_file = home / "local" / f"w{worker}" / ".podrun" / "jobs" / job_id / "run.exit"
    return json.loads(exit_file.read_text()) if exit_file.exists() else None


def test_a_detached_job_fails_fast_on_its_workers_with_no_launcher_left(home, job_file):
    spec = job_file("target: {local: {workers: 3}}\n" + ONE_FAILS)
    launched = podrun("exec", "--detach", spec)  # the launcher is gone once this returns
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    took = wait_until(lambda: all(worker_exit(home, w, job_id) for w in range(3)), "every worker's exit", timeout=20)
    assert took < 10  # not the 300 s the other workers would run
    assert processes_of_job(job_id) == []
    exits = [worker_exit(home, w, job_id) for w in range(3)]
    assert [e["code"] for e in exits] == [143, 3, 143]
    assert [e["stop_reason"] for e in exits] == ["worker 1 failed with code 3", None, "worker 1 failed with code 3"]
    followed = podrun("logs", "-f", job_id)
    assert "[w0] worker 0 got SIGTERM" in followed.stdout
    assert followed.stdout.count("got SIGTERM") == 2  # once each: the job's processes got SIGTERM once


def test_a_detached_job_whose_first_worker_is_killed_stops_everywhere(home, job_file):
    """Worker 0's agent holds the watch: when it dies (kill -9), the other agents stop their steps."""
    spec = job_file("target: {local: {workers: 2}}\nrun: sleep 300\n")
    launched = podrun("exec", "--detach", spec)
    job_id = job_id_in(launched.stderr)
    agent_file = home / "local" / "w0" / ".podrun" / "jobs" / job_id / "run.agent"
    wait_until(agent_file.exists, "worker 0's agent pid file")
    os.kill(int(agent_file.read_text()), signal.SIGKILL)
    wait_until(lambda: worker_exit(home, 1, job_id), "worker 1 to stop", timeout=20)
    assert worker_exit(home, 1, job_id)["stop_reason"] == "worker 0 failed with code 255"


def test_ctrl_c_gives_each_process_sigterm_once_and_the_grace_period_to_save(home, job_file):
    spec = job_file("""\
        target: {local: {workers: 2}}
        run: python3 -u save.py
        """, files={"save.py": """\
import os, signal, sys, time
def save(signum, frame):
    print("got SIGTERM", flush=True)
    time.sleep(2)  # longer than the old fixed 5 s would allow for a real checkpoint, scaled down
    with open("checkpoint.tmp", "w") as f:
        f.write("complete")
    os.replace("checkpoint.tmp", "checkpoint")
    print("saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("training", flush=True)
while True:
    time.sleep(1)
"""})
    job = Background("exec", "--grace", "10", spec)
    job.wait_for(r"^\[w0\] training$")
    job.wait_for(r"^\[w1\] training$")
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130
    assert job.text.count("got SIGTERM") == 2
    assert job.text.count("saved") == 2
    job_id = job_id_in(job.text)
    assert processes_of_job(job_id) == []


def test_torchrun_exit_code_and_error_are_the_failed_ranks_and_lines_carry_the_rank(home, job_file):
    spec = job_file("""\
        target: {local: {workers: 2}}
        torchrun: {nproc_per_node: 2, port: 29531}
        run: fail.py
        """, files={"fail.py": """\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"hello from rank {rank}", flush=True)
if rank == 3:
    raise SystemExit("rank 3 gives up: no data in /data/shard-3")
time.sleep(60)
"""})
    result = podrun("exec", spec, timeout=120)
    assert result.returncode == 1  # SystemExit with a message exits 1 ... the rank's own code
    assert "worker 1 (local/w1) rank 3 exited with code 1 in run" in result.stderr
    assert "rank 3 gives up: no data in /data/shard-3" in result.stderr.split("job ")[-1]  # in the summary line
    for rank in range(4):
        assert sum(f"hello from rank {rank}" in line for line in result.stdout.splitlines()) == 1


def test_torchrun_passes_on_a_ranks_own_exit_code(home, job_file):
    spec = job_file("""\
        target: {local: {workers: 1}}
        torchrun: {nproc_per_node: 2, port: 29532}
        run: fail.py
        """, files={"fail.py": "import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(7)\ntime.sleep(60)\n"})
    result = podrun("exec", spec, timeout=120)
    assert result.returncode == 7, result.stderr
    assert "worker 0 rank 1 exited with code 7" in result.stderr


def test_a_taken_rendezvous_port_is_named_before_anything_starts_on_one_local_worker(home, job_file):
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        spec = job_file(f"""\
            target: {{local: {{workers: 1}}}}
            torchrun: {{nproc_per_node: 1, port: {port}}}
            setup: echo setup ran
            run: train.py
            """, files={"train.py": "print('ran')\n"})
        started = time.monotonic()
        result = podrun("exec", spec)
    assert result.returncode == 1
    assert f"rendezvous port {port} is not free on worker 0" in result.stderr
    assert "setup ran" not in result.stdout and "ran" not in result.stdout
    assert time.monotonic() - started < 10


def test_a_detached_job_on_ssh_hosts_fails_fast_and_says_so_after_its_launcher_is_gone(home, lab, hosts_spec):
    from test_fault_matrix import ps_on_every_host

    launched = podrun("exec", "--detach", hosts_spec(ONE_FAILS))
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    started = time.monotonic()
    followed = podrun("logs", "-f", job_id, timeout=60)
    assert time.monotonic() - started < 15  # fail-fast on the workers, not the 300 s of the others
    assert followed.returncode == 3, followed.stderr
    assert followed.stderr.strip().splitlines()[-1].startswith(
        f"podrun: job {job_id} failed: worker 1 exited with code 3")
    assert ps_on_every_host(lab, job_id) == []
    listed = json.loads(podrun("jobs", "--json").stdout)
    assert [(job["state"], job["exit_code"]) for job in listed if job["id"] == job_id] == [("failed", 3)]
