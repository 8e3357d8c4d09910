"""The local target's options (`target: {local: {workers: N}}`, `exec --local N`): N CPU workers on
this machine, the default target. The target itself is local.py's."""

from __future__ import annotations

from pydantic import Field

from podrun.output import counted
from podrun.spec.fields import Model
from podrun.target_kinds.kind import AdhocFlag, TargetKind, whole_number

DEFAULT_WORKERS = 2
MAX_WORKERS = 1024


class LocalOptions(Model):
    workers: int = Field(DEFAULT_WORKERS, ge=1, le=MAX_WORKERS)


KIND = TargetKind(
    name="local", annotation=LocalOptions, description="CPU workers on this machine",
    implementation="podrun.targets.local:LocalWorkers",
    expected={"": "a mapping such as {workers: 2}", "workers": f"a number of workers from 1 to {MAX_WORKERS}"},
    flag=AdhocFlag("--local", "N", "N local CPU workers", type=whole_number),
    to_options=lambda value, extras: {"workers": value}, transport="local",
    summary=lambda local: counted(local.workers, "local worker"), worker_count=lambda local: local.workers)
