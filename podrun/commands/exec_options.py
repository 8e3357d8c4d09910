"""`podrun exec`'s flags as one value, built once by the CLI."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExecOptions:
    """`podrun exec`'s flags, as the CLI parsed them; a supervisor gets them as they are (vars())."""

    dry_run: bool = False
    worker: str | None = None  # --worker LIST
    env: tuple[str, ...] = ()  # --env K=V, as given
    detach: bool = False
    kill_stale: bool = False
    allow_large_workdir: bool = False
    grace: str | None = None
    down: bool = False
    restarts: int | None = None
    stall: str | None = None
    supervisor: str | None = None  # --supervisor HOST
    collapse: bool = True  # --no-collapse: False
    raw: bool = False  # --raw: the workers' output reaches the terminal as written (escapes.py)
