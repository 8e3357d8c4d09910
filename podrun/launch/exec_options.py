"""`podrun exec`'s flags as one value, parsed once by the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ExecOptions:
    """`podrun exec`'s flags as typed values; a supervisor gets them as they are (vars(), as JSON)."""

    dry_run: bool = False
    worker: str | None = None  # --worker LIST, picked from once the workers are known (plan.parse_worker_selection)
    env: dict[str, str] = field(default_factory=dict)  # --env K=V
    detach: bool = False
    kill_stale: bool = False
    allow_large_workdir: bool = False
    grace_s: float | None = None  # --grace, in seconds
    down: bool = False
    restarts: int | None = None
    stall_s: float | str | None = None  # --stall, in seconds, or "auto"
    supervisor: str | None = None  # --supervisor HOST
    collapse: bool = True  # --no-collapse: False
    raw: bool = False  # --raw: the workers' output reaches the terminal as written (escapes.py)
