#!/usr/bin/env python3
"""Shipping a workdir (999 source files and a 30 MB binary) to N lab hosts: podrun's relay tree
against rsync and tar over ssh, with the bytes the launcher sends.

    sudo python scripts/bench_ship.py --hosts 16 64 [--rounds 2] [--fanout 2 4 8] [--uplink-mbit 1000]

Measured in the same run, on the same hosts (tests/lab.py), each round cold for every contender:
  - podrun exec of `run: true` after one file changed (a new content hash: the tree ships whole),
    once per relay fan-out (PODRUN_RELAY_FANOUT)
  - plain parallel `rsync -a` into a fresh directory per host
  - plain parallel `tar c | ssh host tar x` into a fresh directory per host
  - podrun again with nothing changed (ships nothing)
Bytes sent: what this machine sent into the lab's bridge during the command (SSH framing and all),
against the workdir as one `tar cz` (gzip -6); CPU: what the whole machine, every host included,
spent. Prints medians and ratios.

Unshaped, the lab's "network" is memory copies on the same cores that run every host, so all
contenders compete for CPU alone. --uplink-mbit caps what this machine sends into the lab (tc tbf on
the bridge) while the hosts still talk to each other at full speed, as a launcher behind a slower
uplink than its workers' network sees it.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import Lab, all_at_once, busy_cpu_seconds, print_table, require_lab_tools, timed, write_lab_spec

SSH_OPTIONS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"


def make_workdir(root: Path) -> None:
    """999 files of real Python source (this interpreter's standard library, ~16 KB each) and one
    30 MB incompressible binary: 46 MB, as in issue 7."""
    sources = itertools.cycle(sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "**", "*.py"),
                                               recursive=True)))
    for index in range(999):
        text = b""
        while len(text) < 16_000:
            text += Path(next(sources)).read_bytes()
        path = root / f"pkg{index % 20}" / f"module{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text[:16_000])
    (root / "weights.bin").write_bytes(os.urandom(30_000_000))


def sent_bytes() -> int:
    from lab import BRIDGE

    return int(Path(f"/sys/class/net/{BRIDGE}/statistics/tx_bytes").read_text())


def measured(command, env=None) -> tuple[float, int, float]:
    """Seconds, bytes sent into the lab, and CPU seconds used by the whole machine."""
    before, cpu_before = sent_bytes(), busy_cpu_seconds()
    seconds = timed(command, env)
    return seconds, sent_bytes() - before, busy_cpu_seconds() - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fanout", type=int, nargs="+", default=[4])
    parser.add_argument("--uplink-mbit", type=int, help="cap this machine's traffic into the lab")
    args = parser.parse_args()
    if problem := require_lab_tools() or (not shutil.which("rsync") and "needs rsync (apt-get install rsync)"):
        sys.exit(problem)
    with tempfile.TemporaryDirectory() as workdir, Lab(max(args.hosts), Path(workdir)) as lab:
        if args.uplink_mbit:
            from lab import BRIDGE

            subprocess.run(["tc", "qdisc", "add", "dev", BRIDGE, "root", "tbf", "rate", f"{args.uplink_mbit}mbit",
                            "burst", "1mb", "latency", "100ms"], check=True)
        code = Path(workdir) / "code"
        make_workdir(code)
        compressed = len(subprocess.run(["tar", "-C", str(code), "-czf", "-", "."], capture_output=True,
                                        check=True).stdout)
        print(f"workdir: 1,000 files, {sum(f.stat().st_size for f in code.rglob('*')) / 1e6:.1f} MB; "
              f"as one tar.gz: {compressed / 1e6:.1f} MB")
        ssh = f"ssh -i {lab.client_key} {SSH_OPTIONS}"
        for count in args.hosts:
            hosts = lab.hosts[:count]
            spec = write_lab_spec(Path(workdir) / f"ship{count}.yaml", lab, "code", "true", hosts=hosts)
            base_env = {**os.environ, "PODRUN_HOME": str(Path(workdir) / "podrun-home")}
            podrun = [sys.executable, "-m", "podrun", "exec", str(spec)]
            samples: dict[str, list[tuple[float, int, float]]] = {}
            for round_ in range(args.rounds):
                for fanout in args.fanout:
                    (code / "changed.txt").write_text(f"{round_} {fanout}")
                    env = {**base_env, "PODRUN_RELAY_FANOUT": str(fanout)}
                    samples.setdefault(f"podrun exec, relay fan-out {fanout}", []).append(measured(podrun, env))
                samples.setdefault("podrun exec (unchanged)", []).append(measured(podrun, base_env))
                target = f"fresh{count}-{round_}"
                rsync = [f"rsync -a -e '{ssh}' {code}/ root@{h.ip}:{target}/" for h in hosts]
                samples.setdefault("rsync -a", []).append(measured(all_at_once(rsync)))
                tar = [f"tar -C {code} -cf - . | {ssh} root@{h.ip} 'mkdir -p {target} && tar -C {target} -xf -'"
                       for h in hosts]
                samples.setdefault("tar c | ssh tar x", []).append(measured(all_at_once(tar)))
                for host in hosts:
                    lab.run(host.index, f"rm -rf {target}")
            seconds, sent, cpu = ({name: statistics.median(sample[field] for sample in values)
                                   for name, values in samples.items()} for field in range(3))
            raw = min(seconds["rsync -a"], seconds["tar c | ssh tar x"])
            uplink = f", uplink {args.uplink_mbit} Mbit/s" if args.uplink_mbit else ""
            print_table(f"\nshipping to {count} lab hosts{uplink}, median of {args.rounds} rounds",
                        ["contender", "seconds", "ratio to the faster of rsync and tar", "MB sent",
                         "sent / tar.gz", "CPU s (all hosts)"],
                        {name: [f"{seconds[name]:.2f}", f"{seconds[name] / raw:.2f}x", f"{sent[name] / 1e6:.1f}",
                                f"{sent[name] / compressed:.2f}x", f"{cpu[name]:.1f}"] for name in samples})


if __name__ == "__main__":
    main()
