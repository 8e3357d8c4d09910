"""`podrun stop`: a running job stopped on every worker, wherever it lives (handles/)."""

from __future__ import annotations

from podrun import jobstore
from podrun.errors import PodrunError
from podrun.handles import handle_for
from podrun.output import say


def stop_job(job: str | None) -> int:
    """`job`: an id, an id's beginning or a name; none: the newest running job."""
    return handle_for(jobstore.find(job) if job else _newest_running()).stop()


def _newest_running() -> jobstore.JobRecord:
    running = next((record for record in jobstore.all_jobs() if record.current_state() == jobstore.RUNNING), None)
    if running is None:
        raise PodrunError("no job is running; `podrun jobs` lists them, `podrun stop JOB_ID` names one")
    say(f"stopping job {running.id}, the newest running job")
    return running
