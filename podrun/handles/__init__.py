"""Where a job lives, decided once: `handle_for(record)` gives the job's handle, which `podrun logs`, `jobs`,
`stop`, `stacks` and `report` ask; no other code reads where a record lives (jobstore.py keeps it). The
read side's twin of `Target`: a target is chosen for a spec and starts the job, a handle is chosen for
the job's record and reaches the job again.

A job lives on a supervisor host (supervisor_host.py: the record here points at the one kept there), or
here under a supervisor of its own (local_supervisor.py: a detached job that restarts or deletes its
capacity), or detached on its workers (on_workers.py), or attached, in its launcher (attached.py)."""

from __future__ import annotations

import time

from podrun import jobstore
from podrun.handles.attached import Attached
from podrun.handles.base import JobHandle
from podrun.handles.local_supervisor import LocalSupervisor
from podrun.handles.on_workers import OnWorkers
from podrun.handles.supervisor_host import OnSupervisorHost


def handle_for(record: jobstore.JobRecord) -> JobHandle:
    if record.supervised_by:
        return OnSupervisorHost(record)
    if record.supervised():
        return LocalSupervisor(record)
    if record.detached:
        return OnWorkers(record)
    return Attached(record)


# how long after an attempt of a supervised job ended in a state a restart follows (its pointer's copy) the
# supervisor is still asked: its supervisor decides on the restart after it has recorded that end
RESTART_WINDOW_S = 3600


def _may_restart_there(record: jobstore.JobRecord) -> bool:
    """A supervised job whose pointer last read an end its supervisor may still restart from."""
    return (record.supervised_by is not None and record.state in (jobstore.FAILED, jobstore.PREEMPTED, jobstore.STALLED)
            and record.ended_at is not None and time.time() - record.ended_at < RESTART_WINDOW_S)


def refresh(records: list[jobstore.JobRecord]) -> dict[str, JobHandle]:
    """Bring running jobs' records up to date from where they live (`podrun jobs`): their supervisor hosts'
    first, then detached jobs' workers; a job that ended meanwhile shows its true state and duration. The
    handles that did it, by job id: they know what could not be reached (their notes say so)."""
    running = [handle_for(record) for record in records if record.state == jobstore.RUNNING or _may_restart_there(record)]
    for residence in (OnSupervisorHost, OnWorkers):
        if handles := [handle for handle in running if isinstance(handle, residence)]:
            residence.refresh_all(handles)
    return {handle.record.id: handle for handle in running}
