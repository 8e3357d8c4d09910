#!/usr/bin/env python3
"""A TPU's lifecycle under podrun (the API stand-in, lab hosts as its workers): recovery from a
preemption, and what waiting in the queue costs.

    sudo python scripts/bench_lifecycle.py --hosts 4 16 [--lags 1 20] [--rounds 3] [--queue-seconds 60]
                                           [--watch-seconds 180]

For each N: a lab of N hosts and the Cloud TPU API stand-in (tests/tpu_stand_in.py), whose
operations take 1 s (a node is READY 1 s after its create request, gone 1 s after its delete).
  - recovery: `podrun exec` of a spec declaring a spot v4-<8N> with `restarts: {max: 1}`; once
    `run` printed on every worker, the stand-in preempts the node (its hosts lose every process,
    sshd included, at once; the API shows it LAG seconds later, as Google does, for each --lags).
    Measured: from the preemption to `run` started again on every worker (podrun waits for the API
    to show it, deletes the node, creates it, waits for READY, connects, ships the code to the new
    disks, runs). Beside it, in the same run: the floor: the lag, the API's own delete + create
    (2 s), and `podrun exec` of the same job on a READY TPU whose workers already have the code
    (connecting and running).
  - the queue (once): `podrun create v4-8 --queued` while the stand-in withholds capacity: API
    requests per minute and podrun's CPU over --queue-seconds, then Ctrl-C (the request deleted).
  - the watch (once): an attached `podrun exec` of `sleep` on a v4-8 with the GCE metadata stand-in
    (tests/metadata_stand_in.py) on the lab's bridge: over --watch-seconds of run, the API requests
    (the node read every PODRUN_TPU_WATCH_INTERVAL, 45 s), the launcher's CPU and the worker agent's
    CPU (which long-polls the metadata server), each per hour.
"""

from __future__ import annotations

import argparse
import math
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import Lab, print_table, require_lab_tools, stand_in_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from metadata_stand_in import MetadataStandIn  # noqa: E402

from lab import BRIDGE_IP  # noqa: E402
from tpu_stand_in import TpuStandIn  # noqa: E402

OPERATION_S = 1.0
PODRUN = [sys.executable, "-m", "podrun"]
# attempt 0 waits to be preempted; attempt 1 says so and ends
RUN = 'echo "attempt $PODRUN_ATTEMPT"; if [ "$PODRUN_ATTEMPT" = 0 ]; then exec sleep 600; fi'


class Job:
    """`podrun exec` in the background, with when each worker first printed each attempt."""

    def __init__(self, spec: Path, env: dict, workers: int):
        self.workers = workers
        self.started = time.monotonic()
        self.process = subprocess.Popen([*PODRUN, "exec", "--no-collapse", str(spec)], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=env)
        self.seen: dict[str, dict[int, float]] = {}
        self.changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if found := re.match(r"\[w(\d+)\] +attempt (\d+)", line):
                with self.changed:
                    self.seen.setdefault(found[2], {}).setdefault(int(found[1]), time.monotonic())
                    self.changed.notify_all()

    def everywhere(self, attempt: str, timeout: float = 300) -> float:
        """When the last worker printed `attempt`."""
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.seen.get(attempt, {})) == self.workers, timeout):
                self.process.kill()
                raise SystemExit(f"attempt {attempt} did not start on every worker: {self.process.stderr.read()}")
            return max(self.seen[attempt].values())

    def finish(self) -> None:
        if self.process.wait(timeout=300) != 0:
            raise SystemExit(f"podrun exec failed: {self.process.stderr.read()}")


def recovery(count: int, rounds: int, lag: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as workdir, Lab(count, Path(workdir) / "lab") as lab:
        work = Path(workdir)
        stand_in = TpuStandIn.on_lab(lab, operation_delay_s=OPERATION_S)
        stand_in.preemption_lag_s = lag
        env = stand_in_env(work, stand_in.serve())
        (work / "code").mkdir()
        (work / "code" / "train.py").write_text("print('training')\n")
        spec = work / "job.yaml"
        spec.write_text(f"target: {{tpu: {{name: bench, accelerator_type: v4-{8 * count}, spot: true}}}}\n"
                        f"ssh: {{user: root, identity_file: {lab.client_key}}}\n"
                        f"workdir: code\nrun: '{RUN}'\nrestarts: {{max: 1}}\n")
        recovered, on_ready = [], []
        for _ in range(rounds):
            job = Job(spec, env, count)  # the first round creates the TPU
            job.everywhere("0")
            preempted = time.monotonic()
            stand_in.preempt("bench")
            recovered.append(job.everywhere("1") - preempted)
            job.finish()
            job = Job(spec, env, count)  # the node is READY, its workers have the code: attempt 0 only
            on_ready.append(job.everywhere("0") - job.started)
            job.process.send_signal(signal.SIGINT)
            job.process.wait(timeout=120)
        stand_in.shutdown()
    return {"recovered": statistics.median(recovered), "on_ready": statistics.median(on_ready)}


def waiting_in_queue(seconds: float) -> tuple[float, float]:
    """API requests per minute and CPU percent of `podrun create --queued` while no capacity comes."""
    with tempfile.TemporaryDirectory() as workdir, Lab(1, Path(workdir) / "lab") as lab:
        stand_in = TpuStandIn.on_lab(lab, operation_delay_s=OPERATION_S)
        env = stand_in_env(Path(workdir), stand_in.serve())
        stand_in.withhold_capacity(math.inf)
        creating = subprocess.Popen([*PODRUN, "create", "v4-8", "--name", "queued", "--queued"], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        requests_before, cpu_before = len(stand_in.requests), _cpu_seconds(creating.pid)
        time.sleep(seconds)  # the measuring window itself
        requests, cpu = len(stand_in.requests) - requests_before, _cpu_seconds(creating.pid) - cpu_before
        creating.send_signal(signal.SIGINT)
        if creating.wait(timeout=120) != 130:
            raise SystemExit("podrun create --queued did not stop on Ctrl-C")
        stand_in.shutdown()
    return requests * 60 / seconds, 100 * cpu / seconds


def watching(seconds: float) -> dict[str, float]:
    """Per hour of an attached run on a v4-8: API requests, the launcher's and the agent's CPU seconds."""
    with tempfile.TemporaryDirectory() as workdir, Lab(1, Path(workdir) / "lab") as lab:
        work = Path(workdir)
        stand_in = TpuStandIn.on_lab(lab, operation_delay_s=OPERATION_S)
        env = stand_in_env(work, stand_in.serve())
        metadata = MetadataStandIn()
        spec = work / "job.yaml"
        spec.write_text(f"target: {{tpu: {{name: watch, accelerator_type: v4-8}}}}\n"
                        f"ssh: {{user: root, identity_file: {lab.client_key}}}\n"
                        f"env: {{GCE_METADATA_HOST: '{metadata.serve(BRIDGE_IP)}'}}\n"
                        f"run: 'echo \"attempt $PODRUN_ATTEMPT\"; exec sleep 3600'\ndelete_after: always\n")
        job = Job(spec, env, 1)
        job.everywhere("0")
        while metadata.waiting < 2:  # the agent long-polls both values
            time.sleep(0.05)
        agent = _agent_pid(lab)
        requests_before, cpu_before = len(stand_in.requests), _cpu_seconds(job.process.pid)
        agent_before = _cpu_seconds(agent)
        time.sleep(seconds)  # the measuring window itself
        per_hour = 3600 / seconds
        measured = {"requests": (len(stand_in.requests) - requests_before) * per_hour,
                    "launcher": (_cpu_seconds(job.process.pid) - cpu_before) * per_hour,
                    "agent": (_cpu_seconds(agent) - agent_before) * per_hour}
        job.process.send_signal(signal.SIGINT)
        job.process.wait(timeout=120)
        metadata.shutdown()
        stand_in.shutdown()
    return measured


def _agent_pid(lab: Lab) -> int:
    """The run's agent on the lab's host 0: the parent of its `sleep 3600`."""
    found = lab.run(0, "pgrep -x -f 'sleep 3600'").stdout.split()
    return int(Path(f"/proc/{found[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime, stime in clock ticks (USER_HZ)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queue-seconds", type=float, default=60)
    parser.add_argument("--lags", type=float, nargs="+", default=[1, 20],
                        help="seconds from a preemption to the API showing it")
    parser.add_argument("--watch-seconds", type=float, default=180)
    args = parser.parse_args()
    if problem := require_lab_tools():
        sys.exit(problem)
    for lag in args.lags:
        rows = {count: recovery(count, args.rounds, lag) for count in args.hosts}
        floor = lag + 2 * OPERATION_S
        print_table(f"A preemption the API shows {lag:g} s late, recovered (operations take {OPERATION_S:g} s), "
                    f"median of {args.rounds} rounds (s)", ["measure", *(f"N={n}" for n in rows)], {
                        "preemption -> run started again on every worker": [f"{r['recovered']:.2f}"
                                                                             for r in rows.values()],
                        "floor: the API's lag + delete + create": [f"{floor:.2f}"] * len(rows),
                        "floor: podrun exec on the READY TPU -> run started": [f"{r['on_ready']:.2f}"
                                                                               for r in rows.values()],
                        "recovery / (lag + API + exec floor)": [f"{r['recovered'] / (floor + r['on_ready']):.2f}x"
                                                                for r in rows.values()]})
        print()
    watch = watching(args.watch_seconds)
    print_table(f"The watch while an attached run goes on (v4-8), over {args.watch_seconds:g} s, per hour",
                ["measure", "value"], {"API requests": [f"{watch['requests']:.0f}"],
                                       "launcher CPU": [f"{watch['launcher']:.2f} s"],
                                       "agent CPU (metadata long-poll)": [f"{watch['agent']:.2f} s"]})
    per_minute, cpu_percent = waiting_in_queue(args.queue_seconds)
    print()
    print_table(f"`podrun create --queued` waiting for capacity, over {args.queue_seconds:g} s", ["measure", "value"], {
        "API requests per minute": [f"{per_minute:.1f}"], "podrun CPU": [f"{cpu_percent:.2f}%"]})


if __name__ == "__main__":
    main()
