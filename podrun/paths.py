"""Where podrun keeps things, on the launcher and (relative to the worker's root) on each worker.

Paths are strings (os.path), not pathlib: `podrun jobs` and `podrun logs` start faster without it.
"""

from __future__ import annotations

import os


def podrun_home() -> str:
    return os.path.expanduser(os.environ.get("PODRUN_HOME") or "~/.podrun")


def jobs_dir() -> str:
    return os.path.join(podrun_home(), "jobs")


def local_worker_root(index: int) -> str:
    """A local worker's stand-in for a host's home directory: its code copies and job files."""
    return os.path.join(podrun_home(), "local", f"w{index}")


def remote_code_dir(name: str, tree_hash: str) -> str:
    return f"podrun/{name}/{tree_hash}"


def remote_job_dir(job_id: str) -> str:
    return f".podrun/jobs/{job_id}"
