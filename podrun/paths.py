"""Where podrun keeps things, on the launcher and (relative to the worker's root) on each worker.

Paths are strings (os.path), not pathlib: `podrun jobs` and `podrun logs` start faster without it.
"""

from __future__ import annotations

import os

from podrun.errors import UsageError


def podrun_home() -> str:
    return os.path.expanduser(os.environ.get("PODRUN_HOME") or "~/.podrun")


def unusable_home(error: OSError) -> UsageError:
    """The one line for a PODRUN_HOME that podrun cannot write in (a file, a read-only place)."""
    where = f"PODRUN_HOME={os.environ['PODRUN_HOME']}" if os.environ.get("PODRUN_HOME") else podrun_home()
    return UsageError(f"{where}: cannot create {error.filename or 'files'} there ({error.strerror or error}); "
                       f"expected a writable directory (set PODRUN_HOME to one)")


def make_private_dir(path: str) -> None:
    """path and its parents, 0700, somewhere under PODRUN_HOME."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as error:
        raise unusable_home(error) from None


def jobs_dir() -> str:
    return os.path.join(podrun_home(), "jobs")


def remote_name_dir(name: str) -> str:
    """What podrun keeps on a worker for jobs of this name: the code versions and the run directory."""
    return f"podrun/{name}"


def remote_code_dir(name: str, tree_hash: str) -> str:
    """One version of the code, by content hash: shipped once, never changed (remote/checkout.py)."""
    return f"{remote_name_dir(name)}/{tree_hash}"


def remote_run_dir(name: str) -> str:
    """Where the job runs: the version's files linked in, beside what earlier jobs wrote (checkpoints)."""
    return f"{remote_name_dir(name)}/run"


def remote_jobs_dir() -> str:
    return ".podrun/jobs"


def remote_job_dir(job_id: str, attempt: int = 0, worker: int | None = None) -> str:
    """A job's files on a worker; each restart of the job (`restarts`) has its own: its log, its exit.
    Where every worker's root is one directory (Target.shares_root), each `worker` has one inside it."""
    return f"{remote_jobs_dir()}/{job_id}" + (f".attempt-{attempt}" if attempt else "") + \
        (f"/w{worker}" if worker is not None else "")
