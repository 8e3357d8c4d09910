"""The latency the collapse of identical lines (podrun/collapse.py) adds to a single worker's line.

One worker prints a line now and then, stamped with the time it printed it; the others (if any)
print nothing. The latency of a line is the time from its print to its text reaching podrun's
stdout: a pseudo-terminal (where the line shows at once as a row of the live region) or a pipe
(where it goes out when its window ends, unless every worker joined it). Each case runs with the
collapse on (the default) and with --no-collapse: the difference is what the collapse adds.

    python scripts/bench_collapse.py [--workers 1,64] [--lines 10] [--cost 64,1024,4096] [--ranks 1000000]

--cost: the collapse's own CPU per line (podrun/collapse.py alone, a clock that steps 0.5 s a
round), with N workers that each print a line of their own and a line all print, 20 rounds, and one
worker a warning more each round.

--ranks N: the memory the collapse keeps for many sources: one worker prints a line from each of N
ranks (`[rank7]: ...`, with newlines, then without), through `podrun exec` and then `podrun logs` of that
job, each with the collapse on and with --no-collapse: the peak RSS and CPU of podrun's process.

--stream MB: the cost of output without newlines: one worker prints MB megabytes of `x` in 4 KB writes,
and a tenth of that in 64-byte writes, each without a newline and then as lines (the same bytes, every
write's last byte a newline): podrun exec's peak RSS and CPU (its own process, not the worker's).
"""

from __future__ import annotations

import argparse
import os
import re
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = re.compile(rb"mark (\d+) (\d+\.\d+)")
PRINTER = """import os, sys, time
lines, gap = int(sys.argv[1]), float(sys.argv[2])
if os.environ["PODRUN_WORKER"] == "0":
    time.sleep(1)
    for number in range(lines):
        print("mark", number, repr(time.time()), flush=True)
        time.sleep(gap)
else:
    time.sleep(1 + lines * gap)
"""


def latencies(workers: int, lines: int, terminal: bool, collapse: bool, printer: Path) -> list[float]:
    """Seconds from each line's print to its text on podrun's stdout."""
    command = [sys.executable, "-m", "podrun", "exec", "--local", str(workers), *([] if collapse else ["--no-collapse"]),
               "--", sys.executable, str(printer), str(lines), "0.3"]
    if terminal:
        import fcntl
        import termios

        reader, writer = os.openpty()
        fcntl.ioctl(writer, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    else:
        reader, writer = os.pipe()
    process = subprocess.Popen(command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=writer,
                               stderr=subprocess.DEVNULL)
    os.close(writer)
    arrived: dict[int, float] = {}
    printed: dict[int, float] = {}
    seen = b""
    while True:
        if not select.select([reader], [], [], 1)[0]:
            if process.poll() is not None:
                break
            continue
        try:
            chunk = os.read(reader, 65536)
        except OSError:  # EIO: the terminal's last writer is gone
            break
        if not chunk:
            break
        now = time.time()
        seen = seen[-200:] + chunk
        for match in MARK.finditer(seen):
            number = int(match[1])
            if number not in arrived:
                arrived[number], printed[number] = now, float(match[2])
    os.close(reader)
    if process.wait() != 0 or len(arrived) != lines:
        raise SystemExit(f"{command}: exit code {process.returncode}, {len(arrived)} of {lines} lines seen")
    return [arrived[number] - printed[number] for number in sorted(arrived)]


def cost_per_line(workers: int, rounds: int = 20) -> float:
    """Seconds of CPU per line that Collapse.add and due() take."""
    sys.path.insert(0, str(REPO))
    from podrun.collapse import Collapse

    now = [0.0]
    collapse = Collapse(list(range(workers)), clock=lambda: now[0])
    lines = 0
    started = time.process_time()
    for round_number in range(rounds):
        for worker in range(workers):
            collapse.add((worker, None), b"step %d loss %d" % (round_number, worker))
            collapse.add((worker, None), b"Epoch %d" % round_number)
            lines += 2
            if worker == 5:
                collapse.add((worker, None), b"warning")
                lines += 1
        now[0] += 0.5
        collapse.due()
    collapse.due(everything=True)
    return (time.process_time() - started) / lines


RANKS = {"lines": ("import sys\nw = sys.stdout.buffer\n"
                   "for r in range({n}): w.write(b'[rank%d]: hello from rank %d\\n' % (r, r))\n"),
         "no newlines": ("import sys\nw = sys.stdout.buffer\n"  # in pieces: the printer's own memory stays small
                         "for s in range(0, {n}, 1000):\n"
                         "    w.write(b''.join(b'[rank%d]:x' % r for r in range(s, min(s + 1000, {n}))))\n")}
STREAM = "import os, sys\nwrite = os.write\ndata = {data!r}\nfor _ in range({count}): write(1, data)\n"
# podrun's own peak RSS (VmHWM) and CPU, written last to its stderr: os.wait4's would count its agents and
# workers too, and a process that subprocess starts with vfork begins with its parent's peak
OWN_USAGE = ("import os, re, sys; from podrun import cli; code = cli.main(sys.argv[1:]); times = os.times(); "
             "peak = re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read())[1]; "
             "print('own usage', peak, times.user + times.system, file=sys.stderr); cli._exit(code)")


def measured(arguments: list[str]) -> tuple[str, float, float]:
    """`podrun ARGUMENTS`: its stderr, its own peak RSS (MB) and CPU (s), its stdout thrown away."""
    command = [sys.executable, "-c", OWN_USAGE, *arguments]
    process = subprocess.run(command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, check=False)
    stderr = process.stderr.decode()
    usage = re.search(r"own usage (\d+) (\S+)", stderr)
    if process.returncode or usage is None:
        raise SystemExit(f"podrun {arguments} failed: {stderr}")
    return stderr, int(usage[1]) / 1024, float(usage[2])


def ranks_memory(ranks: int, work: Path) -> None:
    print("| output | command | collapse | peak RSS | CPU |\n|---|---|---|---:|---:|")
    for kind, source in RANKS.items():
        printer = work / "ranks.py"
        printer.write_text(source.format(n=ranks))
        job = None
        for collapse in (True, False):
            stderr, rss, cpu = measured(["exec", "--local", "1", *([] if collapse else ["--no-collapse"]), "--",
                                         sys.executable, str(printer)])
            job = job or re.search(r"job (\S+) succeeded", stderr)[1]  # type: ignore[index]
            print(f"| {kind} | exec | {'on' if collapse else 'off'} | {rss:.0f} MB | {cpu:.1f} s |", flush=True)
        for collapse in (True, False):
            _, rss, cpu = measured(["logs", str(job), *([] if collapse else ["--no-collapse"])])
            print(f"| {kind} | logs | {'on' if collapse else 'off'} | {rss:.0f} MB | {cpu:.1f} s |", flush=True)


def stream_cost(megabytes: int, work: Path) -> None:
    print("| writes | output | MB | peak RSS | CPU |\n|---|---|---:|---:|---:|")
    for size, total in ((4096, megabytes << 20), (64, (megabytes << 20) // 10)):
        for kind, data in (("no newlines", b"x" * size), ("lines", b"x" * (size - 1) + b"\n")):
            printer = work / "stream.py"
            printer.write_text(STREAM.format(data=data, count=total // size))
            _, rss, cpu = measured(["exec", "--local", "1", "--", sys.executable, str(printer)])
            print(f"| {size} bytes | {kind} | {total / (1 << 20):.0f} | {rss:.0f} MB | {cpu:.1f} s |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,64", help="worker counts, comma-separated")
    parser.add_argument("--lines", type=int, default=10, help="lines the printing worker prints, 0.3 s apart")
    parser.add_argument("--cost", help="worker counts for the collapse's own CPU per line (instead of latency)")
    parser.add_argument("--ranks", type=int, help="ranks for the memory of many sources (instead of latency)")
    parser.add_argument("--stream", type=int, help="megabytes one worker prints without newlines (instead of latency)")
    args = parser.parse_args()
    if args.stream or args.ranks:
        with tempfile.TemporaryDirectory() as work:
            os.environ.setdefault("PODRUN_HOME", str(Path(work) / "home"))
            if args.stream:
                stream_cost(args.stream, Path(work))
            if args.ranks:
                ranks_memory(args.ranks, Path(work))
        return
    if args.cost:
        print("| workers | CPU per line |\n|---|---|")
        for workers in map(int, args.cost.split(",")):
            print(f"| {workers} | {cost_per_line(workers) * 1e6:.1f} µs |")
        return
    with tempfile.TemporaryDirectory() as work:
        printer = Path(work) / "printer.py"
        printer.write_text(PRINTER)
        os.environ.setdefault("PODRUN_HOME", str(Path(work) / "home"))
        print("| workers | stdout | collapse | median | max | --no-collapse median | added (median) |")
        print("|---|---|---|---|---|---|---|")
        for workers in map(int, args.workers.split(",")):
            for terminal in (True, False):
                on = latencies(workers, args.lines, terminal, True, printer)
                off = latencies(workers, args.lines, terminal, False, printer)
                print(f"| {workers} | {'terminal' if terminal else 'pipe'} | on | {statistics.median(on) * 1000:.1f} ms "
                      f"| {max(on) * 1000:.1f} ms | {statistics.median(off) * 1000:.1f} ms "
                      f"| {(statistics.median(on) - statistics.median(off)) * 1000:.1f} ms |", flush=True)


if __name__ == "__main__":
    main()
