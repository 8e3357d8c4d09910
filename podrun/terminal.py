"""The terminal that shows workers' lines: whole lines, and on a live terminal (a tty) the unfinished
lines that were redrawn (one per worker, or per rank) in a region at the bottom of the screen, redrawn
in place, with whole lines printed above it (worker_output.py cuts a worker's stream into them).
"""

from __future__ import annotations

import io
import itertools
import os
import sys
import time

from podrun import escapes
from podrun.collapse import Collapse, Group
from podrun.output import colour_wanted, worker_ranges

# mypy reads the import below; Python skips it: collections.abc would cost `podrun logs` 0.2 ms
TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable
    from typing import BinaryIO

# a live line is redrawn at most this often, so a fast bar costs the terminal nothing; a newer text
# waits for the next output of any worker (as with tqdm's own mininterval, the bar may lag a step)
MIN_REDRAW_S = 0.1
COLOURS = (36, 33, 35, 32, 34, 31)
MORE_ROWS = (-1, None)  # the region's last row when more lines are live than fit the screen
STATUS = (-2, None)  # podrun's own live line (a stop's countdown), below the workers' live lines
MIN_TIMER_S = 0.005  # a timer for a group due now waits this little: one set for 0 s could fire early, again and again
Row = tuple[int, int | None] | Group  # a live region's row: a worker's (or rank's) live line, or a group held


class Terminal:
    """Where workers' lines are shown: whole lines, and on a tty the live region below them. If its
    reader goes away (`podrun exec job.yaml | head`), it shows nothing more and calls on_closed;
    without one, the BrokenPipeError goes to the caller. worker_count pads every prefix to the widest.

    With `collapse` (collapse.py), finished lines are held in groups and each group shows once, with
    its workers' range, when it is due. On a live terminal a group held shows at once as a row of the
    live region, its range growing in place as workers join it; in a pipe it goes out when it is due,
    which a timer sees to while an event loop runs (podrun logs flushes as it polls).

    Workers' lines are made harmless for the terminal (escapes.py) unless `raw`; a live row always is:
    it is podrun's drawing, and one escape sequence in it would break the region. Raw, there is no live
    region: a redraw goes out as the worker wrote it (print_redraw), and the terminal draws it itself."""

    showing: Terminal | None = None  # the terminal whose live region is on the screen, or which holds lines, now

    def __init__(self, stream: io.BufferedIOBase | BinaryIO | None = None, prefixed: bool = True,
                 worker_count: int = 1, collapse: Collapse | None = None, raw: bool = False):
        self.stream = stream or sys.stdout.buffer
        self.prefixed = prefixed
        self.raw = raw
        self.colour = colour_wanted(self.stream)
        # raw: no live region; a redraw goes out as written (print_redraw), and the terminal draws it
        self.live = not raw and self.stream.isatty() and os.environ.get("TERM") != "dumb"
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
        return self._coloured(self._widened(index, rank), index)

    def _widened(self, index: int, rank: int | None) -> str:
        """The label's text, `[w1 r3]`, with the column widened to it."""
        text = f"[w{index}]" if rank is None else f"[w{index} r{rank}]" if self.prefixed else f"[r{rank}]"
        if len(text) > self.label_width:
            self.label_width = len(text)
        return text

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
        key = (index, rank)
        if self.live_lines.pop(key, None) is not None or (text is not None and not self.collapse):
            self._lift()
        self.drawn_at.pop(key, None)  # a rank's row is gone for good: its line ended
        self.stale.discard(key)
        if text is None:
            return
        if not self.raw:
            text = escapes.shown(text, self.colour)
        if not self.collapse:
            self.pending.append(self.label(index, rank) + self._ended(text))
            return
        if rank is not None or self.prefixed:
            self._widened(index, rank)  # the column is as wide as without collapsing
        group, new = self.collapse.add(key, text)
        if self.collapse.crowded:  # a flood of lines between two flushes: memory stays bounded
            self._show_groups(self.collapse.due())
        if not self.live:
            return
        if new:
            self.unshown.append(group)
        elif group in self.rows:
            self.stale.add(group)

    def print_redraw(self, index: int, rank: int | None, text: bytes) -> None:
        """Raw: the unfinished line of worker `index` (rank `rank`) was redrawn with `text`; it shows (or,
        collapsing, is held) as a finished line does, ended by the carriage return the worker wrote."""
        self.print_line(index, rank, text + b"\r")

    def _ended(self, text: bytes) -> bytes:
        """A line's text and its end: a newline; raw, the line end it came with (a redraw's carriage return,
        \\r\\n), which worker_output.py leaves on it."""
        return text if self.raw and text.endswith((b"\r", b"\n")) else text + b"\n"

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
            self.pending.append(self.group_label(group) + self._ended(group.text))
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

