"""`podrun disk JOB.yaml [--free]`: the disk podrun uses on each worker for a job's name, and freeing it.

One connection per worker, all at once; each runs remote/disk.py as a script, which measures
(and with --free removes) the name's old code versions and old finished jobs' files, never the run
directory: it holds the jobs' checkpoints.
"""

from __future__ import annotations

import asyncio
import json

from podrun import file_limit, paths
from podrun.errors import PodrunError
from podrun.launch.steps import wait_for_workers
from podrun.output import counted, print_table, size_text
from podrun.spec.loading import load_spec
from podrun.targets.base import Worker, target_for
from podrun.transport.base import ChannelLost

DISK_TIMEOUT_S = 120  # measuring (and freeing) a worker's files: a big tree takes seconds, a login that hangs forever
JOB_FILES_KEPT_S = 7 * 24 * 3600  # --free keeps a finished job's files on the workers this long after its last change


def disk(spec_path: str, free: bool) -> int:
    spec = load_spec(spec_path)
    workers = target_for(spec).workers(dry_run=False)
    reports = asyncio.run(_on_every_worker(workers, spec.name, free))
    header = ("WORKER", "CODE VERSIONS", "RUN DIR", "JOB FILES") + (("FREED",) if free else ())
    print_table([header, *(_row(worker, report, free) for worker, report in zip(workers, reports))])
    return 0


async def _on_every_worker(workers: list[Worker], name: str, free: bool) -> list[dict]:
    file_limit.make_room(file_limit.needed([worker.transport.endpoint()["kind"] for worker in workers], processes=1),
                         counted(len(workers), "worker"))
    usage: dict[asyncio.Future, Worker] = {asyncio.ensure_future(_usage(worker, name, free)): worker for worker in workers}
    await wait_for_workers(usage, "report podrun's disk use", DISK_TIMEOUT_S)
    return [task.result() for task in usage]


async def _usage(worker: Worker, name: str, free: bool) -> dict:
    transport = worker.transport
    try:
        await transport.connect()
        channel = await transport.start_python("disk", paths.remote_name_dir(name), paths.remote_jobs_dir(),
                                               "1" if free else "0", str(JOB_FILES_KEPT_S))
        channel.stdin.write_eof()
        report, errors, code = await asyncio.gather(channel.stdout.read(), channel.stderr.read(), channel.wait())
    except ChannelLost as lost:
        raise PodrunError(f"worker {worker.index} ({worker.address}) lost its connection ({lost})") from None
    finally:
        await transport.close()
    if code != 0:
        why = (errors.decode(errors="replace").strip().splitlines() or [f"exit code {code}"])[-1]
        raise PodrunError(f"worker {worker.index} ({worker.address}): cannot measure podrun's files there: {why}")
    return json.loads(report)


def _row(worker: Worker, report: dict, free: bool) -> tuple[str, ...]:
    row = (f"{worker.index} {worker.address}",
           f"{counted(report['versions'], 'version')}, {size_text(report['versions_bytes'])}",
           size_text(report["run_bytes"]), f"{counted(report['jobs'], 'job')}, {size_text(report['jobs_bytes'])}")
    if not free:
        return row
    return row + (f"{counted(report['freed_versions'], 'version')}, {counted(report['freed_jobs'], 'job')}: "
                  f"{size_text(report['freed_bytes'])}",)
