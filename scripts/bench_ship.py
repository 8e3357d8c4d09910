#!/usr/bin/env python3
"""Shipping a workdir (1,000 files, 50 MB) to N lab hosts: podrun against rsync and tar over ssh.

    sudo python scripts/bench_ship.py --hosts 16 [--rounds 3]

Measured in the same run, on the same hosts (tests/lab.py), each round cold for every contender:
  - podrun exec of `run: true` after one file changed (a new content hash: the tree ships whole)
  - plain parallel `rsync -a` into a fresh directory per host
  - plain parallel `tar c | ssh host tar x` into a fresh directory per host
and an unchanged re-run of podrun (ships nothing). Prints medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchlib import Lab, print_table, require_lab_tools, timed, write_lab_spec

SSH_OPTIONS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"


def make_workdir(root: Path) -> None:
    """999 source-like files of 20 KB and one 30 MB binary: 50 MB, incompressible."""
    for index in range(999):
        path = root / f"pkg{index % 20}" / f"module{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(20_000))
    (root / "weights.bin").write_bytes(os.urandom(30_000_000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if problem := require_lab_tools():
        sys.exit(problem)
    with tempfile.TemporaryDirectory() as workdir, Lab(args.hosts, Path(workdir)) as lab:
        code = Path(workdir) / "code"
        make_workdir(code)
        spec = write_lab_spec(Path(workdir) / "ship.yaml", lab, "code", "true")
        env = {**os.environ, "PODRUN_HOME": str(Path(workdir) / "podrun-home")}
        podrun = [sys.executable, "-m", "podrun", "exec", str(spec)]
        ssh = f"ssh -i {lab.client_key} {SSH_OPTIONS}"
        samples = {"podrun exec (tree changed)": [], "rsync -a": [], "tar c | ssh tar x": [],
                   "podrun exec (unchanged)": []}
        for round_ in range(args.rounds):
            (code / "changed.txt").write_text(str(round_))
            samples["podrun exec (tree changed)"].append(timed(podrun, env))
            samples["podrun exec (unchanged)"].append(timed(podrun, env))
            rsync = " & ".join(f"rsync -a -e '{ssh}' {code}/ root@{h.ip}:rsync{round_}/" for h in lab.hosts)
            samples["rsync -a"].append(timed(f"{rsync} & wait"))
            tar = " & ".join(f"tar -C {code} -cf - . | {ssh} root@{h.ip} 'mkdir -p tar{round_} && tar -C tar{round_} -xf -'"
                             for h in lab.hosts)
            samples["tar c | ssh tar x"].append(timed(f"{tar} & wait"))
        medians = {name: statistics.median(values) for name, values in samples.items()}
    raw = min(medians["rsync -a"], medians["tar c | ssh tar x"])
    print_table(f"shipping 1,000 files / 50 MB to {args.hosts} lab hosts, median of {args.rounds} rounds",
                ["contender", "seconds", "ratio to the faster of rsync and tar"],
                {name: [f"{seconds:.2f}", f"{seconds / raw:.2f}x"] for name, seconds in medians.items()})


if __name__ == "__main__":
    main()
