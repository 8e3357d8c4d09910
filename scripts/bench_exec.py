#!/usr/bin/env python3
"""`podrun exec` of `run: "true"` (code already shipped) on N lab hosts, against raw fan-out.

    sudo python scripts/bench_exec.py --hosts 4 16 64 [--rounds 5] [--against REV]

All measured as whole processes, in the same run, on the same hosts (tests/lab.py), interleaved:
  - podrun exec (PODRUN_HOME with the hosts' keys already trusted, code already shipped)
  - the same with podrun as it was at git revision REV (default: PREVIOUS_RELEASE), unpacked beside
    this tree and run by the same interpreter: podrun must not grow slower from release to release
  - plain parallel OpenSSH `ssh host true` (default key exchange, and curve25519-sha256)
  - a bare script of a few lines running `true` over asyncssh, the library podrun uses
Prints medians of the wall time, of the launcher side's own CPU time and of the whole machine's CPU
time (on the lab every host's sshd and processes share this machine's cores), and podrun's ratio to
the fastest raw fan-out as issue 4 defines it (plain `ssh host true`, bare asyncssh script) and to
the fastest of all (curve25519 included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchlib import (
    Lab,
    all_at_once,
    podrun_at,
    print_table,
    require_lab_tools,
    timed,
    timed_with_cpu,
    write_lab_spec,
)

BARE_ASYNCSSH = """
import asyncio, sys, asyncssh
async def one(ip):
    async with asyncssh.connect(ip, username="root", client_keys=[sys.argv[1]], known_hosts=None) as c:
        assert (await c.run("true")).exit_status == 0
async def main():
    await asyncio.gather(*(one(ip) for ip in sys.argv[2:]))
asyncio.run(main())
"""

REPO = Path(__file__).resolve().parents[1]
# the tree before issues 20-25 (stall, preemption judgment, the interface doctor, ...): the release
# the exec path is measured against until the next one
PREVIOUS_RELEASE = "2c8c477"


def openssh_fan_out(lab: Lab, extra: list[str]) -> list[str]:
    return ["sh", "-c", all_at_once([" ".join(lab.ssh_args(i)[:-1] + extra + [lab.ssh_args(i)[-1], "true"])
                                     for i in range(len(lab.hosts))])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", metavar="REV", default=PREVIOUS_RELEASE,
                        help=f"the git revision whose podrun is measured beside this one (default: {PREVIOUS_RELEASE})")
    args = parser.parse_args()
    if problem := require_lab_tools():
        sys.exit(problem)
    rows = {}
    for count in args.hosts:
        with tempfile.TemporaryDirectory() as workdir, Lab(count, Path(workdir)) as lab:
            work = Path(workdir)
            (work / "code").mkdir()
            previous = f"podrun exec at {args.against}"
            podruns = {"podrun exec": ([sys.executable, "-P", "-m", "podrun"], REPO),
                       previous: ([sys.executable, "-P", "-m", "podrun"], podrun_at(args.against, work / "previous"))}
            commands = {}
            for name, (podrun, tree) in podruns.items():
                # each its own home and job name: neither finds the other's code cache or job files
                spec = write_lab_spec(work / f"{len(commands)}.yaml", lab, "code", "true")
                env = {**os.environ, "PODRUN_HOME": str(work / f"home-{len(commands)}"), "PYTHONPATH": str(tree)}
                timed([*podrun, "exec", str(spec)], env)  # trust the host keys, ship the (empty) code
                commands[name] = ([*podrun, "exec", str(spec)], env)
            commands.update({
                "ssh, default kex": (openssh_fan_out(lab, []), None),
                "ssh, curve25519": (openssh_fan_out(lab, ["-o", "KexAlgorithms=curve25519-sha256"]), None),
                "bare asyncssh script": ([sys.executable, "-c", BARE_ASYNCSSH, str(lab.client_key),
                                          *(h.ip for h in lab.hosts)], None),
            })
            samples = {name: [] for name in commands}
            for _ in range(args.rounds):
                for name, (command, command_env) in commands.items():
                    samples[name].append(timed_with_cpu(command, command_env))
            rows[count] = {name: [statistics.median(sample[field] for sample in values) for field in range(3)]
                           for name, values in samples.items()}
    names = list(next(iter(rows.values())))
    table = {}
    for field, measure in enumerate(("wall", "launcher CPU", "machine CPU")):
        table.update({f"{name}, {measure}": [f"{rows[n][name][field]:.2f}" for n in rows] for name in names})

    def ratio(n: int, field: int, peers: list[str]) -> str:
        return f"{rows[n]['podrun exec'][field] / min(rows[n][peer][field] for peer in peers):.2f}x"

    plain = ["ssh, default kex", "bare asyncssh script"]
    table["podrun / fastest of plain ssh and bare asyncssh, wall"] = [ratio(n, 0, plain) for n in rows]
    table["podrun / fastest of all, wall"] = [ratio(n, 0, names[2:]) for n in rows]
    table[f"podrun / podrun at {args.against}, wall"] = [ratio(n, 0, [names[1]]) for n in rows]
    table[f"podrun / podrun at {args.against}, machine CPU"] = [ratio(n, 2, [names[1]]) for n in rows]
    table["podrun / bare asyncssh, launcher CPU"] = [ratio(n, 1, ["bare asyncssh script"]) for n in rows]
    print_table(f"`true` on N hosts as a whole process, median of {args.rounds} interleaved rounds (s)",
                ["measure", *(f"N={n}" for n in rows)], table)


if __name__ == "__main__":
    main()
