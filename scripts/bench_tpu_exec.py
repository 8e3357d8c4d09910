#!/usr/bin/env python3
"""`podrun exec` on a TPU VM (the API stand-in, lab hosts as its workers) against gcloud and plain ssh.

    sudo python scripts/bench_tpu_exec.py --hosts 4 16 64 [--rounds 5]

For each N: a lab of N hosts, the Cloud TPU API stand-in (tests/tpu_stand_in.py) on 127.0.0.1, and
`podrun create v4-<8N>` on it. A first run of each launcher adds its key to the node's metadata,
trusts the host keys and (podrun) ships the (empty) code. Then, interleaved, median of the rounds:
the time from starting the command to the first line of worker output, and to its end, for
  - podrun exec of `echo hello` (it reads the node from the API, connects, checks the TPU devices,
    checks the code, runs),
  - the real `gcloud compute tpus tpu-vm ssh root@NODE --worker=all --command="echo hello"` (it
    reads the node, its host keys and the compute project from the API, then runs one OpenSSH
    client per worker), and
  - plain parallel OpenSSH `ssh <external IP> echo hello`, one client per worker.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Lab, all_at_once, print_table, require_lab_tools, stand_in_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tpu_stand_in import TpuStandIn  # noqa: E402


def first_line_and_end(command: list[str] | str, env: dict | None) -> tuple[float, float]:
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                               shell=isinstance(command, str))
    line = process.stdout.readline()
    first = time.perf_counter() - started
    process.stdout.read()
    if process.wait() != 0 or not line:
        raise SystemExit(f"{command!r} failed")
    return first, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if problem := require_lab_tools():
        sys.exit(problem)
    rows = {}
    for count in args.hosts:
        with tempfile.TemporaryDirectory() as workdir, Lab(count, Path(workdir) / "lab") as lab:
            work = Path(workdir)
            stand_in = TpuStandIn.on_lab(lab, operation_delay_s=0.0)
            url = stand_in.serve()
            (work / "code").mkdir()
            (work / "job.yaml").write_text("target: {tpu: {name: bench}}\n"
                                           f"ssh: {{user: root, identity_file: {lab.client_key}}}\n"
                                           "workdir: code\nrun: echo hello\n")
            env = stand_in_env(work, url)
            podrun = [sys.executable, "-m", "podrun"]
            subprocess.run([*podrun, "create", f"v4-{8 * count}", "--name", "bench"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            gcloud = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "root@bench", "--worker=all", "--quiet",
                      "--command=echo hello"]
            ssh = all_at_once([" ".join(lab.ssh_args(i)[:-1] + [f"root@{h.external_ip}", "echo", "hello"])
                               for i, h in enumerate(lab.hosts)])
            commands = {"podrun exec": ([*podrun, "exec", str(work / "job.yaml")], env),
                        "gcloud --worker=all": (gcloud, env), "parallel ssh": (ssh, None)}
            for name in ("podrun exec", "gcloud --worker=all"):  # keys, host keys, code
                subprocess.run(commands[name][0], env=env, check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            samples = {name: [] for name in commands}
            for _ in range(args.rounds):
                for name, (command, command_env) in commands.items():
                    samples[name].append(first_line_and_end(command, command_env))
            stand_in.shutdown()
            rows[count] = {name: (statistics.median(s[0] for s in values), statistics.median(s[1] for s in values))
                           for name, values in samples.items()}
    table = {}
    for name in rows[args.hosts[0]]:
        table[f"{name}: first line"] = [f"{rows[n][name][0]:.2f}" for n in rows]
        table[f"{name}: end"] = [f"{rows[n][name][1]:.2f}" for n in rows]
    for peer in ("gcloud --worker=all", "parallel ssh"):
        for column, label in ((0, "first line"), (1, "end")):
            table[f"podrun / {peer}, {label}"] = [f"{rows[n]['podrun exec'][column] / rows[n][peer][column]:.2f}x"
                                                  for n in rows]
    print_table(f"`echo hello` on a TPU VM of N workers, median of {args.rounds} interleaved rounds (s)",
                ["measure", *(f"N={n}" for n in rows)], table)


if __name__ == "__main__":
    main()
