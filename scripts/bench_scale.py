#!/usr/bin/env python3
"""podrun at pod scale on the lab: launcher CPU and memory per worker from 16 to 256 hosts, and
output from 64 workers streaming 20,000 lines each without loss.

    sudo python scripts/bench_scale.py [--hosts 16 64 256] [--rounds 3] [--stream-hosts 64] [--lines 20000]

1. `podrun exec` of `run: true` (code already shipped) on N hosts: wall time, the launcher's CPU
   time (user + system, from wait4) and peak memory (max RSS), each also per worker.
2. Every one of --stream-hosts workers prints --lines numbered lines as fast as it can: every
   line must be in that worker's log, in order, and in podrun's live output, in order, under its
   own prefix. Timed against plain parallel ssh running the same command into the same pipe.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Lab, all_at_once, print_table, require_lab_tools, timed, write_lab_spec

PRINTER = ("import sys\nw = sys.argv[1]\nout = sys.stdout\n"
           "for i in range(int(sys.argv[2])):\n    out.write('w%s line %06d of the stream\\n' % (w, i))\n")


def run_measured(command: list[str], env: dict) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and max RSS in bytes of one process."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{command!r} failed")
    return time.perf_counter() - started, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def launcher_costs(lab: Lab, counts: list[int], rounds: int, workdir: Path, env: dict) -> None:
    rows = {}
    for count in counts:
        spec = write_lab_spec(workdir / f"true{count}.yaml", lab, "code", "true", hosts=lab.hosts[:count])
        command = [sys.executable, "-m", "podrun", "exec", str(spec)]
        run_measured(command, env)  # trust host keys, ship the (empty) code
        samples = [run_measured(command, env) for _ in range(rounds)]
        wall, cpu, rss = (statistics.median(sample[field] for sample in samples) for field in range(3))
        rows[count] = (wall, cpu, rss)
    base_count, (_, _, base_rss) = next(iter(rows.items()))
    table = {}
    for count, (wall, cpu, rss) in rows.items():
        extra = f"{(rss - base_rss) / (count - base_count) / 1024:.0f} KB" if count != base_count else "-"
        table[str(count)] = [f"{wall:.2f}", f"{cpu:.2f}", f"{cpu / count * 1000:.1f} ms", f"{rss / 1e6:.0f} MB",
                             extra]
    print_table(f"podrun exec of `true`, the launcher process, median of {rounds} rounds",
                ["hosts", "wall s", "CPU s", "CPU per worker", "max RSS", f"RSS per worker above {base_count}"],
                table)


def streaming(lab: Lab, count: int, lines: int, workdir: Path, env: dict) -> None:
    code = workdir / "code"
    (code / "printer.py").write_text(PRINTER)
    spec = write_lab_spec(workdir / "stream.yaml", lab, "code", f'python3 printer.py "$PODRUN_WORKER" {lines}',
                          hosts=lab.hosts[:count])
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "podrun", "exec", str(spec)], env=env, capture_output=True)
    podrun_seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"streaming run failed: {result.stderr.decode()[-500:]}")
    job_id = re.search(rb"job (\S+) succeeded", result.stderr)[1].decode()
    live: dict[int, list[str]] = {index: [] for index in range(count)}
    for line in result.stdout.decode().splitlines():
        prefix, _, text = line.partition("] ")
        live[int(prefix[2:])].append(text)
    for index in range(count):
        expected = [f"w{index} line {i:06d} of the stream" for i in range(lines)]
        logged = (Path(env["PODRUN_HOME"]) / "jobs" / job_id / f"w{index}.log").read_text().splitlines()
        if logged != expected or live[index] != expected:
            raise SystemExit(f"worker {index}: {len(logged)} lines logged, {len(live[index])} shown; expected "
                             f"{lines} in order")
    ssh = all_at_once([" ".join(lab.ssh_args(i) + [shlex.quote(f"python3 -c {shlex.quote(PRINTER)} {i} {lines}")])
                       for i in range(count)])
    ssh_seconds = timed(f"{{ {ssh}; }} | cat > /dev/null")
    print(f"\n{count} workers x {lines:,} lines: every line logged and shown in order, per worker; "
          f"podrun {podrun_seconds:.2f} s, parallel ssh {ssh_seconds:.2f} s ({podrun_seconds / ssh_seconds:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream-hosts", type=int, default=64)
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args()
    if problem := require_lab_tools():
        sys.exit(problem)
    with tempfile.TemporaryDirectory() as workdir, Lab(max(args.hosts + [args.stream_hosts]), Path(workdir)) as lab:
        work = Path(workdir)
        (work / "code").mkdir()
        env = {**os.environ, "PODRUN_HOME": str(work / "podrun-home")}
        launcher_costs(lab, args.hosts, args.rounds, work, env)
        streaming(lab, args.stream_hosts, args.lines, work, env)


if __name__ == "__main__":
    main()
