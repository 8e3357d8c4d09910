#!/usr/bin/env python3
"""Workers behind one bastion: `podrun exec` of `true` through `ssh.proxy_jump` against OpenSSH's own
`ssh -J bastion host true`, run in parallel to every worker, in the same run; and the connections the
bastion's sshd saw for each.

    sudo python scripts/bench_bastion.py [--workers 16 64] [--rounds 3]

One lab (tests/lab.py) of a bastion (host 0) and max(--workers) workers; the launcher's own packets to
the workers are dropped (nft), so the bastion is the only way there. podrun: code already shipped and
host keys trusted (a first run does both), each round a whole `podrun exec` process. OpenSSH: one
`ssh -J` per worker, all at once, with the same key and curve25519 (the jump's own ssh reads the same
`-F` file, so it gets the same settings; host keys unchecked). The connections are counted in the
bastion's namespace: each new TCP connection to its port 22 (address and port, a SYN sent again once).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Lab, print_table, require_lab_tools
from helpers import dropped_from_launcher, new_ssh_connections  # tests/, which benchlib put on the path

REPO = Path(__file__).resolve().parents[1]
OPENSSH_CONFIG = """\
Host *
  User root
  IdentityFile {key}
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
  KexAlgorithms curve25519-sha256
  ConnectTimeout 30
"""


def podrun_round(spec: Path, env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "podrun", "exec", str(spec)], env=env, capture_output=True, text=True)
    took_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"podrun exec failed: {done.stderr[-2000:]}")
    return took_s


def openssh_round(config: Path, bastion: str, workers: list[str]) -> tuple[float, int]:
    """Seconds for every `ssh -J` to end, and how many of them failed."""
    started = time.perf_counter()
    clients = [subprocess.Popen(["ssh", "-F", str(config), "-J", f"root@{bastion}", f"root@{worker}", "true"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for worker in workers]
    failed = sum(client.wait() != 0 for client in clients)
    return time.perf_counter() - started, failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if why := require_lab_tools():
        raise SystemExit(why)
    work = Path(tempfile.mkdtemp(prefix="bench-bastion-"))
    built = time.perf_counter()
    with Lab(max(args.workers) + 1, work / "lab") as lab:
        print(f"lab of {len(lab.hosts)} hosts built in {time.perf_counter() - built:.0f}s", file=sys.stderr)
        bastion = lab.hosts[0].ip
        config = work / "ssh_config"
        config.write_text(OPENSSH_CONFIG.format(key=lab.client_key))
        (work / "code").mkdir()
        rows: dict[str, list[str]] = {}
        with dropped_from_launcher([host.ip for host in lab.hosts[1:]]):
            for count in args.workers:
                workers = [host.ip for host in lab.hosts[1:count + 1]]
                spec = work / f"bastion-{count}.yaml"
                spec.write_text(f"target: {{hosts: [{', '.join(workers)}]}}\n"
                                f"ssh: {{user: root, identity_file: {lab.client_key}, proxy_jump: 'root@{bastion}'}}\n"
                                f"workdir: {work / 'code'}\nrun: 'true'\n")
                env = {**os.environ, "PODRUN_HOME": str(work / f"home-{count}"), "PYTHONPATH": str(REPO)}
                podrun_round(spec, env)  # ships the code and trusts the host keys
                podrun_s, openssh_s, podrun_seen, openssh_seen, failures = [], [], [], [], []
                for _ in range(args.rounds):
                    with new_ssh_connections(lab, 0) as seen:
                        podrun_s.append(podrun_round(spec, env))
                        podrun_seen.append(seen())
                    with new_ssh_connections(lab, 0) as seen:
                        took_s, failed = openssh_round(config, bastion, workers)
                        openssh_s.append(took_s)
                        openssh_seen.append(seen())
                        failures.append(failed)
                podrun_median, openssh_median = statistics.median(podrun_s), statistics.median(openssh_s)
                rows[str(count)] = [f"{podrun_median:.2f}", f"{openssh_median:.2f}",
                                    f"{podrun_median / openssh_median:.2f}x",
                                    f"{max(podrun_seen)}", f"{min(openssh_seen)}-{max(openssh_seen)}",
                                    f"{sum(failures)} of {count * args.rounds}"]
                print(f"  {count} workers: podrun {podrun_s}, ssh -J {openssh_s}", file=sys.stderr, flush=True)
    print_table(f"`podrun exec` of `true` through proxy_jump against parallel `ssh -J bastion host true`, "
                f"the launcher's packets to the workers dropped; median of {args.rounds} rounds, seconds",
                ["workers", "podrun", "ssh -J", "ratio", "bastion connections (podrun)",
                 "bastion connections (ssh -J)", "ssh -J failed"], rows)


if __name__ == "__main__":
    main()
