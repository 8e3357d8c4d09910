"""Where podrun keeps things, on the launcher and (relative to the worker's root) on each worker."""

from __future__ import annotations

import os
from pathlib import Path


def podrun_home() -> Path:
    return Path(os.environ.get("PODRUN_HOME") or "~/.podrun").expanduser()


def jobs_dir() -> Path:
    return podrun_home() / "jobs"


def local_worker_root(index: int) -> Path:
    """A local worker's stand-in for a host's home directory: its code copies and job files."""
    return podrun_home() / "local" / f"w{index}"


def remote_code_dir(name: str, tree_hash: str) -> str:
    return f"podrun/{name}/{tree_hash}"


def remote_job_dir(job_id: str) -> str:
    return f".podrun/jobs/{job_id}"
