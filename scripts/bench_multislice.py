#!/usr/bin/env python3
"""`podrun exec` on a multislice TPU (the API stand-in, lab hosts as its workers) against the same
hosts as one `hosts` target: what the slices cost.

    sudo python scripts/bench_multislice.py --shapes 2x8 4x16 [--rounds 5]

For each SxW: a lab of S*W hosts, the Cloud TPU API stand-in, and `podrun create v4-<8W> --slices S`
on it (S slices of W workers, one queued resource). A first run of each spec adds the key to every
slice's metadata, trusts the host keys and ships the (empty) code. Then, interleaved, median of the
rounds: `podrun exec` of `true` on the multislice (it reads every slice from the API, connects,
checks the TPU devices, runs with the slice and MEGASCALE variables) and on a `hosts` target of the
same hosts in the same order.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import Lab, print_table, require_lab_tools, stand_in_env, timed, write_lab_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tpu_stand_in import TpuStandIn  # noqa: E402

PODRUN = [sys.executable, "-m", "podrun"]


def shape(text: str) -> tuple[int, int]:
    slices, _, workers = text.partition("x")
    return int(slices), int(workers)


def measure(slices: int, workers: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as workdir, Lab(slices * workers, Path(workdir) / "lab") as lab:
        work = Path(workdir)
        stand_in = TpuStandIn.on_lab(lab, operation_delay_s=0.0)
        env = stand_in_env(work, stand_in.serve())
        (work / "code").mkdir()
        subprocess.run([*PODRUN, "create", f"v4-{8 * workers}", "--slices", str(slices), "--name", "ms"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
        multislice = work / "multislice.yaml"
        multislice.write_text(f"target: {{tpu: {{name: ms, slices: {slices}}}}}\n"
                              f"ssh: {{user: root, identity_file: {lab.client_key}}}\nworkdir: code\nrun: 'true'\n")
        with stand_in.lock:  # the hosts in the multislice's worker order: slice by slice
            order = [endpoint.host_index for index in range(slices)
                     for endpoint in stand_in.node_endpoints[f"projects/bench/locations/us-central2-b/nodes/ms-{index}"]]
        hosts = write_lab_spec(work / "hosts.yaml", lab, "code", "true", hosts=[lab.hosts[i] for i in order])
        commands = {"multislice": [*PODRUN, "exec", str(multislice)], "hosts": [*PODRUN, "exec", str(hosts)]}
        for command in commands.values():  # keys, host keys, code
            subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(rounds):
            for name, command in commands.items():
                samples[name].append(timed(command, env))
        stand_in.shutdown()
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=shape, nargs="+", default=[(2, 8), (4, 16)], help="SLICESxWORKERS")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if problem := require_lab_tools():
        sys.exit(problem)
    rows = {f"{s} x {w}": measure(s, w, args.rounds) for s, w in args.shapes}
    print_table(f"`podrun exec` of `true`, median of {args.rounds} interleaved rounds (s)", ["measure", *rows], {
        "multislice (tpu target, slices)": [f"{r['multislice']:.2f}" for r in rows.values()],
        "the same hosts as one hosts target": [f"{r['hosts']:.2f}" for r in rows.values()],
        "multislice / hosts": [f"{r['multislice'] / r['hosts']:.2f}x" for r in rows.values()]})


if __name__ == "__main__":
    main()
