"""Where podrun keeps things, on the launcher and (relative to the worker's root) on each worker.

Paths are strings (os.path), not pathlib: `podrun jobs` and `podrun logs` start faster without it.
"""

from __future__ import annotations

import os
import stat

from podrun.errors import UsageError


def podrun_home() -> str:
    return os.path.expanduser(os.environ.get("PODRUN_HOME") or "~/.podrun")


def unusable_home(error: OSError) -> UsageError:
    """The one line for a PODRUN_HOME that podrun cannot write in (a file, a read-only place)."""
    where = f"PODRUN_HOME={os.environ['PODRUN_HOME']}" if os.environ.get("PODRUN_HOME") else podrun_home()
    return UsageError(f"{where}: cannot create {error.filename or 'files'} there ({error.strerror or error}); "
                       f"expected a writable directory (set PODRUN_HOME to one)")


def make_private_dir(path: str) -> None:
    """private_dirs(path), with an error as the one line for an unusable PODRUN_HOME."""
    try:
        private_dirs(path)
    except OSError as error:
        raise unusable_home(error) from None


def private_dirs(path: str) -> None:
    """path, somewhere under PODRUN_HOME, with PODRUN_HOME and every folder between them: each made 0700,
    or closed to 0700 where it is open (an older podrun, or umask 022 on a first run, left it so). Only the
    user's own folders are closed: a shared one (sticky, as /tmp) or another user's named as PODRUN_HOME is
    left as it is, and what podrun makes in it is private all the same. The parents of PODRUN_HOME are the
    user's, made with their umask. Raises OSError."""
    home = os.path.abspath(podrun_home())
    inside = os.path.relpath(os.path.abspath(path), home)
    if inside.split(os.sep)[0] == os.pardir:  # a job recorded under another PODRUN_HOME: its own folder only
        os.makedirs(path, mode=0o700, exist_ok=True)
        return
    os.makedirs(os.path.dirname(home), exist_ok=True)
    folder = home
    for part in [] if inside == os.curdir else inside.split(os.sep):
        _make_private(folder, last=False)
        folder = os.path.join(folder, part)
    _make_private(folder, last=True)


def _make_private(folder: str, last: bool) -> None:
    """A file in the way is said as makedirs says it: of the next folder, Not a directory; of the last,
    File exists."""
    try:
        os.mkdir(folder, 0o700)
        return
    except FileExistsError:
        info = os.stat(folder)
        if not stat.S_ISDIR(info.st_mode):
            if last:
                raise
            return
    if info.st_mode & 0o077 and info.st_uid == os.getuid() and not info.st_mode & stat.S_ISVTX:
        os.chmod(folder, 0o700)


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
