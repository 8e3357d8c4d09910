#!/usr/bin/env python3
"""The daily verbs against what people type today, on lab hosts, in the same run:

    sudo python scripts/bench_verbs.py --hosts 4 16 [--mb 64] [--rounds 3]

- a command on every host: `podrun exec --hosts ... -- true` against `ssh HOST true` to every host
  at once (OpenSSH, the gcloud `--worker=all` loop's client);
- an upload: `podrun cp FILE :FILE` to every host (packed once, relayed between the hosts) against
  `scp FILE HOST:` to every host at once;
- a download: `podrun cp :FILE DEST` from every host against `scp HOST:FILE DEST/HOST` from every
  host at once.

The file is incompressible (random bytes). Median of the rounds, interleaved; the first podrun run
trusts the host keys.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import Lab, all_at_once, print_table, require_lab_tools, timed

PODRUN = [sys.executable, "-m", "podrun"]
SSH_OPTIONS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"


def measure(count: int, megabytes: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as workdir, Lab(count, Path(workdir) / "lab") as lab:
        work = Path(workdir)
        env = {**os.environ, "PODRUN_HOME": str(work / "home")}
        blob = work / "blob.bin"
        blob.write_bytes(os.urandom(megabytes << 20))
        hosts = ["--hosts", ",".join(h.ip for h in lab.hosts), "--user", "root", "--identity-file", str(lab.client_key)]
        key = f"-i {shlex.quote(str(lab.client_key))} {SSH_OPTIONS}"
        back = work / "back"
        commands = {
            "exec true": ([*PODRUN, "exec", *hosts, "--", "true"],
                          all_at_once([f"ssh {key} root@{h.ip} true" for h in lab.hosts])),
            f"upload {megabytes} MB": ([*PODRUN, "cp", *hosts, str(blob), ":blob.bin"],
                                       all_at_once([f"scp -q {key} {blob} root@{h.ip}:blob.bin" for h in lab.hosts])),
            f"download {megabytes} MB": (
                f"rm -rf {back} && {shlex.join([*PODRUN, 'cp', *hosts, ':blob.bin', str(back)])}",
                f"rm -rf {back} && mkdir -p " + " ".join(f"{back}/{h.ip}" for h in lab.hosts) + " && " +
                all_at_once([f"scp -q {key} root@{h.ip}:blob.bin {back}/{h.ip}/" for h in lab.hosts]))}
        subprocess.run([*PODRUN, "exec", *hosts, "--", "true"], env=env, check=True, stdout=subprocess.DEVNULL)
        samples: dict[str, list[float]] = {}
        for _ in range(rounds):
            for name, (podrun, raw) in commands.items():
                samples.setdefault(f"{name}: podrun", []).append(timed(podrun, env))
                samples.setdefault(f"{name}: ssh/scp", []).append(timed(raw, env))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--mb", type=int, default=64, help="the copied file's size")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if problem := require_lab_tools():
        sys.exit(problem)
    results = {f"{count} hosts": measure(count, args.mb, args.rounds) for count in args.hosts}
    rows: dict[str, list[str]] = {}
    for name in next(iter(results.values())):
        rows[name] = [f"{result[name]:.2f}" for result in results.values()]
        if name.endswith("ssh/scp"):
            verb = name.removesuffix(": ssh/scp")
            rows[f"{verb}: podrun / ssh"] = [f"{r[f'{verb}: podrun'] / r[name]:.2f}x" for r in results.values()]
    print_table(f"the daily verbs, median of {args.rounds} interleaved rounds (s)", ["measure", *results], rows)


if __name__ == "__main__":
    main()
