"""Worker output: every byte to the worker's log; to the terminal, what a person would see of it.

A worker's stream is cut into lines at newlines. A carriage return starts the line over, as it does
on a terminal, so a progress bar is one line whose text changes; the line is printed once, with its
final text, when its newline arrives. On a live terminal (a tty), the unfinished lines that were
redrawn (one per worker, or per rank) stay in a region at the bottom of the screen, redrawn in place,
and whole lines print above it. In a pipe, such a line also prints its latest text once every
PIPE_PROGRESS_S: a short bar costs one line, and a bar that runs for an hour still shows, in
`podrun exec job.yaml | tee run.txt` or a CI log, that the job is alive. Raw (`--raw`), each redraw
goes out as it comes, ended by its carriage return, and each line with the end it came with (`\r\n`
too): the user's terminal draws the bar, and one worker's output unprefixed is its stream as written.

Under torchrun, each rank's lines and redraws arrive behind a header, `[rankN]:text`
(remote/rank_output.py): they are kept apart per rank and shown as `[w1 r3] text`, each rank with
its own live line; a rank's blank line shows, as a worker's own does. A header may also come in the
middle of a line (as torchrun's own --tee writes a line it read before its end): the line goes on
after the next header of its rank.

Memory and CPU stay bounded whatever the stream: each piece of it is looked at once (what is held
between two pieces is at most a carriage return or the start of a rank header), a line longer than
MAX_LINE shows in pieces of that size, a worker's unfinished lines hold MAX_HELD bytes at most in all
(past that, the oldest shows as it stands), and the last lines kept for a failure report keep only
their last KEPT_LINE bytes.
"""

from __future__ import annotations

import io
import re
import time
from collections import deque

from podrun.stop_noise import StopNoise

# mypy reads the import below; Python skips it
TYPE_CHECKING = False
if TYPE_CHECKING:
    from podrun.terminal import Terminal

# a rank's header (remote/rank_output.py), `[rank3]:`; more digits than any world size has make it text, not a
# header: Python refuses to read an integer of 4,301 digits, and each header names a rank to keep apart
RANK_HEADER = r"\[rank(\d{1,7})\]:"
LINE_BREAK = re.compile(rb"\r\n|\n|\r|" + RANK_HEADER.encode())
# what the end of a piece may hold that the next piece decides: a rank header begun (the longest is 14 bytes)
HEADER_BEGUN = re.compile(rb"\[(?:r(?:a(?:n(?:k(?:\d{1,7}\]?)?)?)?)?)?")
LONGEST_HEADER = len("[rank1234567]:")
# a worker's ranks with an unfinished line at once (each costs a line's state, and a live row); a stream
# naming ever new ranks finishes the oldest one's line as it goes, so memory stays bounded
MAX_OPEN_RANKS = 1024
MAX_LINE = 1 << 16  # a longer run of bytes without a newline is shown in pieces of this size, as rank_output.py's
MAX_HELD = 1 << 20  # the bytes a worker's unfinished lines hold in all (with the text each showed before its `\r`)
KEPT_LINE = 4096  # a line kept for tail() keeps its last bytes: 200 lines of a stream without newlines cost 200 MB
LIVE_TEXT = 4096  # a live row shows the start of its line, cut to the screen's width: no more of it is needed
PIPE_PROGRESS_S = 30.0


class _Line:
    """An unfinished line: the text since its last carriage return, and what it showed before that."""

    __slots__ = ("text", "shown", "redrawn", "since")

    def __init__(self) -> None:
        self.text = bytearray()  # grows in place: a line of many pieces costs their length, not its square
        self.shown = b""
        self.redrawn = False
        self.since = time.monotonic()  # its start, or when a pipe last saw its progress

    def final(self) -> bytes:
        return bytes(self.text) or self.shown  # an empty last segment (`bar\r\r\n`) leaves the bar on screen

    def live(self) -> bytes:
        """What a live row shows of it: what was written since its last carriage return (tqdm writes `\r`
        then the new state), or else the state before; its start only."""
        return bytes(self.text[:LIVE_TEXT]) or self.shown[:LIVE_TEXT]


class WorkerOutput:
    """One worker's stream: logged byte for byte, cut into lines, shown prefixed, its last lines kept.

    tail() is the worker's last finished lines as a person sees them: a redrawn line once, with its
    final text; a rank's line with torchrun's prefix, `[rank3]:text`, so a failure report can pick
    the failed rank's lines; blank lines of ranks and of redrawn lines left out."""

    def __init__(self, index: int, terminal: Terminal | None, log: io.RawIOBase | None, keep: int = 50):
        self.index = index
        self.terminal = terminal
        self.log = log
        self.undecided = b""  # the end of the last piece, which the next decides: a `\r`, or a rank header begun
        self.lines: dict[int | None, _Line] = {}  # unfinished lines by rank; None: the worker's own
        self.held = 0  # the bytes they hold: their text, and what they showed before their last `\r`
        self.rank: int | None = None  # the rank whose line the next bytes continue
        self.last_lines: deque[bytes] = deque(maxlen=keep)
        self.stop_noise = StopNoise()  # what torchrun says of a stop podrun sent, left off the terminal

    def feed(self, data: bytes) -> None:
        if self.log:
            self.log.write(data)
        if self.undecided:
            data = self.undecided + data
        consumed = 0
        for match in LINE_BREAK.finditer(data):
            if match.end() == len(data) and match[0] == b"\r":
                break  # it may be the first half of \r\n: wait for the next byte
            self._add(data[consumed:match.start()])
            self._take(match)
            consumed = match.end()
        decided = _decided(data, consumed)
        self._add(data[consumed:decided])
        self.undecided = data[decided:]
        if self.terminal:
            self._show_unfinished()
            self.terminal.flush()

    def close(self) -> None:
        """Show what is left of the unfinished lines, each with its final text."""
        self._add(self.undecided.rstrip(b"\r"))
        if self.undecided.endswith(b"\r"):
            self._carriage_return()
        self.undecided = b""
        for rank in list(self.lines):
            self.rank = rank
            self._end_line()
        if self.terminal:
            for line in self.stop_noise.rest():
                self.terminal.print_line(self.index, None, line)
            self.terminal.flush()

    def stopping(self) -> None:
        """podrun sent the worker a stop: torchrun's traceback of it need not fill the terminal (stop_noise.py)."""
        self.stop_noise.stopping = True

    def tail(self) -> list[str]:
        return [line.decode(errors="replace") for line in self.last_lines]

    def _current(self) -> _Line:
        return self.lines.setdefault(self.rank, _Line())

    def _add(self, text: bytes) -> None:
        """Text that goes on the current line: a line that reaches MAX_LINE shows, and the rest goes on
        in a line of its own."""
        while text:
            line = self._current()
            piece, text = text[:MAX_LINE - len(line.text)], text[MAX_LINE - len(line.text):]
            line.text += piece
            self.held += len(piece)
            if len(line.text) >= MAX_LINE:
                self._end_line_of(self.rank)
            while self.held > MAX_HELD:  # the current line alone holds 2 * MAX_LINE at most
                self._end_line_of(next(rank for rank in self.lines if rank != self.rank))

    def _take(self, match: re.Match[bytes]) -> None:
        if match[0] == b"\r":
            self._carriage_return()
        elif match[1] is None:
            self._end_line(match[0])
        elif self.rank is None and None in self.lines:  # `[rank3]:` inside a line of the worker's own
            self._add(match[0])
        else:
            self.rank = int(match[1])
            if self.rank not in self.lines and len(self.lines) >= MAX_OPEN_RANKS:
                self._end_line_of(next(rank for rank in self.lines if rank is not None))

    def _show_unfinished(self) -> None:
        """On a live terminal, the current line's text as the terminal would show it."""
        line = self.lines.get(self.rank)
        if self.terminal and self.terminal.live and line and line.redrawn:
            self.terminal.show_live(self.index, self.rank, line.live())

    def _carriage_return(self) -> None:
        line = self._current()
        line.redrawn = True
        drawn = bytes(line.text)
        if drawn:
            self.held -= len(line.shown)
            line.shown, line.text = drawn, bytearray()
        if self.terminal and self.terminal.raw:  # each redraw as written: its text, then its carriage return
            self.terminal.print_redraw(self.index, self.rank, drawn)
        if not self.terminal or self.terminal.raw or not line.shown:
            return
        if self.terminal.live:
            self.terminal.show_live(self.index, self.rank, line.live())
        elif time.monotonic() - line.since >= PIPE_PROGRESS_S and line.shown.strip():
            line.since = time.monotonic()
            self.terminal.print_line(self.index, self.rank, line.shown)

    def _end_line_of(self, rank: int | None) -> None:
        """Finish rank `rank`'s line as it stands, then go on with the current rank's."""
        current, self.rank = self.rank, rank
        self._end_line()
        self.rank = current

    def _end_line(self, ending: bytes = b"\n") -> None:
        """Finish the current line, which `ending` ended (or its length, or the stream's end)."""
        line, rank = self.lines.pop(self.rank, None) or _Line(), self.rank
        self.rank = None
        self.held -= len(line.text) + len(line.shown)
        text = line.final()
        # a redrawn line left blank was erased; a rank's blank line shows as the worker's own does
        # (rank_output.py passes a \r on as a \r), but a failure report's last lines of the rank,
        # whose last one may be its cause (launch/steps.py), leave it out
        shown = text if text.strip() or not line.redrawn else None
        if shown is not None and (rank is None or shown.strip()):
            kept = shown if len(shown) <= KEPT_LINE else b"..." + shown[-KEPT_LINE:]
            self.last_lines.append(kept if rank is None else b"[rank%d]:%s" % (rank, kept))
        if self.terminal and self.terminal.raw:  # as written: after its redraws, what followed the last
            self.terminal.print_line(self.index, rank, (bytes(line.text) if line.redrawn else text) + ending)
        elif self.terminal and rank is None and shown is not None:
            for each in self.stop_noise.take(shown):
                self.terminal.print_line(self.index, None, each)
        elif self.terminal:
            self.terminal.print_line(self.index, rank, shown)


def _decided(data: bytes, start: int) -> int:
    """Where the end of data that the next piece decides begins (len(data): none), after `start`: a
    carriage return at the very end (perhaps half of \\r\\n), or a rank header begun."""
    if data.endswith(b"\r"):
        return len(data) - 1
    begun = data.rfind(b"[", max(start, len(data) - LONGEST_HEADER))
    return begun if begun >= 0 and HEADER_BEGUN.fullmatch(data, begun) else len(data)
