"""podrun's own lines, to stderr: say() and its kin, ask(); and how podrun writes counts, sizes,
durations, worker ranges and tables. A live terminal region (terminal.py) stays below what say() prints.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

from podrun import escapes

SUCCESS, FAILURE, PHASE = "1;32", "1;31", "2"  # bold green, bold red, dim


def print_table(rows: list[tuple[str, ...]]) -> None:
    """Rows of cells (the first the header) in left-aligned columns two spaces apart, to stdout."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def counted(count: int, noun: str) -> str:
    """`1 file`, `1,204 files`."""
    return f"{count:,} {noun}{'s' * (count != 1)}"


def duration_text(seconds: float) -> str:
    """`4.2s`, `3m05s`, `2h07m`."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def worker_ranges(indexes: list[int], letter: str = "w") -> str:
    """`w0-3,7`: sorted worker indexes (or, with letter `r`, ranks), runs of consecutive ones as ranges."""
    runs: list[list[int]] = []
    for index in sorted(indexes):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return letter + ",".join(f"{low}-{high}" if high > low else f"{low}" for low, high in runs)


def size_text(count: float) -> str:
    """A byte count as people read it: 812 bytes, 4.2 KB, 1.3 GB."""
    for unit in ("bytes", "KB", "MB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GB"


def colour_wanted(stream) -> bool:
    """Colour only on a terminal that shows it, and not when the user said no (https://no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def grace_announcement(grace_s: float) -> str:
    """What a stop says as it starts: how long the job's processes get before SIGKILL."""
    if not grace_s:
        return "stopping: SIGTERM sent, then SIGKILL at once (stop_grace 0s)"
    return f"stopping: SIGTERM sent, waiting up to {grace_s:g}s (stop_grace)"


def grace_left(ends_at: float) -> str:
    """A stop's countdown (time.monotonic() at which the grace period ends), for a live line."""
    left = -int((time.monotonic() - ends_at) // 1)  # the seconds left, rounded up (math would cost `podrun logs`)
    return (f"stopping: {left}s left of the grace period, then SIGKILL" if left > 0
            else "stopping: the grace period is over: SIGKILL sent")


_hidden: list[str] = []  # the running job's secret values (hidden()): no line podrun says holds one


@contextlib.contextmanager
def hidden(secrets: list[str]) -> Iterator[None]:
    """While the job runs, each of `secrets` reads *** in what podrun says, records and notifies (masked());
    then what was hidden before (nothing, or an enclosing job's) again."""
    before = _hidden[:]
    _hidden[:] = sorted({secret for secret in secrets if secret}, key=len, reverse=True)
    try:
        yield
    finally:
        _hidden[:] = before


def masked(text: str) -> str:
    for secret in _hidden:
        text = text.replace(secret, "***")
    return text


def say(message: str) -> None:
    """podrun's own messages go to stderr, so stdout carries only the workers' output."""
    _say(message)


def ask(question: str) -> bool:
    """A yes or no from the person at the terminal (stdin and stderr are one): `podrun: QUESTION [y/N] `."""
    print(f"podrun: {question} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def say_success(message: str) -> None:
    _say(message, SUCCESS)


def say_failure(message: str) -> None:
    _say(message, FAILURE)


def say_phase(name: str, detail: str = "") -> None:
    """A marker where a phase of the job (ship, setup, run) begins: `podrun: ── run (2 workers) ──`."""
    _say(f"── {name} ({detail}) ──" if detail else f"── {name} ──", PHASE)


def _say(message: str, style: str = "") -> None:
    colour = colour_wanted(sys.stderr)
    # a message may quote what others wrote (a worker's last lines, a supervisor's error): made harmless, always
    text = f"podrun: {escapes.shown_text(masked(message), colour)}"
    if style and colour:
        text = f"\x1b[{style}m{text}\x1b[0m"
    # terminal.py not imported: no live region is on the screen (and `podrun jobs` starts faster)
    terminal_module = sys.modules.get("podrun.terminal")
    terminal = terminal_module.Terminal.showing if terminal_module else None
    if terminal:  # stderr shares the screen: lift the live region off it, print, draw it again below
        terminal.lift_now()  # and show the lines held (collapse.py) first: they came before this one
    print(text, file=sys.stderr, flush=True)
    if terminal:
        terminal.flush()
