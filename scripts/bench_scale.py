#!/usr/bin/env python3
"""podrun at pod scale: the launcher's cost per worker (CPU, memory, open files, bytes written,
time to connect, ship and finish) on local workers and on lab hosts, against raw fan-out in the same
run; and output from 64 lab workers streaming 20,000 lines each without loss.

    python scripts/bench_scale.py --local 64 128 256 512 1024 --hosts --stream-hosts 0 [--cached]
    sudo python scripts/bench_scale.py [--hosts 16 64 256] [--rounds 3] [--stream-hosts 64] [--lines 20000]
    sudo python scripts/bench_scale.py --hosts 512 --handshakes 8 32 128 512 --stream-hosts 0
    sudo python scripts/bench_scale.py --hosts 64 256 512 --reach direct tree --rounds 1 --stream-hosts 0
    sudo python scripts/bench_scale.py --hosts 16 --rounds 3 --stream-hosts 0 --against REV

1. `podrun exec` of `run: true` on N workers (lab hosts: code already shipped; local workers: a
   fresh PODRUN_HOME each round, so an empty workdir ships; with --cached, the second run in it, the
   code in place): wall time, the launcher's CPU time (user +
   system, from wait4), peak memory (max RSS), the most open files (/proc/PID/fd, read every 5 ms),
   the bytes it wrote (/proc/PID/io wchar at the last read: pipes, sockets and files), and from
   the job's record (timeline.py) how long connect, ship and run took. Each also per worker. The
   raw baseline in the same round: N `python -I -S -c pass` spawned at once and waited for (a local
   worker's agent is a Python process started so; the median of three, one before podrun's run and
   two after), or plain parallel `ssh host true` (OpenSSH, curve25519).
2. --handshakes: connecting to the largest --hosts count with each PODRUN_SSH_HANDSHAKES value.
   --against REV: the lab hosts' runs also with podrun as it was at git revision REV (git archive, run
   by the same interpreter with its own PODRUN_HOME), interleaved with this tree's in every round;
   a table of the two side by side.
3. Every one of --stream-hosts workers prints --lines numbered lines as fast as it can: every
   line must be in that worker's log, in order, and in podrun's live output, in order, under its
   own prefix. Timed against plain parallel ssh running the same command into the same pipe.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import BRIDGE, Lab, all_at_once, podrun_at, print_table, require_lab_tools, timed, write_lab_spec

PRINTER = ("import sys\nw = sys.argv[1]\nout = sys.stdout\n"
           "for i in range(int(sys.argv[2])):\n    out.write('w%s line %06d of the stream\\n' % (w, i))\n")


REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.005  # reading /proc/PID/fd of 4,000 files takes about 1 ms


@dataclass
class Sample:
    wall_s: float
    cpu_s: float  # the launcher's own, from /proc/PID/stat at the last read (local workers' agents are its children)
    rss: int  # bytes, the peak
    fds: int  # the most open at once
    written: int  # bytes: wchar at the last read (pipes and files), or sent over the lab's bridge (--hosts)
    phases: dict[str, float] = field(default_factory=dict)  # connect, ship, run: seconds, first start to last end


def run_measured(command: list[str], env: dict, bridge: str | None = None, tree: Path = REPO) -> Sample:
    """One podrun process's costs, read while it runs and from wait4; it must succeed. With `bridge`,
    the bytes written are those this machine sent to the lab hosts (the bridge's tx_bytes: socket
    sends are not in wchar; traffic between lab hosts, such as the relay's, is not on it)."""
    env = {**env, "PYTHONPATH": str(tree)}  # this checkout's podrun (or --against's), not an installed one
    sent_before = _bridge_sent(bridge)
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:  # a pipe left unread would stop podrun once full
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors)
        fds = written = ticks = 0
        while True:
            try:
                fds = max(fds, len(os.listdir(f"/proc/{process.pid}/fd")))
                io = Path(f"/proc/{process.pid}/io").read_text()
                written = int(re.search(r"^wchar: (\d+)", io, re.MULTILINE)[1])
                stat = Path(f"/proc/{process.pid}/stat").read_text().rpartition(")")[2].split()
                ticks = int(stat[11]) + int(stat[12])  # utime + stime, without its children's
            except (OSError, TypeError):  # it has just ended
                pass
            if os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                break
            time.sleep(POLL_S)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        text = errors.read().decode()
    if process.returncode != 0:
        raise SystemExit(f"{command!r} failed: {text[-2000:]}")
    if bridge:
        written = _bridge_sent(bridge) - sent_before
    sample = Sample(time.perf_counter() - started, ticks / os.sysconf("SC_CLK_TCK"), usage.ru_maxrss * 1024, fds,
                    written)
    if found := re.search(r"job (\S+) succeeded", text):
        record = json.loads((Path(env["PODRUN_HOME"]) / "jobs" / found[1] / "job.json").read_text())
        for phase in record["phases"]:
            sample.phases[phase["phase"]] = phase["end"] - phase["start"]
    return sample


def _bridge_sent(bridge: str | None) -> int:
    return int(Path(f"/sys/class/net/{bridge}/statistics/tx_bytes").read_text()) if bridge else 0


def spawned_at_once(count: int) -> float:
    """Seconds to start `count` Python processes at once and wait for them all: a local worker's floor
    (its agent runs in this interpreter, with -I -S, as transport/base.py starts it)."""
    started = time.perf_counter()
    processes = [subprocess.Popen([sys.executable, "-I", "-S", "-c", "pass"]) for _ in range(count)]
    if any(process.wait() for process in processes):
        raise SystemExit("python -I -S -c pass failed")
    return time.perf_counter() - started


def cost_table(title: str, samples: dict[int, tuple[Sample, float]], baseline: str) -> None:
    """A row per count: the medians, each per worker, and the growth per further worker above the first."""
    base_count, (base, _) = next(iter(samples.items()))
    table = {}
    for count, (sample, raw_s) in samples.items():
        def growth(value, base_value, unit=1.0, digits=0, count=count):
            return f"{(value - base_value) / (count - base_count) / unit:.{digits}f}" if count != base_count else "-"
        table[str(count)] = [
            f"{sample.wall_s:.2f}", f"{raw_s:.2f}", f"{sample.wall_s / raw_s:.1f}x",
            f"{sample.cpu_s:.2f}", f"{sample.cpu_s / count * 1000:.1f}", growth(sample.cpu_s, base.cpu_s, 1e-3, 1),
            f"{sample.rss / 1e6:.0f}", growth(sample.rss, base.rss, 1e3),
            str(sample.fds), growth(sample.fds, base.fds, 1, 2),
            f"{sample.written / 1e6:.1f}", f"{sample.written / count / 1e3:.1f}",
            *(f"{sample.phases[phase]:.2f}" if phase in sample.phases else "-" for phase in ("connect", "ship", "run"))]
    print_table(title, ["workers", "wall s", f"{baseline} s", "ratio", "CPU s", "CPU ms/worker",
                        "CPU ms/further worker", "max RSS MB", "KB/further worker", "peak fds", "fds/further worker",
                        "sent MB", "KB/worker", "connect s", "ship s", "run s"], table)


MODEL_AT = (1024, 4096, 12_000)


def fit_table(title: str, samples: dict[int, tuple[Sample, float]]) -> None:
    """Least-squares lines a + b*N through the rows, per quantity: the coefficients, the largest
    residual (as a share of its measurement), and what the line gives at MODEL_AT workers."""
    counts = list(samples)
    quantities = {
        "launcher CPU s": [sample.cpu_s for sample, _ in samples.values()],
        "max RSS MB": [sample.rss / 1e6 for sample, _ in samples.values()],
        "peak fds": [float(sample.fds) for sample, _ in samples.values()],
        "sent MB": [sample.written / 1e6 for sample, _ in samples.values()],
        **{f"{phase} s": [sample.phases.get(phase, 0.0) for sample, _ in samples.values()]
           for phase in ("connect", "ship", "run")},
        "wall s": [sample.wall_s for sample, _ in samples.values()],
    }
    table = {}
    mean_n = statistics.fmean(counts)
    for name, values in quantities.items():
        if not any(values):  # a phase that did not happen (ship, with the code already there)
            continue
        mean_v = statistics.fmean(values)
        slope = (sum((n - mean_n) * (v - mean_v) for n, v in zip(counts, values))
                 / sum((n - mean_n) ** 2 for n in counts))
        intercept = mean_v - slope * mean_n
        residuals = [v - (intercept + slope * n) for n, v in zip(counts, values)]
        worst = max(range(len(counts)), key=lambda i: abs(residuals[i]) / max(abs(values[i]), 1e-9))
        table[name] = [_number(intercept), f"{slope:.4g}", " ".join(f"{r:+.2g}" for r in residuals),
                       f"{residuals[worst] / values[worst]:+.0%} at {counts[worst]}",
                       *(_number(intercept + slope * n) for n in MODEL_AT)]
    print_table(f"{title}: fitted a + b*N over N = {', '.join(map(str, counts))}",
                ["quantity", "a", "b (per worker)", "residuals", "worst", *(f"N={n:,}" for n in MODEL_AT)],
                table)


def _number(value: float) -> str:
    return f"{value:,.2f}" if abs(value) < 10 else f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"


def medians(samples: list[Sample]) -> Sample:
    middle = Sample(*(statistics.median(getattr(s, name) for s in samples)
                      for name in ("wall_s", "cpu_s", "rss", "fds", "written")))
    for phase in samples[0].phases:
        middle.phases[phase] = statistics.median(s.phases.get(phase, 0.0) for s in samples)
    return middle


def local_costs(counts: list[int], rounds: int, workdir: Path, cached: bool) -> None:
    code = workdir / "local-code"
    code.mkdir(exist_ok=True)
    rows = {}
    for count in counts:
        samples, raws = [], []
        for round_ in range(rounds):
            env = {**os.environ, "PODRUN_HOME": str(workdir / f"home-local-{count}-{round_}")}
            command = [sys.executable, "-m", "podrun", "exec", "--local", str(count), "--workdir", str(code), "--", "true"]
            if cached:  # a first run ships the code and fills the workers' caches
                run_measured(command, env)
            raw_before = spawned_at_once(count)  # the machine is shared: the raw start on both sides of podrun's
            samples.append(run_measured(command, env))
            raws.append(statistics.median([raw_before, spawned_at_once(count), spawned_at_once(count)]))
            shutil.rmtree(env["PODRUN_HOME"], ignore_errors=True)
        rows[count] = (medians(samples), statistics.median(raws))
        print(f"  {count} local workers: {rows[count][0]}", file=sys.stderr, flush=True)
    shipping = "code already on the workers" if cached else "the code shipped"
    cost_table(f"podrun exec --local N --workdir EMPTY -- true, {shipping}, the launcher process, median of {rounds} "
               "rounds; raw: N `python -I -S -c pass` at once", rows, "raw")
    if len(rows) >= 3:
        fit_table("local workers", rows)


# --reach: how the launcher reaches the hosts, as PODRUN_CONTROL_TREE sets it (launch/control_tree.py)
REACH = {"default": None, "direct": "off", "tree": "2"}


def launcher_costs(lab: Lab, counts: list[int], rounds: int, workdir: Path, env: dict, reaches: list[str],
                   against: str | None = None) -> None:
    """Each of `reaches` with this tree, and with --against the default reach at REV, interleaved per round."""
    variants = {(f"this tree, {reach}" if reach != "default" else "this tree"): (REPO, REACH[reach]) for reach in reaches}
    if against:
        variants[against] = (podrun_at(against, workdir / "against"), None)
    rows: dict[str, dict[int, tuple[Sample, float]]] = {label: {} for label in variants}
    paired: dict[int, float] = {}  # --against: the median of each round's ratio of wall times, this tree's to REV's
    first = next(iter(variants))
    for count in counts:
        commands = {}
        for label, (tree, reach) in variants.items():  # each tree its own home: neither finds the other's records
            spec = write_lab_spec(workdir / f"true{count}-{len(commands)}.yaml", lab, "code", "true",
                                  hosts=lab.hosts[:count])
            tree_env = env if tree == REPO else {**env, "PODRUN_HOME": f"{env['PODRUN_HOME']}-against"}
            tree_env = {**tree_env, **({"PODRUN_CONTROL_TREE": reach} if reach else {})}
            commands[label] = ([sys.executable, "-P", "-m", "podrun", "exec", str(spec)], tree_env, tree)
            run_measured(commands[label][0], tree_env, tree=tree)  # trust host keys, ship, fill the workers' caches
        ssh = all_at_once([" ".join(lab.ssh_args(i) + ["-o", "KexAlgorithms=curve25519-sha256", "true"])
                           for i in range(count)])
        samples: dict[str, list[Sample]] = {label: [] for label in variants}
        raws = []
        for _ in range(rounds):  # interleaved: each variant, then the raw baseline
            for label, (command, tree_env, tree) in commands.items():
                samples[label].append(run_measured(command, tree_env, BRIDGE, tree))
            raws.append(timed(ssh))
        for label in variants:
            rows[label][count] = (medians(samples[label]), statistics.median(raws))
            print(f"  {count} hosts, {label}: {rows[label][count][0]}", file=sys.stderr, flush=True)
        if against:
            paired[count] = statistics.median(here.wall_s / there.wall_s
                                              for here, there in zip(samples[first], samples[against]))
    for label, table in rows.items():
        if label == against:
            continue
        cost_table(f"podrun exec of `true` on N lab hosts ({label}), code already shipped, the launcher process, "
                   f"median of {rounds} rounds; raw: parallel `ssh host true`", table, "ssh")
        if len(counts) >= 3:
            fit_table(f"lab hosts ({label})", table)
    if against:
        against_table(rows[first], rows[against], paired, against, rounds)


def against_table(here: dict[int, tuple[Sample, float]], there: dict[int, tuple[Sample, float]],
                  paired: dict[int, float], against: str, rounds: int) -> None:
    print_table(f"the same, this tree against {against}, interleaved, median of {rounds} rounds (paired: the "
                "median of each round's ratio)",
                ["hosts", "wall s", f"at {against}", "ratio", "paired", "KB sent/host", f"at {against}",
                 "launcher CPU s", f"at {against}", "ssh s"],
                {str(count): [f"{sample.wall_s:.2f}", f"{there[count][0].wall_s:.2f}",
                              f"{sample.wall_s / there[count][0].wall_s:.2f}x", f"{paired[count]:.2f}x",
                              f"{sample.written / count / 1e3:.1f}",
                              f"{there[count][0].written / count / 1e3:.1f}", f"{sample.cpu_s:.2f}",
                              f"{there[count][0].cpu_s:.2f}", f"{raw_s:.2f}"]
                 for count, (sample, raw_s) in here.items()})


def handshake_costs(lab: Lab, count: int, values: list[int], workdir: Path, env: dict) -> None:
    spec = write_lab_spec(workdir / f"true{count}.yaml", lab, "code", "true", hosts=lab.hosts[:count])
    table = {}
    for value in values:
        sample = run_measured([sys.executable, "-m", "podrun", "exec", str(spec)],
                              {**env, "PODRUN_SSH_HANDSHAKES": str(value)})
        table[str(value)] = [f"{sample.phases['connect']:.2f}", f"{sample.wall_s:.2f}", f"{sample.cpu_s:.2f}"]
    print_table(f"connecting to {count} lab hosts (connect: to every agent's first report)",
                ["PODRUN_SSH_HANDSHAKES", "connect s", "wall s", "launcher CPU s"], table)


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
    parser.add_argument("--local", type=int, nargs="*", default=[])
    parser.add_argument("--hosts", type=int, nargs="*", default=[16, 64, 256])
    parser.add_argument("--cached", action="store_true",
                        help="local workers: measure a second run, with the code and the compiled agent in place")
    parser.add_argument("--handshakes", type=int, nargs="*", default=[])
    parser.add_argument("--reach", nargs="+", choices=list(REACH), default=["default"],
                        help="how the launcher reaches lab hosts: podrun's default, direct, or through the control tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream-hosts", type=int, default=64)
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--against", metavar="REV", help="lab hosts: podrun at this git revision too, interleaved")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        work = Path(workdir)
        if args.local:
            local_costs(args.local, args.rounds, work, args.cached)
        lab_size = max(args.hosts + [args.stream_hosts if args.stream_hosts else 0])
        if not lab_size:
            return
        if problem := require_lab_tools():
            sys.exit(problem)
        with Lab(lab_size, work / "lab") as lab:
            (work / "code").mkdir()
            env = {**os.environ, "PODRUN_HOME": str(work / "podrun-home")}
            if args.hosts:
                launcher_costs(lab, args.hosts, args.rounds, work, env, args.reach, args.against)
            if args.handshakes:
                handshake_costs(lab, max(args.hosts), args.handshakes, work, env)
            if args.stream_hosts:
                streaming(lab, args.stream_hosts, args.lines, work, env)


if __name__ == "__main__":
    main()
