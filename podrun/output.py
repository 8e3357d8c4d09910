"""Worker output: every byte to the worker's log, whole lines to the terminal with a `[wI]` prefix.

All workers write through one Terminal, a whole line at a time, so a line is never split between
workers. A carriage return ends a line in the live view too, so progress bars stream instead of
piling up; the log keeps the bytes exactly as the worker wrote them.
"""

from __future__ import annotations

import io
import re
import sys
from collections import deque

# mypy reads the import below; Python skips it: collections.abc would cost `podrun logs` 0.2 ms
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

LINE_BREAK = re.compile(rb"\r\n|\n|\r")
MAX_LINE = 1 << 20  # a longer run of bytes without a newline is shown in pieces of this size
COLOURS = (36, 33, 35, 32, 34, 31)


def print_table(rows: list[tuple[str, ...]]) -> None:
    """Rows of cells (the first the header) in left-aligned columns two spaces apart, to stdout."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def counted(count: int, noun: str) -> str:
    """`1 file`, `1,204 files`."""
    return f"{count:,} {noun}{'s' * (count != 1)}"


def size_text(count: float) -> str:
    """A byte count as people read it: 812 bytes, 4.2 KB, 1.3 GB."""
    for unit in ("bytes", "KB", "MB"):
        if count < 1024:
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GB"


def say(message: str) -> None:
    """podrun's own messages go to stderr, so stdout carries only the workers' output."""
    print(f"podrun: {message}", file=sys.stderr, flush=True)


class Terminal:
    """Where workers' lines are shown. If its reader goes away (`podrun exec job.yaml | head`), it
    shows nothing more and calls on_closed; without one, the BrokenPipeError goes to the caller."""

    def __init__(self, stream: io.BufferedIOBase | None = None, prefixed: bool = True):
        self.stream = stream or sys.stdout.buffer
        self.prefixed = prefixed
        self.colour = self.stream.isatty()
        self.closed = False
        self.on_closed: Callable[[], None] | None = None

    def prefix(self, index: int) -> bytes:
        if not self.prefixed:
            return b""
        label = f"[w{index}]"
        if self.colour:
            label = f"\x1b[{COLOURS[index % len(COLOURS)]}m{label}\x1b[0m"
        return label.encode() + b" "

    def write_lines(self, prefix: bytes, lines: list[bytes]) -> None:
        if self.closed:
            return
        try:
            self.stream.write(b"".join(prefix + line + b"\n" for line in lines))
            self.stream.flush()
        except BrokenPipeError:
            self.closed = True
            if self.on_closed is None:
                raise
            self.on_closed()


class WorkerOutput:
    """One worker's stream: logged, split into lines, shown prefixed, its last lines kept."""

    def __init__(self, index: int, terminal: Terminal | None, log: io.RawIOBase | None, keep: int = 50):
        self.terminal = terminal
        self.prefix = terminal.prefix(index) if terminal else b""
        self.log = log
        self.pending = b""
        self.last_lines: deque[bytes] = deque(maxlen=keep)

    def feed(self, data: bytes) -> None:
        if self.log:
            self.log.write(data)
        self.pending += data
        # a trailing \r may be the first half of \r\n: wait for the next byte before ending the line
        end = max(self.pending.rfind(b"\n"), self.pending.rfind(b"\r", 0, len(self.pending) - 1))
        if end >= 0:
            complete, self.pending = self.pending[:end + 1], self.pending[end + 1:]
            self._show(LINE_BREAK.split(complete)[:-1])
        while len(self.pending) >= MAX_LINE:
            piece, self.pending = self.pending[:MAX_LINE], self.pending[MAX_LINE:]
            self._show([piece])

    def close(self) -> None:
        """Show what is left of an unterminated last line."""
        if self.pending:
            self._show(LINE_BREAK.split(self.pending.rstrip(b"\r")))
            self.pending = b""

    def tail(self) -> list[str]:
        return [line.decode(errors="replace") for line in self.last_lines]

    def _show(self, lines: list[bytes]) -> None:
        self.last_lines.extend(lines)
        if self.terminal and lines:
            self.terminal.write_lines(self.prefix, lines)
