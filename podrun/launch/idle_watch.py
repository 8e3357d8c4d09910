"""`idle_delete` (the spec's, `podrun create --idle-delete`): a TPU podrun just created deletes itself once
no job has run on it for that long. The watch runs on the TPU's worker 0 (remote/idle_watch.py), started
detached here right after the creation, and deletes with the VM's own credentials (remote/self_delete.py),
so that it never depends on the laptop. Here: its start, and the line that says so.

PODRUN_IDLE_POLL_S (seconds, default 15): how often the watch looks for a job on the VM.
"""

from __future__ import annotations

import asyncio
import json

from podrun.cloud.request import duration_text
from podrun.cloud.settings import seconds
from podrun.errors import PodrunError
from podrun.output import say
from podrun.remote import idle_watch
from podrun.targets.base import Target, Worker
from podrun.transport.base import ChannelLost

POLL = ("PODRUN_IDLE_POLL_S", 15.0)
START_TIMEOUT_S = 60  # the watcher answers within its lock wait (remote/idle_watch.py LOCK_WAIT_S) once started


def start(target: Target, workers: list[Worker], idle_s: float) -> None:
    """Start the watch on worker 0 and say so in one line; PodrunError if it cannot start."""
    config = target.capacity.self_delete_config()
    if config is None or not workers:
        return
    worker = workers[0]
    watch = {"idle_s": idle_s, "poll_s": seconds(POLL), "delete": config}
    try:
        answer = asyncio.run(asyncio.wait_for(_start(worker, watch), START_TIMEOUT_S))
    except (ChannelLost, PodrunError, OSError, asyncio.TimeoutError) as error:
        answer = f"error: {error or 'no answer within %ds' % START_TIMEOUT_S}"
    if not answer.startswith("watching "):
        raise PodrunError(f"the idle watch (idle_delete) could not start on worker 0 ({worker.address}): "
                          f"{answer.removeprefix('error: ')}")
    say(f"the TPU deletes itself after {duration_text(idle_s)} with no job on it: worker 0 watches, with the VM's "
        f"own credentials (its service account needs roles/tpu.admin; what came of it: "
        f"~/{idle_watch.LOG_FILE} there)")


async def _start(worker: Worker, watch: dict) -> str:
    """The watcher's first line (`watching PID`, or `error: ...`), over one connection to worker 0."""
    transport = worker.transport  # its connection closed after: a launch opens its own again
    await transport.connect()
    try:
        channel = await transport.start_python("idle_watch", unlisted=[json.dumps(watch)])
        output, errors, _ = await asyncio.gather(channel.stdout.read(), channel.stderr.read(), channel.wait())
    finally:
        await transport.close()
    lines = output.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "error: " + (errors.decode(errors="replace").strip() or "no answer")
