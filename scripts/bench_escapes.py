"""What making the workers' output harmless (podrun/escapes.py) costs per line: 1,000 workers' lines
through WorkerOutput and Terminal (a pipe, as `exec | tee`; and with colour, as on a terminal), without
and with --raw, and escapes.shown() alone. Kinds of line: plain ASCII (most output), coloured (SGR, as
from rich or a forced-colour logger), non-ASCII (UTF-8 text), hostile (an OSC 52 write).

    python scripts/bench_escapes.py        # run from a checkout; PYTHONPATH picks the tree measured
"""

from __future__ import annotations

import inspect
import io
import time

from podrun.terminal import Terminal
from podrun.worker_output import WorkerOutput

WORKERS = 1000
LINES = 200  # per worker
KINDS = {
    "plain": b"Epoch 3 step 1200/5000 loss 1.2345 lr 3.0e-04 grad_norm 0.87 tokens/s 412345 mem 31.2 GiB",
    "coloured": b"\x1b[32mINFO\x1b[0m Epoch 3 step 1200/5000 loss \x1b[1m1.2345\x1b[0m lr 3.0e-04 tokens/s 412345",
    "non-ASCII": "Époque 3 étape 1200/5000 perte 1,2345 — 学习率 3.0e-04 ✓ mémoire 31,2 Gio".encode(),
    "hostile": b"step 1200 \x1b]52;c;cm0gLXJmIH4K\x07 \x1b]0;pwned\x07 \x1b[2J\x1b[H loss 1.2345",
}


class Pipe(io.BytesIO):
    def isatty(self) -> bool:
        return False


def per_line_us(line: bytes, colour: bool, raw: bool) -> float:
    stream = Pipe()
    options = {"raw": raw} if "raw" in inspect.signature(Terminal).parameters else {}
    terminal = Terminal(stream, worker_count=WORKERS, **options)
    terminal.colour = colour
    outputs = [WorkerOutput(index, terminal, log=None) for index in range(WORKERS)]
    chunk = (line + b"\n") * 20  # as a worker's output arrives: several lines a read
    started = time.perf_counter()
    for _ in range(LINES // 20):
        for output in outputs:
            output.feed(chunk)
    return (time.perf_counter() - started) / (WORKERS * LINES) * 1e6


def main() -> None:
    has_raw = "raw" in inspect.signature(Terminal).parameters
    print(f"{WORKERS:,} workers x {LINES} lines, best of 3, microseconds per line")
    print(f"{'line':<10} {'pipe':>8} {'colour':>8} {'--raw':>8} {'shown()':>8}")
    for kind, line in KINDS.items():
        pipe = min(per_line_us(line, False, False) for _ in range(3))
        colour = min(per_line_us(line, True, False) for _ in range(3))
        raw = min(per_line_us(line, False, True) for _ in range(3)) if has_raw else float("nan")
        alone = float("nan")
        if has_raw:
            from podrun import escapes

            started = time.perf_counter()
            for _ in range(100_000):
                escapes.shown(line, False)
            alone = (time.perf_counter() - started) / 100_000 * 1e6
        print(f"{kind:<10} {pipe:8.2f} {colour:8.2f} {raw:8.2f} {alone:8.2f}")


if __name__ == "__main__":
    main()
