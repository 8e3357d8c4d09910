"""The kinds of target podrun knows, by name, as torchx knows its schedulers: each declared by its
options module (KIND_MODULES, in the order the spec, the schema and the CLI list them). A new kind is
a new target_kinds/<kind>.py and its target module, and a line here."""

from __future__ import annotations

import importlib
from functools import cache

from podrun.target_kinds.kind import TargetKind

KIND_MODULES = ("podrun.target_kinds.tpu", "podrun.target_kinds.hosts", "podrun.target_kinds.local",
                "podrun.target_kinds.slurm")
DEFAULT_KIND = "local"  # a spec without `target:` runs on local CPU workers


@cache
def kinds() -> tuple[TargetKind, ...]:
    return tuple(importlib.import_module(module).KIND for module in KIND_MODULES)


def kind(name: str) -> TargetKind:
    return next(declared for declared in kinds() if declared.name == name)


def names() -> list[str]:
    return [declared.name for declared in kinds()]


def siblings() -> dict[str, TargetKind]:
    """The fields beside a kind under `target:` that only that kind takes (`spares`: hosts), by name."""
    return {name: declared for declared in kinds() for name in declared.siblings}
