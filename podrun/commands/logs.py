"""`podrun logs`: a job's output from the job store, now or while it runs (brought there from where it runs
first: handles/)."""

from __future__ import annotations

import os
import re
import time

from podrun import exits, jobstore, paths
from podrun.collapse import Collapse
from podrun.errors import PodrunError, UsageError
from podrun.handles import handle_for
from podrun.output import counted, say, say_failure, say_phase, say_success
from podrun.terminal import Terminal
from podrun.worker_output import RANK_HEADER, WorkerOutput

FOLLOW_POLL_S = 0.1
READ_SIZE = 1 << 16
# a collapsing replay reads this much of the logs a round, a piece of each (at least MIN_PIECE), and a
# line read joins the same line read in its round or the next (_replay)
ROUND_BYTES = 1 << 22
MIN_PIECE = 1 << 12
REPLAY_WINDOW_ROUNDS = 2
# the worker's own lines after its ranks' last (torchrun's report of a stop) are looked for this far
# back from a log's end: a stop's tracebacks take a few KB, and a log without ranks is not read whole
RANK_SCAN_BYTES = 1 << 20
RANK_HEADER_IN_LOG = re.compile(RANK_HEADER.encode())
TYPE_CHECKING = False  # mypy reads the import below; Python skips it (collections.abc would slow `podrun logs`)
if TYPE_CHECKING:
    from collections.abc import Iterator


def show_logs(job: str | None, worker: int | None, follow: bool, tail: int | None, attempt: int | None = None,
              collapse: bool = True, raw: bool = False) -> int:
    """`job`: an id, an id's beginning or a name; none: the newest running job, else the newest job.
    `attempt`: an earlier attempt's output (kept locally), else the current attempt's. `collapse`: the
    same line of several workers shown once (collapse.py), unless one worker is shown. `raw`: the
    output as written, escape sequences and all (escapes.py)."""
    handle = handle_for(jobstore.find(job) if job else newest_running_or_newest())
    record = handle.record
    flags = {"--worker": worker, "--tail": tail, "--attempt": attempt}
    there = handle.run_there(["logs", record.id, *(["--follow"] if follow else []), *([] if collapse else ["--no-collapse"]),
                              *(["--raw"] if raw else []),
                              *(word for flag, value in flags.items() if value is not None for word in (flag, str(value)))],
                             raw)
    if there is not None:
        return there
    if attempt is not None and attempt != record.attempt:
        return _show_earlier_attempt(record, attempt, worker, tail, collapse, raw)
    chosen = _chosen(record, worker)
    terminal = _replay_terminal(record, chosen, worker, collapse, raw)
    outputs = {index: WorkerOutput(index, terminal, log=None) for index in chosen}
    handle.catch_up(chosen)
    offsets = _replay({index: record.log_path(index) for index in chosen}, tail, outputs, terminal)
    if terminal.collapse:  # what comes next, as it comes: lines of the same moment meet within WINDOW_S
        terminal.collapse = Collapse(chosen)
    if follow:  # what came meanwhile; then, where the job's output comes from where it runs, the rest from there
        for index in chosen:
            offsets[index] = _copy_new(record.log_path(index), offsets[index], outputs[index])
        if handle.follow_there(chosen, outputs):
            return _ended(handle.reload())
    attempt = record.attempt
    while True:
        finished = not handle.writing()  # read before the logs: no lost tail
        for index in chosen:
            offsets[index] = _copy_new(record.log_path(index, attempt), offsets[index], outputs[index])
        if not follow or finished:
            break
        terminal.flush()  # lines held whose window ended while nothing new came
        time.sleep(FOLLOW_POLL_S)
        record = handle.reload()
        if record.attempt != attempt:  # the job restarted: the rest of this attempt's output, then the next's
            for index in chosen:
                _copy_new(record.log_path(index, attempt), offsets[index], outputs[index])
            attempt, offsets = record.attempt, dict.fromkeys(chosen, 0)
            say_phase(f"attempt {attempt}")
    for output in outputs.values():
        output.close()
    terminal.release()
    return _ended(record) if follow else 0


def _show_earlier_attempt(record: jobstore.JobRecord, attempt: int, worker: int | None, tail: int | None,
                          collapse: bool, raw: bool) -> int:
    if attempt > record.attempt:
        raise UsageError(f"--attempt {attempt}: job {record.id} has attempts 0 to {record.attempt}")
    chosen = _chosen(record, worker)
    terminal = _replay_terminal(record, chosen, worker, collapse, raw)
    outputs = {index: WorkerOutput(index, terminal, log=None) for index in chosen}
    _replay({index: record.log_path(index, attempt) for index in chosen}, tail, outputs, terminal)
    for output in outputs.values():
        output.close()
    terminal.release()
    ended = record.attempts[attempt]
    say(f"attempt {attempt} of job {record.id} {ended['state']}" + (f": {ended['summary']}" if ended["summary"] else ""))
    return 0


def _chosen(record: jobstore.JobRecord, worker: int | None) -> list[int]:
    """The workers whose logs are shown: `worker` (--worker), else every one."""
    indexes = [w.index for w in record.workers]
    if worker is not None and worker not in indexes:
        raise UsageError(f"--worker {worker}: job {record.id} has workers {', '.join(map(str, indexes))}")
    return [worker] if worker is not None else indexes


def _ended(record: jobstore.JobRecord) -> int:
    """A followed job's last word: its outcome, and its exit code as the exit code of `logs -f`: that of
    `exec` for the same end (a job stopped by `podrun stop` gives 143, as its launcher would have)."""
    state = record.current_state()
    if state == jobstore.RUNNING:  # a detached job whose workers could not all be reached
        return 0
    {jobstore.SUCCEEDED: say_success, jobstore.STOPPED: say}.get(state, say_failure)(record.outcome())
    return record.exit_code if record.exit_code is not None else exits.LOST


def newest_running_or_newest() -> jobstore.JobRecord:
    records = jobstore.all_jobs()
    if not records:
        raise PodrunError(f"no jobs yet in {paths.jobs_dir()}; start one with `podrun exec JOB.yaml`")
    return next((record for record in records if record.current_state() == jobstore.RUNNING), records[0])


class _Rounds:
    """The clock of a replay's collapse: how many rounds of reading every worker's log are done (_replay)."""

    def __init__(self) -> None:
        self.done = 0

    def __call__(self) -> float:
        return self.done


def _replay_terminal(record: jobstore.JobRecord, chosen: list[int], worker: int | None, collapse: bool,
                     raw: bool) -> Terminal:
    """The terminal a replay of the `chosen` workers' logs shows on: prefixed unless one `worker` was
    asked for, collapsing (with a clock that counts rounds of reading) unless one was or `collapse` is off."""
    return Terminal(prefixed=worker is None, worker_count=len(record.workers), raw=raw,
                    collapse=Collapse(chosen, REPLAY_WINDOW_ROUNDS, _Rounds()) if collapse and worker is None else None)


def _replay(paths: dict[int, str], tail: int | None, outputs: dict[int, WorkerOutput], terminal: Terminal) -> dict[int, int]:
    """Show each worker's log (its last `tail` lines: _tail_segments); returns the offsets of their ends.
    One worker's log after another's; collapsing, all at once, a piece of each in turn (ROUND_BYTES in
    all a round): the same line of several workers, at about the same offset in each log, is read within
    the same round or the next, and meets in one group, whatever the logs' size (a replay is faster than
    any window of time)."""
    rounds = terminal.collapse.clock if terminal.collapse else None
    piece = max(MIN_PIECE, ROUND_BYTES // len(paths)) if isinstance(rounds, _Rounds) else READ_SIZE
    feeds = {index: _pieces(path, _tail_segments(path, tail, index), outputs[index], piece)
             for index, path in paths.items()}
    offsets: dict[int, int] = {}
    for reading in [list(feeds)] if isinstance(rounds, _Rounds) else [[index] for index in feeds]:
        while reading:
            for index in list(reading):
                if (offset := next(feeds[index], None)) is None:
                    reading.remove(index)
                else:
                    offsets[index] = offset
            if isinstance(rounds, _Rounds):
                rounds.done += 1
                terminal.flush()
    terminal.release()
    return offsets


def _pieces(path: str, segments: list[tuple[int, int | None, str | None]], output: WorkerOutput,
            piece: int) -> Iterator[int]:
    """Feed the segments of the log to the output a piece at a time (opening the log for each: a replay
    of many workers holds no file open), yielding the offset reached after each."""
    for start, end, note in segments:
        if note:
            say(note)
        offset = start
        yield offset
        while (reached := _copy_new(path, offset, output, offset + piece if end is None else min(end, offset + piece))) \
                != offset:
            offset = reached
            yield offset


def _tail_segments(path: str, tail: int | None, index: int) -> list[tuple[int, int | None, str | None]]:
    """What a replay shows of a log: the last `tail` lines (all of it with None), as (from, to (None: the
    end), what podrun says first). Under torchrun, where the ranks' lines are marked, the lines of the
    worker's own after the ranks' last (torchrun's report of a stop or a failure: a traceback per agent)
    do not push the ranks' last lines out: the `tail` lines before them show first, then the last `tail`
    of them."""
    start = _start_offset(path, tail)
    if tail and (own_from := _own_lines_from(path)) is not None and start > own_from:
        return [(_start_offset(path, tail, end=own_from), own_from, None),
                (start, None, f"w{index}: {counted(_lines_between(path, own_from, start), 'line')} after its ranks' "
                              f"last lines not shown; the last {tail}:")]
    return [(start, None, None)]


def _own_lines_from(path: str) -> int | None:
    """Where the worker's own lines after its ranks' last line begin (found in the log's last
    RANK_SCAN_BYTES); None if the log ends with a rank's line or holds no rank line there."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            begin = max(0, size - RANK_SCAN_BYTES)
            handle.seek(begin)
            text = handle.read()
    except OSError:
        return None
    headers = list(RANK_HEADER_IN_LOG.finditer(text))
    if not headers:
        return None
    line_end = text.find(b"\n", headers[-1].end())
    return begin + line_end + 1 if 0 <= line_end < len(text) - 1 else None


def _lines_between(path: str, start: int, end: int) -> int:
    with open(path, "rb") as handle:
        handle.seek(start)
        return handle.read(end - start).count(b"\n")


def _start_offset(path: str, tail: int | None, end: int | None = None) -> int:
    """0, or the offset where the last `tail` lines of the file (of its first `end` bytes) begin, as a
    person counts lines: a line redrawn with \\r (a progress bar) is one, and so is a last line without \\n."""
    if tail is None or not os.path.exists(path):
        return 0
    with open(path, "rb") as handle:
        end = position = handle.seek(0, os.SEEK_END) if end is None else end
        if tail == 0:
            return end
        while position > 0:
            size = min(READ_SIZE, position)
            position -= size
            handle.seek(position)
            block = handle.read(size)
            # the final newline ends the last line, it does not start one
            newline = len(block) - 1 if position + size == end and block.endswith(b"\n") else len(block)
            while (newline := block.rfind(b"\n", 0, newline)) >= 0:
                tail -= 1
                if tail == 0:
                    return position + newline + 1
        return 0


def _copy_new(path: str, offset: int, output: WorkerOutput, end: int | None = None) -> int:
    """Feed what the log gained since `offset` (up to `end`) to the output; returns the new offset."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return offset
    with handle:
        handle.seek(offset)
        while chunk := handle.read(READ_SIZE if end is None else min(READ_SIZE, end - offset)):
            output.feed(chunk)
            offset += len(chunk)
    return offset
