"""`podrun logs`, `podrun jobs` and `podrun stop`: read the job store, now or while a job runs."""

from __future__ import annotations

import json
import os
import time

from podrun import jobstore
from podrun.errors import PodrunError, UsageError
from podrun.output import Terminal, WorkerOutput, print_table

FOLLOW_POLL_S = 0.1
LAUNCHER_STOP_WAIT_S = 30  # the launcher needs at most the agents' grace period and a second
READ_SIZE = 1 << 16


def show_logs(job_id: str | None, worker: int | None, follow: bool, tail: int | None) -> int:
    record = jobstore.load(job_id) if job_id else jobstore.newest()
    indexes = [w.index for w in record.workers]
    if worker is not None and worker not in indexes:
        raise UsageError(f"--worker {worker}: job {record.id} has workers {', '.join(map(str, indexes))}")
    chosen = [worker] if worker is not None else indexes
    terminal = Terminal(prefixed=worker is None)
    outputs = {index: WorkerOutput(index, terminal, log=None) for index in chosen}
    on_workers = record.detached and record.state == jobstore.RUNNING  # they have what is new
    if on_workers:
        from podrun.launch import detached

        detached.fetch(record, chosen, outputs=None, follow=False)
    offsets = {index: _start_offset(record.log_path(index), tail) for index in chosen}
    if follow and on_workers and record.state == jobstore.RUNNING:  # the fetch may have seen it end
        for index in chosen:
            _copy_new(record.log_path(index), offsets[index], outputs[index])
        detached.fetch(record, chosen, outputs, follow=True)
        return 0
    while True:
        finished = record.current_state() != jobstore.RUNNING  # read before the logs: no lost tail
        for index in chosen:
            offsets[index] = _copy_new(record.log_path(index), offsets[index], outputs[index])
        if not follow or finished:
            break
        time.sleep(FOLLOW_POLL_S)
        record = jobstore.load(record.id)
    for output in outputs.values():
        output.close()
    return 0


def list_jobs(as_json: bool) -> int:
    records = jobstore.all_jobs()
    if as_json:
        print(json.dumps([{**record.to_dict(), "state": record.current_state()} for record in records], indent=1))
        return 0
    header = ("ID", "NAME", "TARGET", "STATE", "EXIT CODES", "STARTED", "DURATION")
    print_table([header, *(_row(record) for record in records)])
    return 0


def stop_job(job_id: str) -> int:
    record = jobstore.load(job_id)
    state = record.current_state()
    if state != jobstore.RUNNING:
        raise PodrunError(f"job {job_id} is not running (it is {state})")
    if record.detached:
        from podrun.launch import detached

        detached.stop(record)
        print(f"podrun: job {job_id} is {jobstore.load(job_id).current_state()}")
        return 0
    import signal  # here, not at the top: `podrun jobs` and `podrun logs` start faster without it

    if "pid" not in record.launcher:  # its identity comes from /proc, which only Linux has
        raise PodrunError(f"job {job_id}: its launcher cannot be found on this system (stopping an attached job "
                          f"needs Linux's /proc); press Ctrl-C where it runs")
    os.kill(record.launcher["pid"], signal.SIGTERM)  # its launcher stops every worker, as on Ctrl-C
    deadline = time.monotonic() + LAUNCHER_STOP_WAIT_S
    while (record := jobstore.load(job_id)).current_state() == jobstore.RUNNING:
        if time.monotonic() > deadline:
            raise PodrunError(f"job {job_id}: its launcher (pid {record.launcher['pid']}) did not stop it "
                              f"within {LAUNCHER_STOP_WAIT_S}s")
        time.sleep(FOLLOW_POLL_S)
    print(f"podrun: job {job_id} is {record.current_state()}")
    return 0


def _row(record: jobstore.JobRecord) -> tuple[str, ...]:
    codes = ",".join("-" if w.exit_code is None else str(w.exit_code) for w in record.workers)
    end = record.ended_at or (time.time() if record.current_state() == jobstore.RUNNING else None)
    duration = _duration(end - record.started_at) if end else "-"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.started_at))
    return record.id, record.name, record.target, record.current_state(), codes, started, duration


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def _start_offset(path: str, tail: int | None) -> int:
    """0, or the offset where the last `tail` lines of the file begin."""
    if tail is None or not os.path.exists(path):
        return 0
    with open(path, "rb") as handle:
        end = position = handle.seek(0, os.SEEK_END)
        newlines = 0
        while position > 0:
            size = min(READ_SIZE, position)
            position -= size
            handle.seek(position)
            block = handle.read(size)
            if position + size == end and block.endswith(b"\n"):
                block = block[:-1]  # the final newline ends the last line, it does not start one
            for offset in range(len(block) - 1, -1, -1):
                if block[offset] == 10:
                    newlines += 1
                    if newlines == tail:
                        return position + offset + 1
        return 0


def _copy_new(path: str, offset: int, output: WorkerOutput) -> int:
    """Feed what the log gained since `offset` to the output; returns the new offset."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return offset
    with handle:
        handle.seek(offset)
        while chunk := handle.read(READ_SIZE):
            output.feed(chunk)
            offset += len(chunk)
    return offset
