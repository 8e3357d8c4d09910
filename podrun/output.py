"""Worker output: every byte to the worker's log; to the terminal, what a person would see of it.

A worker's stream is cut into lines at newlines. A carriage return starts the line over, as it does
on a terminal, so a progress bar is one line whose text changes; the line is printed once, with its
final text, when its newline arrives. On a live terminal (a tty), the unfinished lines that were
redrawn (one per worker, or per rank) stay in a region at the bottom of the screen, redrawn in place,
and whole lines print above it. In a pipe, such a line also prints its latest text once every
PIPE_PROGRESS_S: a short bar costs one line, and a bar that runs for an hour still shows, in
`podrun exec job.yaml | tee run.txt` or a CI log, that the job is alive.

Under torchrun, each rank's lines and redraws arrive behind a header, `[rankN]:text`
(remote/rank_output.py): they are kept apart per rank and shown as `[w1 r3] text`, each rank with
its own live line; a blank rank line is left out. A header may also come in the middle of a line (as
torchrun's own --tee writes a line it read before its end): the line goes on after the next header
of its rank.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import sys
import time
from collections import deque

from podrun import escapes
from podrun.collapse import Collapse, Group

# mypy reads the import below; Python skips it: collections.abc would cost `podrun logs` 0.2 ms
TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable
    from typing import BinaryIO

# a rank's header (remote/rank_output.py), `[rank3]:`; more digits than any world size has make it text, not a
# header: Python refuses to read an integer of 4,301 digits, and each header names a rank to keep apart
RANK_HEADER = r"\[rank(\d{1,7})\]:"
LINE_BREAK = re.compile(rb"\r\n|\n|\r|" + RANK_HEADER.encode())
# a worker's ranks with an unfinished line at once (each costs a line's state, and a live row); a stream
# naming ever new ranks finishes the oldest one's line as it goes, so memory stays bounded
MAX_OPEN_RANKS = 1024
MAX_LINE = 1 << 20  # a longer run of bytes without a newline is shown in pieces of this size
PIPE_PROGRESS_S = 30.0
# a live line is redrawn at most this often, so a fast bar costs the terminal nothing; a newer text
# waits for the next output of any worker (as with tqdm's own mininterval, the bar may lag a step)
MIN_REDRAW_S = 0.1
COLOURS = (36, 33, 35, 32, 34, 31)
SUCCESS, FAILURE, PHASE = "1;32", "1;31", "2"  # bold green, bold red, dim
MORE_ROWS = (-1, None)  # the region's last row when more lines are live than fit the screen
STATUS = (-2, None)  # podrun's own live line (a stop's countdown), below the workers' live lines
MIN_TIMER_S = 0.005  # a timer for a group due now waits this little: one set for 0 s could fire early, again and again
Row = tuple[int, int | None] | Group  # a live region's row: a worker's (or rank's) live line, or a group held


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
    text = f"podrun: {escapes.shown_text(message, colour)}"
    if style and colour:
        text = f"\x1b[{style}m{text}\x1b[0m"
    terminal = Terminal.showing
    if terminal:  # stderr shares the screen: lift the live region off it, print, draw it again below
        terminal.lift_now()  # and show the lines held (collapse.py) first: they came before this one
    print(text, file=sys.stderr, flush=True)
    if terminal:
        terminal.flush()


class Terminal:
    """Where workers' lines are shown: whole lines, and on a tty the live region below them. If its
    reader goes away (`podrun exec job.yaml | head`), it shows nothing more and calls on_closed;
    without one, the BrokenPipeError goes to the caller. worker_count pads every prefix to the widest.

    With `collapse` (collapse.py), finished lines are held in groups and each group shows once, with
    its workers' range, when it is due. On a live terminal a group held shows at once as a row of the
    live region, its range growing in place as workers join it; in a pipe it goes out when it is due,
    which a timer sees to while an event loop runs (podrun logs flushes as it polls).

    Workers' lines are made harmless for the terminal (escapes.py) unless `raw`; a live row always is:
    it is podrun's drawing, and one escape sequence in it would break the region."""

    showing: Terminal | None = None  # the terminal whose live region is on the screen, or which holds lines, now

    def __init__(self, stream: io.BufferedIOBase | BinaryIO | None = None, prefixed: bool = True,
                 worker_count: int = 1, collapse: Collapse | None = None, raw: bool = False):
        self.stream = stream or sys.stdout.buffer
        self.prefixed = prefixed
        self.raw = raw
        self.colour = colour_wanted(self.stream)
        self.live = self.stream.isatty() and os.environ.get("TERM") != "dumb"
        self.label_width = len(f"[w{worker_count - 1}]") if prefixed else 0
        self.closed = False
        self.on_closed: Callable[[], None] | None = None
        self.pending: list[bytes] = []  # what the next flush writes
        self.live_lines: dict[tuple[int, int | None], bytes] = {}  # (worker, rank): its live line's text
        self.rows: list[Row] = []  # the live region's rows on the screen, top to bottom
        self.drawn_at: dict[Row, float] = {}
        self.stale: set[Row] = set()  # rows whose new text waits for its turn to be drawn
        self.lifted = False  # the region was erased to print lines above it; the next flush draws it again
        self.status: str | None = None  # podrun's own live line (show_status)
        self.collapse = collapse
        self.unshown: list[Group] = []  # groups held that have no row in the live region yet
        # (event loop, its timer) that flushes when the oldest group held is due
        self.timer: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None

    def label(self, index: int, rank: int | None) -> bytes:
        """`[w1] `, `[w1 r3] `, padded to the widest label so far, so the lines' text starts in one column."""
        if rank is None and not self.prefixed:
            return b""
        names = [f"w{index}"] * self.prefixed + [f"r{rank}"] * (rank is not None)
        text = f"[{' '.join(names)}]"
        self.label_width = max(self.label_width, len(text))
        return self._coloured(text, index)

    def group_label(self, group: Group) -> bytes:
        """A collapsed line's label, `[w0-511,513-1023] `, `[w0-3 r0-31] `; one source's, as label() has it.
        A range wider than the widest single label does not widen the column for the lines after it."""
        if len(group.sources) == 1:
            return self.label(*group.sources[0])
        workers = {index for index, _ in group.sources}
        names = [worker_ranges(list(workers))]
        if group.ranked:
            names.append(worker_ranges([rank for _, rank in group.sources if rank is not None], "r"))
        return self._coloured(f"[{' '.join(names)}]", min(workers))

    def _coloured(self, text: str, index: int) -> bytes:
        padding = " " * (max(self.label_width - len(text), 0) + 1)
        if self.colour:
            text = f"\x1b[{COLOURS[index % len(COLOURS)]}m{text}\x1b[0m"
        return (text + padding).encode()

    def print_line(self, index: int, rank: int | None, text: bytes | None) -> None:
        """A line of worker `index` (rank `rank`) is finished: it leaves the live region; `text`, if
        given, prints above it (or, collapsing, is held: collapse.py)."""
        if self.live_lines.pop((index, rank), None) is not None or (text is not None and not self.collapse):
            self._lift()
        self.drawn_at.pop((index, rank), None)  # a rank's row is gone for good: its line ended
        self.stale.discard((index, rank))
        if text is None:
            return
        if not self.raw:
            text = escapes.shown(text, self.colour)
        if not self.collapse:
            self.pending.append(self.label(index, rank) + text + b"\n")
            return
        if rank is not None or self.prefixed:
            self.label(index, rank)  # the column is as wide as without collapsing
        group, new = self.collapse.add((index, rank), text)
        if self.collapse.crowded:  # a flood of lines between two flushes: memory stays bounded
            self._show_groups(self.collapse.due())
        if not self.live:
            return
        if new:
            self.unshown.append(group)
        elif group in self.rows:
            self.stale.add(group)

    def show_live(self, index: int, rank: int | None, text: bytes) -> None:
        """The unfinished line of worker `index` (rank `rank`) now shows `text`; on a live terminal only."""
        key = (index, rank)
        if not text.strip():  # the program erased its line
            self.print_line(index, rank, None)
            return
        new = key not in self.live_lines
        self.live_lines[key] = text
        if new:
            self._lift()  # the region is drawn again with a row for it, fitted to the screen
        elif key in self.rows:
            self.stale.add(key)

    def show_status(self, text: str | None) -> None:
        """podrun's own live line (a stop's countdown) now shows `text`, below the workers' live lines;
        None takes it away. On a live terminal only: a pipe gets podrun's lines from say() alone."""
        if not self.live:
            return
        shown, self.status = self.status, text
        if text is None or shown is None:
            self._lift()  # drawn again with the row, or without it
        elif STATUS in self.rows:
            self.stale.add(STATUS)
        self.flush()

    def flush(self) -> None:
        """Write what is pending, the groups held that are due, the live region drawn again if it was
        lifted, and rows that waited for their turn to be redrawn."""
        if self.collapse:
            self._show_groups(self.collapse.due())
            self._show_held()
        if self.lifted:
            self._draw_region()
        now = time.monotonic()
        for key in [key for key in self.stale if now - self.drawn_at[key] >= MIN_REDRAW_S]:
            self._redraw_row(key)
        self._write()
        if self.rows or (self.collapse and self.collapse.held):
            Terminal.showing = self
            self._arm_timer()
        elif Terminal.showing is self:
            Terminal.showing = None

    def lift_now(self) -> None:
        """Show every line held now, and erase the live region from the screen, so that something else
        can print after them; flush draws it again."""
        if self.collapse:
            self._show_groups(self.collapse.due(everything=True))
        self._lift()
        self._write()

    def release(self) -> None:
        """Show every line held now (the job's output ended)."""
        if self.collapse:
            self._show_groups(self.collapse.due(everything=True))
        if self.timer:
            self.timer[1].cancel()
            self.timer = None
        self.flush()

    def _show_groups(self, groups: list[Group]) -> None:
        """Print groups that are due above the live region, each as one line."""
        if not groups:
            return
        self._lift()
        for group in groups:
            self.pending.append(self.group_label(group) + group.text + b"\n")
            self.drawn_at.pop(group, None)

    def _show_held(self) -> None:
        """Rows for the groups held that have none yet: at the region's bottom, if they fit there below
        the rows drawn, else the region drawn again (only its last row's count, if it is full)."""
        unshown, self.unshown = self.unshown, []
        if not unshown or self.lifted:
            return  # the region is drawn again, with every group held
        if MORE_ROWS in self.rows:
            self.stale.add(MORE_ROWS)
        elif self.live_lines or self.status is not None or len(self.rows) + len(unshown) > self._room(0):
            self._lift()
        else:  # the region holds only groups, which stay in order: the new ones go below
            columns = self._size()[0]
            for group in unshown:
                self.pending.append(self._row(group, columns) + b"\n")
            self.rows += unshown

    def _arm_timer(self) -> None:
        """While an event loop runs, flush when the oldest group held is due (no other line may come)."""
        asyncio = sys.modules.get("asyncio")  # not imported: no loop runs (and `podrun logs` starts faster)
        due_in = self.collapse.due_in() if self.collapse else None
        if asyncio is None or due_in is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self.timer is None or self.timer[0] is not loop:
            self.timer = (loop, loop.call_later(max(due_in, MIN_TIMER_S), self._on_timer))

    def _on_timer(self) -> None:
        self.timer = None
        self.flush()

    def _lift(self) -> None:
        if not self.live:
            return
        if self.rows:
            self.pending.append(b"\x1b[%dA\r\x1b[J" % len(self.rows))
            self.rows = []
        self.stale.clear()
        self.lifted = True

    def _draw_region(self) -> None:
        self.lifted = False
        self.unshown = []
        status: list[Row] = [STATUS] if self.status is not None else []
        room = self._room(len(status))
        held = self.collapse.held if self.collapse else ()
        keys: list[Row] = [*itertools.islice(held, room + 1), *itertools.islice(self.live_lines, room + 1)]
        if not keys and not status:
            self.rows = []
            return
        self.rows = (keys if len(keys) <= room else keys[:room - 1] + [MORE_ROWS]) + status
        columns = self._size()[0]
        for key in self.rows:
            self.pending.append(self._row(key, columns) + b"\n")

    def _room(self, status_rows: int) -> int:
        """The rows the region may take: a region taller than the screen could not be erased."""
        return max(1, self._size()[1] - 2 - status_rows)

    def _redraw_row(self, key: Row) -> None:
        up = len(self.rows) - self.rows.index(key)
        row = self._row(key, self._size()[0])
        self.pending.append(b"\x1b[%dA\r\x1b[2K%s\r\x1b[%dB" % (up, row, up))
        self.stale.discard(key)

    def _row(self, key: Row, columns: int) -> bytes:
        """A live row, cut to the screen's width: a row that wrapped could not be erased."""
        self.drawn_at[key] = time.monotonic()
        if isinstance(key, Group):
            label, line = self.group_label(key), key.text
        elif key in (MORE_ROWS, STATUS):
            held = len(self.collapse.held) if self.collapse else 0
            more = held + len(self.live_lines) - len(self.rows) + 1 + (self.status is not None)
            text = _fit(f"podrun: {self.status}" if key == STATUS else f"... and {more} more live lines", columns - 1)
            return (f"\x1b[2m{text}\x1b[0m" if self.colour else text).encode()
        else:
            label, line = self.label(*key), self.live_lines[key]
        text = escapes.shown(line, colour=False).decode(errors="replace").expandtabs()
        label_columns = len(escapes.shown(label, colour=False).decode())  # a range may be wider than label_width
        return label + _fit(text, columns - 1 - label_columns).encode()

    def _size(self) -> tuple[int, int]:
        try:
            size = os.get_terminal_size(self.stream.fileno())
        except (OSError, ValueError):  # not a real terminal (a test's stream)
            return 80, 24
        return size.columns or 80, size.lines or 24  # 0: a terminal that was never given a size

    def _write(self) -> None:
        data, self.pending = b"".join(self.pending), []
        if self.closed or not data:
            return
        try:
            self.stream.write(data)
            self.stream.flush()
        except BrokenPipeError:
            self.closed = True
            if self.on_closed is None:
                raise
            self.on_closed()


def _fit(text: str, columns: int) -> str:
    """The start of `text` that fills at most `columns` columns (East Asian wide characters take two)."""
    if text.isascii():
        return text[:max(columns, 0)]
    import unicodedata  # here: only a live row with non-ASCII text needs it

    used = 0
    for position, char in enumerate(text):
        used += 2 if unicodedata.east_asian_width(char) in "WF" else 1
        if used > columns:
            return text[:position]
    return text


class _Line:
    """An unfinished line: the text since its last carriage return, and what it showed before that."""

    __slots__ = ("text", "shown", "redrawn", "since")

    def __init__(self) -> None:
        self.text = b""
        self.shown = b""
        self.redrawn = False
        self.since = time.monotonic()  # its start, or when a pipe last saw its progress

    def final(self) -> bytes:
        return self.text or self.shown  # an empty last segment (`bar\r\r\n`) leaves the bar on screen


class WorkerOutput:
    """One worker's stream: logged byte for byte, cut into lines, shown prefixed, its last lines kept.

    tail() is the worker's last finished lines as a person sees them: a redrawn line once, with its
    final text; a rank's line with torchrun's prefix, `[rank3]:text`, so a failure report can pick
    the failed rank's lines; blank lines of ranks and of redrawn lines left out."""

    def __init__(self, index: int, terminal: Terminal | None, log: io.RawIOBase | None, keep: int = 50):
        self.index = index
        self.terminal = terminal
        self.log = log
        self.pending = b""  # bytes after the last line break or rank header
        self.lines: dict[int | None, _Line] = {}  # unfinished lines by rank; None: the worker's own
        self.rank: int | None = None  # the rank whose line the next bytes continue
        self.last_lines: deque[bytes] = deque(maxlen=keep)

    def feed(self, data: bytes) -> None:
        if self.log:
            self.log.write(data)
        self.pending += data
        consumed = 0
        for match in LINE_BREAK.finditer(self.pending):
            if match.end() == len(self.pending) and match[0] == b"\r":
                break  # it may be the first half of \r\n: wait for the next byte
            self._add(self.pending[consumed:match.start()])
            self._take(match)
            consumed = match.end()
        self.pending = self.pending[consumed:]
        while len(self.pending) >= MAX_LINE:
            self._add(self.pending[:MAX_LINE])
            self.pending = self.pending[MAX_LINE:]
            self._end_line()
        if self.terminal:
            self._show_unfinished()
            self.terminal.flush()

    def close(self) -> None:
        """Show what is left of the unfinished lines, each with its final text."""
        self._add(self.pending.rstrip(b"\r"))
        if self.pending.endswith(b"\r"):
            self._carriage_return()
        self.pending = b""
        for rank in list(self.lines):
            self.rank = rank
            self._end_line()
        if self.terminal:
            self.terminal.flush()

    def tail(self) -> list[str]:
        return [line.decode(errors="replace") for line in self.last_lines]

    def _current(self) -> _Line:
        return self.lines.setdefault(self.rank, _Line())

    def _add(self, text: bytes) -> None:
        if text:
            self._current().text += text

    def _take(self, match: re.Match[bytes]) -> None:
        if match[0] == b"\r":
            self._carriage_return()
        elif match[1] is None:
            self._end_line()
        elif self.rank is None and None in self.lines:  # `[rank3]:` inside a line of the worker's own
            self._add(match[0])
        else:
            self.rank = int(match[1])
            if self.rank not in self.lines and len(self.lines) >= MAX_OPEN_RANKS:
                self._end_line_of(next(rank for rank in self.lines if rank is not None))

    def _show_unfinished(self) -> None:
        """On a live terminal, the current line's text as the terminal would show it: what was written
        since its last carriage return (tqdm writes `\r` then the new state), or else the state before."""
        line = self.lines.get(self.rank)
        if self.terminal and self.terminal.live and line and line.redrawn:
            self.terminal.show_live(self.index, self.rank, line.text + self.pending.rstrip(b"\r") or line.shown)

    def _carriage_return(self) -> None:
        line = self._current()
        line.redrawn = True
        if line.text:
            line.shown, line.text = line.text, b""
        if not self.terminal or not line.shown:
            return
        if self.terminal.live:
            self.terminal.show_live(self.index, self.rank, line.shown)
        elif time.monotonic() - line.since >= PIPE_PROGRESS_S and line.shown.strip():
            line.since = time.monotonic()
            self.terminal.print_line(self.index, self.rank, line.shown)

    def _end_line_of(self, rank: int) -> None:
        """Finish rank `rank`'s line as it stands, then go on with the current rank's."""
        current, self.rank = self.rank, rank
        self._end_line()
        self.rank = current

    def _end_line(self) -> None:
        line, rank = self.lines.pop(self.rank, _Line()), self.rank
        self.rank = None
        text = line.final()
        # a redrawn line left blank was erased; a rank's blank line is mostly a \r that torchrun's
        # --tee turned into a newline
        shown = text if text.strip() or not (line.redrawn or rank is not None) else None
        if shown is not None:
            self.last_lines.append(shown if rank is None else b"[rank%d]:%s" % (rank, shown))
        if self.terminal:
            self.terminal.print_line(self.index, rank, shown)
