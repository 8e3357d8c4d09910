"""Reach a detached job again (`podrun logs`, `podrun stop`): through its workers, from any terminal.

Each worker's agent keeps ~/.podrun/jobs/<JOB_ID>/output.log and writes run.exit when the run ends.
Fetching copies what the local log lacks (so it resumes where the local copy ends) and, once every
worker has its exit, records the job's end in the job store.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os

from podrun import jobstore, paths
from podrun.errors import PodrunError
from podrun.output import WorkerOutput
from podrun.transport import transport_for
from podrun.transport.base import ChannelLost, Transport

AGENT_STOP_WAIT_S = 15  # the agents' grace period, KILL, and some


def fetch(record: jobstore.JobRecord, indexes: list[int], outputs: dict[int, WorkerOutput] | None,
          follow: bool) -> None:
    """Bring the local logs of `indexes` up to date (showing new output through `outputs`, if given),
    following until the job ends when asked; records the end when every worker has one."""
    asyncio.run(_fetch_all(record, indexes, outputs, follow))


def stop(record: jobstore.JobRecord) -> None:
    asyncio.run(_stop_all(record))
    fetch(record, [w.index for w in record.workers], None, follow=False)


async def _fetch_all(record, indexes, outputs, follow) -> None:
    workers = [w for w in record.workers if w.index in indexes]
    exits = await _on_every_worker(workers, lambda worker, transport: _fetch(
        record, worker, transport, (outputs or {}).get(worker.index), follow))
    for worker, exit_record in zip(workers, exits):
        if exit_record:
            worker.exit_code, worker.signal = exit_record["code"], exit_record["signal"]
            worker.stop_reason = exit_record["stop_reason"]
    if all(w.exit_code is not None for w in record.workers):
        failed = [w for w in record.workers if w.exit_code != 0]
        stopped = any(w.stop_reason == "SIGTERM" for w in record.workers)
        state = jobstore.SUCCEEDED if not failed else jobstore.STOPPED if stopped else jobstore.FAILED
        record.finish(state, failed[0].exit_code if failed else 0,
                      f"worker {failed[0].index} exited with code {failed[0].exit_code}" if failed else None)
    else:
        record.save()


async def _fetch(record, worker, transport: Transport, output: WorkerOutput | None, follow: bool) -> dict | None:
    log_path = record.log_path(worker.index)
    offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    channel = await transport.start_python("log_follower", paths.remote_job_dir(record.id), str(offset),
                                           "1" if follow else "0")
    channel.stdin.write_eof()
    with jobstore.open_log(log_path) as log:
        while chunk := await channel.stdout.read(65536):
            _append_at(log, offset, chunk)
            offset += len(chunk)
            if output:
                output.feed(chunk)
    if output:
        output.close()
    exit_text, _ = await asyncio.gather(channel.stderr.read(), channel.wait())
    return json.loads(exit_text) if exit_text.strip() else None


def _append_at(log, offset: int, chunk: bytes) -> None:
    """Write the bytes the worker's log holds at `offset` onwards, but only those the local copy lacks:
    another podrun (a `logs -f` beside a `stop`) may be fetching the same log at the same time."""
    fcntl.flock(log, fcntl.LOCK_EX)
    try:
        already = os.fstat(log.fileno()).st_size - offset
        if already < len(chunk):
            log.write(chunk[max(already, 0):])
    finally:
        fcntl.flock(log, fcntl.LOCK_UN)


async def _stop_all(record: jobstore.JobRecord) -> None:
    async def stop_one(worker, transport: Transport) -> None:
        channel = await transport.start_python("detached_stopper", paths.remote_job_dir(record.id),
                                               str(AGENT_STOP_WAIT_S))
        channel.stdin.write_eof()
        if await channel.wait() != 0:
            raise PodrunError(f"worker {worker.index} ({worker.address}): the job did not stop within "
                              f"{AGENT_STOP_WAIT_S}s")

    await _on_every_worker(record.workers, stop_one)


async def _on_every_worker(workers, action) -> list:
    """Run action(worker, transport) on every worker at once, over one connection each."""

    async def one(worker):
        transport = transport_for(worker.endpoint)
        try:
            await transport.connect()
            return await action(worker, transport)
        except ChannelLost as lost:
            raise PodrunError(f"worker {worker.index} ({worker.address}) lost its connection ({lost})") from None
        finally:
            await transport.close()

    return await asyncio.gather(*(one(worker) for worker in workers))

