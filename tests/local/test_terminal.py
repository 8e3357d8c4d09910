"""What a person sees of the workers' output: on a terminal (a screen model, and a real pty running
`podrun exec`), and in a pipe. Progress bars redraw in place, prefixes line up, colour obeys NO_COLOR."""

from __future__ import annotations

import io
import re
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podrun import terminal, worker_output
from podrun.output import say, say_failure, say_phase, say_success
from podrun.terminal import Terminal
from podrun.worker_output import PIPE_PROGRESS_S, WorkerOutput

from helpers import examples, job_id_in, podrun, run_in_terminal

ESCAPE = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\r|\n|[^\x1b\r\n]")


class Screen:
    """A terminal's screen as a person sees it: `rows` lines on screen, the scrolled-off ones above.
    It knows what podrun may write to a terminal: \\r, \\n (as a tty's default onlcr makes it \\r\\n),
    cursor up and down (CSI n A / B), erase line (CSI K, CSI 2K), erase below (CSI J) and colours
    (CSI m); anything else fails the test."""

    def __init__(self, rows: int = 24, columns: int = 80):
        self.columns = columns
        self.lines = [""] * rows
        self.scrollback: list[str] = []
        self.y = self.x = 0
        self.wrapped = 0

    def feed(self, data: bytes) -> Screen:
        for match in ESCAPE.finditer(data.decode()):
            token, parameter, command = match[0], match[1], match[2]
            if command:
                self._control(parameter, command)
            elif token == "\r":
                self.x = 0
            elif token == "\n":
                self.x = 0
                self._down()
            else:
                self._put(token)
        return self

    def text(self) -> list[str]:
        """Every line ever shown that still holds text, scrollback first."""
        return [line.rstrip() for line in self.scrollback + self.lines if line.strip()]

    def _control(self, parameter: str, command: str) -> None:
        if command == "A":
            self.y = max(0, self.y - int(parameter or 1))
        elif command == "B":
            self.y = min(len(self.lines) - 1, self.y + int(parameter or 1))
        elif command == "K":
            self.lines[self.y] = "" if parameter == "2" else self.lines[self.y][:self.x]
        elif command == "J" and parameter in ("", "0"):
            self.lines[self.y] = self.lines[self.y][:self.x]
            self.lines[self.y + 1:] = [""] * (len(self.lines) - self.y - 1)
        else:
            assert command == "m", f"unexpected escape sequence CSI {parameter}{command}"

    def _put(self, char: str) -> None:
        if self.x == self.columns:
            self.wrapped += 1
            self.x = 0
            self._down()
        line = self.lines[self.y].ljust(self.x)
        self.lines[self.y] = line[:self.x] + char + line[self.x + 1:]
        self.x += 1

    def _down(self) -> None:
        if self.y == len(self.lines) - 1:
            self.scrollback.append(self.lines.pop(0))
            self.lines.append("")
        else:
            self.y += 1


class TtyBytes(io.BytesIO):
    """A stream that says it is a terminal (80 x 24: podrun's size when it cannot ask)."""

    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def colour_terminal(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setattr(Terminal, "showing", None)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(terminal, "time", fake)
    monkeypatch.setattr(worker_output, "time", fake)
    return fake


def feed_bar(worker: WorkerOutput, clock: Clock, steps: int, seconds_per_step: float) -> None:
    for step in range(1, steps + 1):
        worker.feed(b"\rtraining %3d%%" % (100 * step // steps))
        clock.now += seconds_per_step


def test_a_progress_bar_is_one_line_redrawn_in_place(clock):
    stream, log = TtyBytes(), io.BytesIO()
    worker = WorkerOutput(0, Terminal(stream, worker_count=2), log)
    worker.feed(b"epoch 1\n")
    feed_bar(worker, clock, steps=200, seconds_per_step=0.005)
    epoch, live = Screen().feed(stream.getvalue()).text()
    assert epoch == "[w0] epoch 1" and re.fullmatch(r"\[w0\] training  9\d%", live)  # at most 0.1 s behind
    worker.feed(b"\n")
    screen = Screen().feed(stream.getvalue())
    assert screen.text() == ["[w0] epoch 1", "[w0] training 100%"] and screen.scrollback == []
    assert stream.getvalue().count(b"\x1b[2K") <= 10  # one second of a 200-step bar: 10 redraws at most
    assert log.getvalue().count(b"\r") == 200  # the log keeps every byte
    assert worker.tail() == ["epoch 1", "training 100%"]


def test_whole_lines_print_above_the_live_lines_of_other_workers(clock):
    stream = TtyBytes()
    terminal = Terminal(stream, worker_count=3)
    bar, chatty, other_bar = (WorkerOutput(index, terminal, None) for index in range(3))
    bar.feed(b"\r 40%|####      |")
    other_bar.feed(b"\r 10%|#         |")
    chatty.feed(b"step 1\nstep 2\n")
    assert Screen().feed(stream.getvalue()).text() == [
        "[w1] step 1", "[w1] step 2", "[w0]  40%|####      |", "[w2]  10%|#         |"]
    clock.now += 1
    bar.feed(b"\r100%|##########|\n")
    other_bar.close()
    assert Screen().feed(stream.getvalue()).text() == [
        "[w1] step 1", "[w1] step 2", "[w0] 100%|##########|", "[w2]  10%|#         |"]


def test_a_live_line_is_cut_to_the_screen_width_so_it_never_wraps(clock):
    stream = TtyBytes()
    worker = WorkerOutput(0, Terminal(stream), None)
    worker.feed("\r{}| 3/7 ▕████▏".format("字" * 30 + "#" * 300).encode())
    screen = Screen().feed(stream.getvalue())
    assert screen.wrapped == 0 and screen.text() == ["[w0] " + "字" * 30 + "#" * 14]
    worker.feed(b"\n")  # the finished line is printed whole: the terminal wraps it, as any long line
    assert Screen().feed(stream.getvalue()).text()[-1].endswith("| 3/7 ▕████▏")


def test_more_live_lines_than_the_screen_holds_are_summarised(clock):
    stream = TtyBytes()
    terminal = Terminal(stream, worker_count=30)
    for index in range(30):
        WorkerOutput(index, terminal, None).feed(b"\rloading %d" % index)
    rows = Screen().feed(stream.getvalue()).text()
    assert rows[0] == "[w0]  loading 0" and rows[-2] == "[w20] loading 20"
    assert rows[-1] == "... and 9 more live lines" and len(rows) == 22


def test_podruns_own_messages_print_above_the_live_lines(clock, monkeypatch):
    stream = TtyBytes()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(stream, write_through=True))
    worker = WorkerOutput(0, Terminal(stream, worker_count=2), None)
    worker.feed(b"\r 40%")
    say("SIGINT: stopping the job on every worker (again to exit at once)")
    assert Screen().feed(stream.getvalue()).text() == [
        "podrun: SIGINT: stopping the job on every worker (again to exit at once)", "[w0]  40%"]


def test_a_pipe_gets_plain_lines_with_each_redrawn_line_once(clock):
    stream = io.BytesIO()
    terminal = Terminal(stream, worker_count=2)
    worker, other = WorkerOutput(0, terminal, None), WorkerOutput(1, terminal, None)
    worker.feed(b"epoch 1\n\r\r")
    feed_bar(worker, clock, steps=200, seconds_per_step=0.01)
    other.feed(b"\n\rloss 0.3\r\n")
    worker.feed(b"\r\n\rerased soon\r            \r\n")
    worker.close()
    assert stream.getvalue() == b"[w0] epoch 1\n[w1] \n[w1] loss 0.3\n[w0] training 100%\n"


def test_in_a_pipe_a_long_running_bar_shows_its_progress_every_30_seconds(clock):
    stream = io.BytesIO()
    worker = WorkerOutput(0, Terminal(stream), None)
    feed_bar(worker, clock, steps=100, seconds_per_step=PIPE_PROGRESS_S / 40)  # 75 seconds in all
    worker.feed(b"\n")
    assert stream.getvalue() == b"[w0] training  40%\n[w0] training  80%\n[w0] training 100%\n"


def test_prefixes_are_padded_to_the_widest_worker():
    stream = io.BytesIO()
    terminal = Terminal(stream, worker_count=12)
    for index in (1, 11):
        WorkerOutput(index, terminal, None).feed(b"ready\n")
    assert stream.getvalue() == b"[w1]  ready\n[w11] ready\n"


@pytest.mark.parametrize("variable, value, colour, live", [
    (None, None, True, True), ("NO_COLOR", "1", False, True), ("NO_COLOR", "", True, True),
    ("TERM", "dumb", False, False)])
def test_colour_and_redrawing_follow_no_color_and_term(monkeypatch, variable, value, colour, live):
    if variable:
        monkeypatch.setenv(variable, value)
    stream = TtyBytes()
    worker = WorkerOutput(1, Terminal(stream), None)
    worker.feed(b"\r 50%")
    worker.feed(b"\r100%\n")
    assert (b"\x1b[33m[w1]\x1b[0m 100%\n" in stream.getvalue()) is colour
    assert (b"\x1b[1A" in stream.getvalue()) is live
    assert Screen().feed(stream.getvalue()).text() == ["[w1] 100%"]
    if not colour and not live:
        assert stream.getvalue() == b"[w1] 100%\n"


class TtyText(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stderr, no_color, coloured", [
    (TtyText, "", True), (TtyText, "yes", False), (io.StringIO, "", False)])
def test_success_failure_and_phases_stand_out_on_a_colour_terminal(monkeypatch, stderr, no_color, coloured):
    monkeypatch.setattr(sys, "stderr", stderr())
    monkeypatch.setenv("NO_COLOR", no_color)
    say_phase("run", "2 workers")
    say_success("job j-1 succeeded in 8.0s")
    say_failure("job j-1 failed: worker 1 exited with code 3 in run")
    say("plain")
    lines = [
        ("2", "podrun: ── run (2 workers) ──"), ("1;32", "podrun: job j-1 succeeded in 8.0s"),
        ("1;31", "podrun: job j-1 failed: worker 1 exited with code 3 in run")]
    expected = [f"\x1b[{style}m{text}\x1b[0m" if coloured else text for style, text in lines] + ["podrun: plain"]
    assert sys.stderr.getvalue().splitlines() == expected


# what torchrun 2.13 --tee=3 writes with TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:' for two
# ranks drawing a `\r` bar: its TailLog reads each rank's file in text mode, so every \r comes out as
# a newline (the empty `[rankN]:` lines, which show as the blank lines they now are: podrun runs each rank
# behind rank_output.py, which keeps a \r, so a rank's blank line is the job's own), and a line read before
# its end is written without it, the next rank's line following on the same line
TORCHRUN_TEE = (b"[rank0]:hello from rank 0\n[rank0]:\n[rank0]:step 0%|    |\n[rank0]:step 5%|#   |"
                b"[rank1]:hello from rank 1\n[rank1]:\n[rank1]:step 0%|    |\n"
                b"[rank0]:\n[rank0]:step 100%|####|\n[rank0]:done 0\n"
                b"W1123 20:38:04.393000 6464 torch/distributed/run.py:874] *****\n"
                b"[rank1]:step 100%|####|\n[rank1]:done 1\n")


def test_torchrun_rank_lines_carry_worker_and_rank_and_never_share_a_line():
    stream = io.BytesIO()
    worker = WorkerOutput(1, Terminal(stream, worker_count=2), None)
    for chunk in re.split(rb"(?<=\|)(?=\[rank1\])|(?<=\n)(?=W1123)", TORCHRUN_TEE):
        worker.feed(chunk)
    assert stream.getvalue().decode().splitlines() == [
        "[w1 r0] hello from rank 0", "[w1 r0] ", "[w1 r0] step 0%|    |",
        "[w1 r1] hello from rank 1", "[w1 r1] ", "[w1 r1] step 0%|    |",
        "[w1 r0] step 5%|#   |", "[w1 r0] step 100%|####|", "[w1 r0] done 0",
        "[w1]    W1123 20:38:04.393000 6464 torch/distributed/run.py:874] *****",
        "[w1 r1] step 100%|####|", "[w1 r1] done 1"]
    assert worker.tail()[-4:] == [
        "[rank0]:done 0", "W1123 20:38:04.393000 6464 torch/distributed/run.py:874] *****",
        "[rank1]:step 100%|####|", "[rank1]:done 1"]


def test_each_rank_has_its_own_live_line(clock):
    stream = TtyBytes()
    terminal = Terminal(stream, worker_count=2)
    worker = WorkerOutput(1, terminal, None)
    worker.feed(b"[rank2]:10%\r[rank2]:20%\r[rank3]:5%\r30%\r")
    WorkerOutput(0, terminal, None).feed(b"[rank1]:loaded\n")
    assert Screen().feed(stream.getvalue()).text() == ["[w0 r1] loaded", "[w1 r2] 20%", "[w1 r3] 30%"]
    worker.close()
    assert Screen().feed(stream.getvalue()).text() == ["[w0 r1] loaded", "[w1 r2] 20%", "[w1 r3] 30%"]
    assert worker.tail() == ["[rank2]:20%", "[rank3]:30%"]


@settings(max_examples=examples(200))
@given(st.lists(st.sampled_from([b"a", b"bar 50%", b" ", b"\r", b"\n", b"\r\n"]), max_size=20),
       st.lists(st.integers(0, 40), max_size=4))
def test_raw_unprefixed_output_is_the_stream_as_written_in_any_pieces(tokens, cuts):
    """`logs --raw --worker I`: every carriage return where the job wrote it (a stream ends with its line)."""
    whole = b"".join(tokens) + b"\n"
    stream = io.BytesIO()
    worker = WorkerOutput(0, Terminal(stream, prefixed=False, raw=True), None)
    for start, end in zip([0, *sorted(cuts)], [*sorted(cuts), len(whole)]):
        worker.feed(whole[start:end])
    worker.close()
    assert stream.getvalue() == whole


def test_raw_prefixes_each_redraw_and_keeps_its_carriage_return():
    stream = io.BytesIO()
    worker = WorkerOutput(1, Terminal(stream, worker_count=2, raw=True), None)
    worker.feed(b"[rank3]:step 1\r[rank3]:step 2\r[rank3]:step 3\n[rank3]:done\r\n")
    assert stream.getvalue() == b"[w1 r3] step 1\r[w1 r3] step 2\r[w1 r3] step 3\n[w1 r3] done\r\n"
    assert worker.tail() == ["[rank3]:step 3", "[rank3]:done"]  # a failure report's lines, as without --raw


def test_a_rank_header_inside_a_workers_own_line_is_text():
    stream = io.BytesIO()
    WorkerOutput(0, Terminal(stream, prefixed=False), None).feed(b"see [rank1]: below\n[rank1]:below\n")
    assert stream.getvalue() == b"see [rank1]: below\n[r1] below\n"


BAR = """
import sys, time
for step in range(1, 201):
    sys.stdout.write("\\rtraining %5.1f%%|%-20s| %d/200" % (step / 2, "#" * (step // 10), step))
    sys.stdout.flush()
    time.sleep(0.005)
print()
print("done")
"""
# both workers print the same: each line shows once, with both (podrun/collapse.py)
FINAL_LINES = sorted(f"[w0-1] {text}" for text in ("training 100.0%|####################| 200/200", "done"))


@pytest.mark.slow
def test_exec_on_a_terminal_redraws_the_bars_in_place(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: python3 bar.py\n", files={"bar.py": BAR})
    code, written = run_in_terminal(["exec", spec], rows=24, columns=200)
    screen = Screen(rows=24, columns=200).feed(written)
    assert code == 0, screen.text()
    assert sorted(line for line in screen.text() if line.startswith("[w")) == FINAL_LINES
    assert screen.scrollback == []  # the bars' 400 states did not scroll the screen
    assert re.search(rb"\x1b\[\d+A", written)  # they were drawn in place while they ran


@pytest.mark.slow
def test_exec_in_a_pipe_prints_each_bar_once_without_escape_codes(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: python3 bar.py\n", files={"bar.py": BAR})
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout + result.stderr
    assert sorted(result.stdout.splitlines()) == FINAL_LINES


def test_a_huge_redrawn_line_costs_its_live_row_only_its_start(clock):
    stream = TtyBytes()
    terminal = Terminal(stream)
    worker = WorkerOutput(0, terminal, None)
    worker.feed(b"10%\r")
    for _ in range(3):  # 48 KB, no line end (under MAX_LINE)
        worker.feed(b"x" * 16384)
        clock.now += 1
    assert list(terminal.live_lines.values()) == [b"x" * worker_output.LIVE_TEXT]
    assert Screen().feed(stream.getvalue()).text() == ["[w0] " + "x" * 74]  # cut to the 80 columns


TQDM_LIKE = """
import sys
print("epoch 1")
for step in range(1, 4):
    sys.stdout.write(f"\\rtraining {step}/3 " + "#" * step)
    sys.stdout.flush()
print()
print("done")
"""


def test_logs_raw_keeps_a_bars_carriage_returns_as_the_job_wrote_them(home, job_file):
    spec = job_file(f"target: {{local: {{workers: 1}}}}\nrun: {sys.executable} bar.py\n", files={"bar.py": TQDM_LIKE})
    run = podrun("exec", spec, "--raw", text=False)
    assert run.returncode == 0, run.stderr
    job_id = job_id_in(run.stderr.decode())
    written = b"epoch 1\n\rtraining 1/3 #\rtraining 2/3 ##\rtraining 3/3 ###\ndone\n"
    assert (home / "jobs" / job_id / "w0.log").read_bytes() == written
    # each redraw behind its worker's prefix, as the job's own \r ended it
    prefixed = b"[w0] epoch 1\n[w0] \r[w0] training 1/3 #\r[w0] training 2/3 ##\r[w0] training 3/3 ###\n[w0] done\n"
    assert run.stdout == prefixed
    assert podrun("logs", job_id, "--raw", text=False).stdout == prefixed
    assert podrun("logs", job_id, "--raw", "--worker", "0", text=False).stdout == written
    assert podrun("logs", job_id, text=False).stdout == b"[w0] epoch 1\n[w0] training 3/3 ###\n[w0] done\n"
    # on a terminal, the terminal itself redraws the bar: one line, in its final state
    code, shown = run_in_terminal(["logs", job_id, "--raw"], rows=24, columns=80)
    assert code == 0, shown
    assert [line for line in Screen().feed(shown).text() if "[w0]" in line] == [
        "[w0] epoch 1", "[w0] training 3/3 ###", "[w0] done"]
    assert b" training 1/3 #\r" in shown and b" training 2/3 ##\r" in shown  # the job's carriage returns reached it
