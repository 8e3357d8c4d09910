#!/usr/bin/env python3
"""Which SSH transport fans out fastest: `true` on N lab hosts over fresh connections, per library.

    sudo python scripts/bench_transports.py --hosts 4 16 64 [--rounds 3]

Candidates, all measured in the same run against the same lab hosts (tests/lab.py):
OpenSSH clients in parallel (default key exchange, and curve25519-sha256), paramiko with a thread per
host, and asyncssh. Prints a table of medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchlib import Lab, print_table, require_lab_tools


def openssh(lab: Lab, extra: list[str]) -> None:
    processes = [subprocess.Popen(lab.ssh_args(i)[:-1] + extra + [lab.ssh_args(i)[-1], "true"])
                 for i in range(len(lab.hosts))]
    assert all(p.wait() == 0 for p in processes)


def paramiko_threads(lab: Lab) -> None:
    import paramiko

    def one(host) -> None:
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        client.connect(host.ip, username="root", key_filename=str(lab.client_key), look_for_keys=False,
                       allow_agent=False)
        _, stdout, _ = client.exec_command("true")
        assert stdout.channel.recv_exit_status() == 0
        client.close()

    with ThreadPoolExecutor(len(lab.hosts)) as pool:
        list(pool.map(one, lab.hosts))


def asyncssh_tasks(lab: Lab) -> None:
    import asyncssh

    async def one(host) -> None:
        async with asyncssh.connect(host.ip, username="root", client_keys=[str(lab.client_key)],
                                    known_hosts=None, agent_path=None) as connection:
            assert (await connection.run("true")).exit_status == 0

    async def all_hosts() -> None:
        await asyncio.gather(*(one(host) for host in lab.hosts))

    asyncio.run(all_hosts())


CANDIDATES = {
    "OpenSSH, default kex": lambda lab: openssh(lab, []),
    "OpenSSH, curve25519": lambda lab: openssh(lab, ["-o", "KexAlgorithms=curve25519-sha256"]),
    "paramiko, thread per host": paramiko_threads,
    "asyncssh": asyncssh_tasks,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if problem := require_lab_tools():
        sys.exit(problem)
    results: dict[int, dict[str, float]] = {}
    for count in args.hosts:
        with tempfile.TemporaryDirectory() as workdir, Lab(count, Path(workdir)) as lab:
            samples: dict[str, list[float]] = {name: [] for name in CANDIDATES}
            for _ in range(args.rounds):
                for name, run in CANDIDATES.items():  # interleaved: load drift hits every candidate
                    started = time.perf_counter()
                    run(lab)
                    samples[name].append(time.perf_counter() - started)
            results[count] = {name: statistics.median(values) for name, values in samples.items()}
    print_table(f"`true` on N lab hosts, fresh connections, median of {args.rounds} rounds (seconds)",
                ["transport", *(f"N={n}" for n in args.hosts)],
                {name: [f"{results[n][name]:.2f}" for n in args.hosts] for name in CANDIDATES})


if __name__ == "__main__":
    main()
