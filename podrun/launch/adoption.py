"""A supervisor host's job adopted again by a supervisor started anew (supervisor/adopt.py): the part of
a job's lifecycle (lifecycle.py) that takes it up where its last supervisor was cut off. Its run goes
on, and the new supervisor follows it. If the job was between attempts, it makes that attempt,
creating the TPU again first after a preemption. From then on it is the same lifecycle: restarts,
deletion, notification. It reaches into the lifecycle's own steps: it is that lifecycle's part, kept
apart to keep lifecycle.py readable."""

from __future__ import annotations

from typing import TYPE_CHECKING

from podrun import exits, jobstore, timeline
from podrun.errors import PodrunError
from podrun.output import say

if TYPE_CHECKING:
    from podrun.launch.lifecycle import Lifecycle


def adopt(lifecycle: Lifecycle, record: jobstore.JobRecord, stop_grace_s: float) -> int:
    """Take up the running job `record` in this process (forked for it) as `lifecycle`'s supervisor: its exit
    code is the job's."""
    record.stop_grace_s = stop_grace_s
    lifecycle.selected = {worker.index for worker in record.workers}
    return lifecycle._supervise(record, resume=lambda: _resume(lifecycle, record))


def _resume(lifecycle: Lifecycle, record: jobstore.JobRecord) -> int:
    if timeline.current(record, "run") is not None:
        say(f"job {record.id}: adopted again, following attempt {record.attempt} on its workers")
        try:
            lifecycle.workers = lifecycle.target.workers(dry_run=False)  # where a failure's restart runs
        except PodrunError as error:
            return _without_its_capacity(lifecycle, record, error)
        return lifecycle._watch(record)
    preempted = bool(record.attempts) and record.attempts[-1]["state"] == jobstore.PREEMPTED
    say(f"job {record.id}: adopted again; attempt {record.attempt} had not begun: "
        f"{'creating the TPU again' if preempted else 'running it on the same workers'}")
    # after a preemption, made again unless the TPU it made again serves already
    lifecycle.workers = (lifecycle.holding.reacquire(record, "adopted again", only_if_lost=True) if preempted
                         else lifecycle.target.workers(dry_run=False))
    record.workers = lifecycle._worker_records()
    record.save()
    lifecycle._launch(record, lifecycle.plans(lifecycle.workers, lifecycle.selected, record.id, record.attempt))
    return lifecycle._watch(record)


def _without_its_capacity(lifecycle: Lifecycle, record: jobstore.JobRecord, error: PodrunError) -> int:
    """The job's TPU does not serve now. A preemption while its supervisor was away is recovered as any
    other; a TPU gone otherwise (deleted: its workers' own watch does that after an absence past the
    bound, remote/hub.py) ended the job, and nothing is made again for it."""
    why = lifecycle.target.capacity.lost()
    if why is not None and " preempted (" in why:
        record.finish(jobstore.PREEMPTED, exits.PREEMPTED, why)
        return exits.PREEMPTED
    record.finish(jobstore.FAILED, exits.LOST, f"its TPU was gone when a supervisor adopted it again ({error})")
    say(record.outcome())
    return exits.LOST
