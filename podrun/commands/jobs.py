"""`podrun logs`, `podrun jobs` and `podrun stop`: read the job store, now or while a job runs."""

from __future__ import annotations

import json
import os
import re
import time

from podrun import exits, jobstore, paths
from podrun.collapse import Collapse
from podrun.countdown import Countdown
from podrun.errors import PodrunError, UsageError
from podrun.output import (
    RANK_HEADER,
    Terminal,
    WorkerOutput,
    counted,
    duration_text,
    print_table,
    say,
    say_failure,
    say_phase,
    say_success,
)

DEFAULT_JOBS_SHOWN = 20
HEADER = ("ID", "NAME", "TARGET", "STATE", "EXIT CODES", "STARTED", "DURATION")
# what gives way when the table is wider than the terminal, {column: how narrow it may get}, group by
# group: the name and the id (the wider of the two first, the name on a tie: the id begins with it),
# then (after a running job's idle time, left out: _table) the exit codes; then whole columns, the
# least needed first (the id begins with the name), each giving the others their room back; then the
# id and the state are cut further
SHRINKABLE = ({"NAME": 4, "ID": 12}, {"EXIT CODES": len("EXIT CODES")})
DROPPABLE = ("STARTED", "NAME", "DURATION", "TARGET")
LAST_RESORT = {"ID": 9, "STATE": len("succeeded")}
FAILURES_SHOWN = 3  # then `+N`
FOLLOW_POLL_S = 0.1
LAUNCHER_STOP_MARGIN_S = 15  # the launcher needs the job's grace period, the KILL, and a little
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
    record = jobstore.find(job) if job else newest_running_or_newest()
    if record.supervised_by:
        from podrun.supervisor import remote

        flags = {"--worker": worker, "--tail": tail, "--attempt": attempt}
        return remote.forward(record, ["logs", record.id, *(["--follow"] if follow else []),
                                       *([] if collapse else ["--no-collapse"]), *(["--raw"] if raw else []),
                                       *(word for flag, value in flags.items() if value is not None
                                         for word in (flag, str(value)))], raw)
    if attempt is not None and attempt != record.attempt:
        return _show_earlier_attempt(record, attempt, worker, tail, collapse, raw)
    indexes = [w.index for w in record.workers]
    if worker is not None and worker not in indexes:
        raise UsageError(f"--worker {worker}: job {record.id} has workers {', '.join(map(str, indexes))}")
    chosen = [worker] if worker is not None else indexes
    terminal = _replay_terminal(record, chosen, worker, collapse, raw)
    outputs = {index: WorkerOutput(index, terminal, log=None) for index in chosen}
    # a detached job's workers have what is new, unless its supervisor (lifecycle.py) fetches it already
    supervised = record.supervised()
    on_workers = record.detached and record.state == jobstore.RUNNING and not supervised
    if on_workers:
        from podrun.launch import detached

        detached.fetch(record, chosen, outputs=None, follow=False)
    offsets = _replay({index: record.log_path(index) for index in chosen}, tail, outputs, terminal)
    if terminal.collapse:  # what comes next, as it comes: lines of the same moment meet within WINDOW_S
        terminal.collapse = Collapse(chosen)
    if follow and on_workers and record.state == jobstore.RUNNING:  # the fetch may have seen it end
        for index in chosen:
            _copy_new(record.log_path(index), offsets[index], outputs[index])
        detached.fetch(record, chosen, outputs, follow=True)
        return _ended(jobstore.load(record.id))
    attempt = record.attempt
    while True:
        # read before the logs: no lost tail
        finished = record.current_state() != jobstore.RUNNING or (supervised and not record.supervised())
        for index in chosen:
            offsets[index] = _copy_new(record.log_path(index, attempt), offsets[index], outputs[index])
        if not follow or finished:
            break
        terminal.flush()  # lines held whose window ended while nothing new came
        time.sleep(FOLLOW_POLL_S)
        record = jobstore.load(record.id)
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
    indexes = [w.index for w in record.workers]
    if worker is not None and worker not in indexes:
        raise UsageError(f"--worker {worker}: job {record.id} has workers {', '.join(map(str, indexes))}")
    chosen = [worker] if worker is not None else indexes
    terminal = _replay_terminal(record, chosen, worker, collapse, raw)
    outputs = {index: WorkerOutput(index, terminal, log=None) for index in chosen}
    _replay({index: record.log_path(index, attempt) for index in chosen}, tail, outputs, terminal)
    for output in outputs.values():
        output.close()
    terminal.release()
    ended = record.attempts[attempt]
    say(f"attempt {attempt} of job {record.id} {ended['state']}" + (f": {ended['summary']}" if ended["summary"] else ""))
    return 0


def _ended(record: jobstore.JobRecord) -> int:
    """A followed job's last word: its outcome, and its exit code as the exit code of `logs -f`: that of
    `exec` for the same end (a job stopped by `podrun stop` gives 143, as its launcher would have)."""
    state = record.current_state()
    if state == jobstore.RUNNING:  # a detached job whose workers could not all be reached
        return 0
    {jobstore.SUCCEEDED: say_success, jobstore.STOPPED: say}.get(state, say_failure)(record.outcome())
    return record.exit_code if record.exit_code is not None else exits.LOST


def list_jobs(name_or_prefix: str | None, states: list[str], count: int | None, show_all: bool,
              as_json: bool) -> int:
    """Newest first: at most `count` jobs (default 20; with --json, all), of these states (any if none),
    whose id begins with `name_or_prefix` (an id begins with its job's name)."""
    records = [record for record in jobstore.all_jobs() if record.id.startswith(name_or_prefix or "")]
    if any(record.supervised_by and record.state == jobstore.RUNNING for record in records):
        from podrun.supervisor import remote  # asks their supervisors

        remote.refresh(records)
    if any(record.detached and record.state == jobstore.RUNNING for record in records):
        from podrun.launch import detached  # asks their workers: a detached job that ended shows it now

        detached.refresh(records)
    jobs = [(record, record.current_state()) for record in records]
    jobs = [(record, state) for record, state in jobs if not states or state in states]
    limit = None if show_all or (as_json and count is None) else DEFAULT_JOBS_SHOWN if count is None else count
    shown = jobs[:limit]
    if as_json:
        print(json.dumps([_as_json(record, state) for record, state in shown], indent=1))
    else:
        print_table(_table(shown, _terminal_width()))
    if len(shown) < len(jobs):
        say(f"{counted(len(jobs) - len(shown), 'older job')} not shown; -n N or --all shows them")
    return 0


def _as_json(record: jobstore.JobRecord, state: str) -> dict:
    """Every field of the record, with the state shown and, while it runs, each worker's `output_at`."""
    fields = {**record.to_dict(), "state": state}
    if state == jobstore.RUNNING:
        for worker, worker_fields in zip(record.workers, fields["workers"]):
            worker_fields["output_at"] = record.output_at(worker)
    return fields


def stop_job(job: str | None) -> int:
    """`job`: an id, an id's beginning or a name; none: the newest running job."""
    record = jobstore.find(job) if job else _newest_running()
    if record.supervised_by:
        from podrun.supervisor import remote

        return remote.forward(record, ["stop", record.id])
    state = record.current_state()
    if state != jobstore.RUNNING:
        raise PodrunError(f"job {record.id} is not running (it is {state})")
    if record.supervised():
        return _stop_supervised(record)
    if record.detached:
        from podrun.launch import detached

        lost_supervisor = record.supervisor_lost()
        detached.stop(record)
        print(f"podrun: job {record.id} is {jobstore.load(record.id).current_state()}")
        if lost_supervisor and record.cleanup:
            say(f"its supervisor is gone, so what it was to delete is still there: `{record.cleanup}` deletes it")
        return 0
    import signal  # here, not at the top: `podrun jobs` and `podrun logs` start faster without it

    if "pid" not in record.launcher:  # its identity comes from /proc, which only Linux has
        raise PodrunError(f"job {record.id}: its launcher cannot be found on this system (stopping an attached job "
                          f"needs Linux's /proc); press Ctrl-C where it runs")
    os.kill(record.launcher["pid"], signal.SIGTERM)  # its launcher stops every worker, as on Ctrl-C
    wait_s = record.stop_grace_s + LAUNCHER_STOP_MARGIN_S
    deadline = time.monotonic() + wait_s
    with Countdown(record.stop_grace_s) as countdown:
        while (record := jobstore.load(record.id)).current_state() == jobstore.RUNNING:
            if time.monotonic() > deadline:
                raise PodrunError(f"job {record.id}: its launcher (pid {record.launcher['pid']}) did not stop it "
                                  f"within {wait_s:g}s")
            countdown.draw()
            time.sleep(FOLLOW_POLL_S)
    print(f"podrun: job {record.id} is {record.current_state()}")
    return 0


def _stop_supervised(record: jobstore.JobRecord) -> int:
    """A detached job with a supervisor (restarts, delete_after): it stops the job and cleans up, as
    after Ctrl-C; podrun waits for it to finish."""
    import signal

    assert record.supervisor is not None
    pid = record.supervisor["pid"]
    os.kill(pid, signal.SIGTERM)
    say(f"asked job {record.id}'s supervisor (pid {pid}) to stop it; waiting for it to finish")
    with Countdown(record.stop_grace_s) as countdown:
        while record.supervised():
            countdown.draw()
            time.sleep(FOLLOW_POLL_S)
    print(f"podrun: job {record.id} is {jobstore.load(record.id).current_state()}")
    return 0


def newest_running_or_newest() -> jobstore.JobRecord:
    records = jobstore.all_jobs()
    if not records:
        raise PodrunError(f"no jobs yet in {paths.jobs_dir()}; start one with `podrun exec JOB.yaml`")
    return next((record for record in records if record.current_state() == jobstore.RUNNING), records[0])


def _newest_running() -> jobstore.JobRecord:
    running = next((record for record in jobstore.all_jobs() if record.current_state() == jobstore.RUNNING), None)
    if running is None:
        raise PodrunError("no job is running; `podrun jobs` lists them, `podrun stop JOB_ID` names one")
    say(f"stopping job {running.id}, the newest running job")
    return running


def _row(record: jobstore.JobRecord, state: str, idle: bool) -> tuple[str, ...]:
    end = record.ended_at or (time.time() if state == jobstore.RUNNING else None)
    duration = duration_text(end - record.started_at) if end else "-"
    return record.id, record.name, record.target, _state_text(record, state, idle), _exit_codes(record, state), \
        _started(record), duration


def _state_text(record: jobstore.JobRecord, state: str, idle: bool) -> str:
    """The state, with the restarts it took (`restarts`) and, while it runs, its supervisor if it has one
    and (with `idle`) how long ago its last output came."""
    notes = [f"{record.attempt} restart{'s' * (record.attempt > 1)}"] if record.attempt else []
    if record.supervised_by:
        notes.append(f"on {record.supervised_by['host']}")
    if state == jobstore.RUNNING and record.supervised():
        notes.append("supervised")
    elif state == jobstore.RUNNING and record.supervisor_lost():
        notes.append("supervisor lost")
    if state == jobstore.RUNNING and idle:
        notes.append(_idle(record))
    return f"{state} ({', '.join(notes)})" if notes else state


def _idle(record: jobstore.JobRecord) -> str:
    """`idle 4s`: how long ago the last output of any worker came (since the attempt started, if none
    came yet); short, as the column must fit 80 columns (--json has each worker's output_at)."""
    idle_s = max(0.0, time.time() - max((at for at in map(record.output_at, record.workers) if at is not None),
                                        default=record.attempt_started_at()))
    return f"idle {idle_s:.0f}s" if idle_s < 60 else f"idle {duration_text(idle_s)}"


def _started(record: jobstore.JobRecord) -> str:
    """As ps shows a start (STIME): the time today, the day this year, else the year (--json has it all)."""
    started, now = time.localtime(record.started_at), time.localtime()
    if started[:3] == now[:3]:
        return time.strftime("%H:%M", started)
    return time.strftime("%b %d" if started.tm_year == now.tm_year else "%Y", started)


def _exit_codes(record: jobstore.JobRecord, state: str) -> str:
    """`32/32 ok`, `30/32 ok, 2 running`, `32 stopped`, or the failed workers and how many were stopped
    (by `podrun stop`, fail-fast or Ctrl-C): `w5=3, 31 stopped`; those a stop had to kill are counted
    apart: `w5=3, 30 stopped, 1 killed after the grace period`."""
    failed = [w for w in record.workers if w.exit_code and not _stopped(w) and not w.killed]
    stopped = sum(_stopped(w) and not w.killed for w in record.workers)
    killed = sum(bool(w.killed) for w in record.workers)
    ok = sum(w.exit_code == 0 for w in record.workers)
    pending = sum(w.exit_code is None for w in record.workers)
    parts = []
    if failed:
        parts.append(_failures(failed))
    elif ok or not (stopped or killed or pending):
        parts.append(f"{ok}/{len(record.workers)} ok")
    if stopped:
        parts.append(f"{stopped} stopped")
    if killed:
        parts.append(f"{killed} killed after the grace period")
    if pending:
        parts.append(f"{pending} {'running' if state == jobstore.RUNNING else 'unknown'}")
    return ", ".join(parts)


def _stopped(worker: jobstore.WorkerRecord) -> bool:
    """Whether the worker ended because it was told to: SIGTERM (an attached job's launcher stopping it),
    or its agent's stop_reason (a detached job's)."""
    return bool(worker.exit_code) and (worker.signal == "SIGTERM" or worker.stop_reason is not None)


def _failures(failed: list[jobstore.WorkerRecord]) -> str:
    shown = " ".join(f"w{worker.index}={worker.exit_code}" for worker in failed[:FAILURES_SHOWN])
    return f"{shown} +{len(failed) - FAILURES_SHOWN}" if len(failed) > FAILURES_SHOWN else shown


def _table(jobs: list[tuple[jobstore.JobRecord, str]], width: int | None) -> list[tuple[str, ...]]:
    """The rows of `podrun jobs`, the header first, fitted to `width` (None: whole) as SHRINKABLE says."""
    rows = _fit([HEADER, *(_row(record, state, idle=True) for record, state in jobs)], width, SHRINKABLE[:1])
    if not width or _table_width(rows) <= width:
        return rows
    whole = [HEADER, *(_row(record, state, idle=False) for record, state in jobs)]
    for dropped in range(len(DROPPABLE) + 1):
        kept = [column for column, name in enumerate(HEADER) if name not in DROPPABLE[:dropped]]
        rows = _fit([tuple(row[column] for column in kept) for row in whole], width, SHRINKABLE)
        if _table_width(rows) <= width:
            return rows
    return _fit(rows, width, (LAST_RESORT,))


def _terminal_width() -> int | None:
    """On a terminal, COLUMNS, else its width; None for a pipe or a file, COLUMNS or not: they get whole
    rows, as from `ps` or `docker ps`, since a script that reads them must not get cut cells."""
    if not os.isatty(1):
        return None
    try:
        return int(os.environ["COLUMNS"]) or None
    except (KeyError, ValueError):
        try:
            return os.get_terminal_size(1).columns
        except OSError:
            return None


def _table_width(rows: list[tuple[str, ...]]) -> int:
    return sum(max(len(row[column]) for row in rows) for column in range(len(rows[0]))) + 2 * (len(rows[0]) - 1)


def _fit(rows: list[tuple[str, ...]], width: int | None, shrinkable: tuple[dict[str, int], ...]) \
        -> list[tuple[str, ...]]:
    """The rows, with the `shrinkable` columns (SHRINKABLE's groups, by header) cut in the middle until a row
    fits `width` (or they can give no more)."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    excess = _table_width(rows) - width if width else 0
    for by_name in shrinkable:
        narrowest = {rows[0].index(name): least for name, least in by_name.items() if name in rows[0]}
        while excess > 0 and (wider := [column for column in narrowest if widths[column] > narrowest[column]]):
            widths[max(wider, key=lambda column: widths[column])] -= 1
            excess -= 1
    return [tuple(_cut_middle(cell, width) for cell, width in zip(row, widths)) for row in rows]


def _cut_middle(text: str, width: int) -> str:
    """`text`, or its beginning and end around a `…` to fit `width`: both ends of an id stay readable."""
    if len(text) <= width:
        return text
    end = (width - 1) // 2
    return f"{text[:width - 1 - end]}…{text[len(text) - end:]}"


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
