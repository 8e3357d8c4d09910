"""Whether the capacity under a job went away: a lost worker judged before it is reported
(preempted, or lost), and the API read now and then while run goes on (docs/design.md: Preemptions).

On Google's side a preemption reaches SSH first: the VM shuts down and its connections break at once,
while the API shows the node PREEMPTED (its queued resource SUSPENDED) only once the shutdown is over,
tens of seconds later. So a worker lost on a target whose capacity can go away is judged over time:
the API is asked with backoff, and the lost workers are tried again over SSH, for at most
PODRUN_LOST_WORKER_WAIT seconds (180). Preempted as soon as the API shows the capacity gone (not READY,
under maintenance, its queued resource no longer ACTIVE); lost once every lost worker's host answers
again with none of the job's processes left (the host stayed, the link or the agent broke), or when
the bound passes with the API still showing the capacity serving.

While run goes on, the node is read every PODRUN_TPU_WATCH_INTERVAL seconds (45; one GET per node),
so a maintenance event or a preemption is seen even while SSH still holds.
"""

from __future__ import annotations

import asyncio
import shlex
import time

from podrun.cloud.settings import seconds
from podrun.errors import PodrunError
from podrun.output import counted, say
from podrun.targets.base import Target
from podrun.transport import transport_for
from podrun.transport.base import ChannelLost, Transport

LOST_WORKER_WAIT = ("PODRUN_LOST_WORKER_WAIT", 180.0)
WATCH_INTERVAL = ("PODRUN_TPU_WATCH_INTERVAL", 45.0)
FIRST_LOOK_S = 1.0
LOOK_GROWTH = 1.5
LOOK_MAX_S = 15.0


def settings() -> tuple[float, float]:
    """(LOST_WORKER_WAIT, WATCH_INTERVAL): read when the job starts, so a bad value is a line then."""
    return seconds(LOST_WORKER_WAIT), seconds(WATCH_INTERVAL)


async def judge(target: Target, lost: dict[int, dict], job_id: str) -> str | None:
    """Whether the workers `lost` (index: transport endpoint) went with the target's capacity: why, in one
    line, if the API shows it gone; None if they were lost otherwise."""
    bound = seconds(LOST_WORKER_WAIT)
    which = counted(len(lost), "worker") if len(lost) > 1 else f"worker {next(iter(lost))}"
    say(f"{which} dropped {'their' if len(lost) > 1 else 'its'} connection: waiting up to {bound:g}s "
        f"({LOST_WORKER_WAIT[0]}) for the TPU API to show whether it was preempted (it shows a preemption tens of "
        f"seconds after SSH feels it), and trying the host again")
    started = time.monotonic()
    deadline, interval = started + bound, FIRST_LOOK_S
    unanswered = dict(lost)
    while True:
        if reason := await asyncio.to_thread(target.capacity.lost):
            return reason
        answers = await asyncio.gather(*(_back_without_job(endpoint, job_id) for endpoint in unanswered.values()))
        unanswered = {index: endpoint for (index, endpoint), back in zip(unanswered.items(), answers) if not back}
        if not unanswered:
            say(f"{which} answered again, with none of the job's processes left, while the API shows the TPU serving: "
                f"not a preemption")
            return None
        if time.monotonic() >= deadline:
            say(f"the API still shows the TPU serving {time.monotonic() - started:.0f}s after {which} was lost: "
                f"not a preemption")
            return None
        await asyncio.sleep(max(0.0, min(interval, deadline - time.monotonic())))
        interval = min(interval * LOOK_GROWTH, LOOK_MAX_S)


async def _back_without_job(endpoint: dict, job_id: str) -> bool:
    """Whether the worker answers again with none of the job's processes left on it."""
    transport = transport_for(endpoint)
    try:
        await transport.connect()
        return await _job_gone(transport, job_id)
    except (PodrunError, ChannelLost, OSError):  # unreachable, refused, or the link broke again: not back
        return False
    finally:
        await asyncio.gather(transport.close(), return_exceptions=True)


async def _job_gone(transport: Transport, job_id: str) -> bool:
    """No process on the worker carries the job's PODRUN_JOB_ID (grep -z reads each environ whole)."""
    marker = shlex.quote(f"PODRUN_JOB_ID={job_id}")
    channel = await transport.start(f"! grep -qszxF {marker} /proc/[0-9]*/environ")
    channel.stdin.write_eof()
    return await channel.wait() == 0


async def watch(target: Target) -> str:
    """Read the target's capacity every WATCH_INTERVAL until the API shows it gone: why."""
    interval = seconds(WATCH_INTERVAL)
    while True:
        await asyncio.sleep(interval)
        if reason := await asyncio.to_thread(target.capacity.lost, True):
            return reason
