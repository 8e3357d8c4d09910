"""A job kept by a supervisor host (supervisor/daemon.py): its lifecycle (lifecycle.py) runs the job
detached on its workers and follows it from a supervisor process of its own, so that the job outlives
that process.

While the supervisor process follows the job, its follower on worker 0 touches the run's
supervisor.beat; the job's hub on worker 0 stops the job once that file has not changed for AWAY (the
supervisor was killed, or its VM rebooted, and nobody started it again: remote/hub.py), and then,
where the spec deletes the TPU, deletes it with the VM's own credentials (remote/self_delete.py).

The supervisor process holds LOCK_FILE in the job's directory for as long as it lives: `podrun
supervisor start` (supervisor/adopt.py) adopts again a running job whose lock is free, from what
RESUME_FILE keeps of the handover (never a secret's value).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass

from podrun import jobstore
from podrun.cloud.settings import seconds

AWAY = ("PODRUN_SUPERVISOR_AWAY", 900.0)  # 15 min: a VM's maintenance reboot, and a unit starting podrun again
BEAT_EVERY_S = 5.0
LOCK_FILE = "supervisor.lock"
RESUME_FILE = jobstore.RESUME_FILE


@dataclass
class Kept:
    away_s: float
    shows_output: bool  # a laptop waits for the job's end and shows what its workers print (daemon.py)

    @property
    def beat_every_s(self) -> float:
        """How often its follower tells the job's hub that it is there: well within away_s."""
        return min(BEAT_EVERY_S, self.away_s / 4)

    @classmethod
    def here(cls, shows_output: bool) -> Kept:
        return cls(seconds(AWAY), shows_output)

    def hold(self, record: jobstore.JobRecord) -> None:
        """The job's lock, for the life of this process (it goes with it, whatever kills it): taken here,
        unless this process has it already: from the launcher that forked it, or as the one that adopts it."""
        if not _held:
            take_lock(record.dir)

    @staticmethod
    def done(record: jobstore.JobRecord) -> None:
        """The job has ended: nothing is left to adopt."""
        forget(record.dir)


def forget(job_dir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(job_dir, RESUME_FILE))


_held: list[int] = []  # the lock's descriptor, open for as long as this process lives


def take_lock(job_dir: str) -> bool:
    """Whether this process now holds the job's supervisor lock (False: another process does)."""
    descriptor = os.open(os.path.join(job_dir, LOCK_FILE), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return False
    _held.append(descriptor)
    return True


def kept_by_nobody(job_dir: str) -> bool:
    """Whether no process holds the job's supervisor lock now."""
    try:
        descriptor = os.open(os.path.join(job_dir, LOCK_FILE), os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)
