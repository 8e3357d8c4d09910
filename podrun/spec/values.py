"""The spec's scalar values, parsed as its fields and the command line's flags take them: durations
(`stop_grace`, `stall`, `idle_delete`, `exec --grace`) and choices taken in any case."""

from __future__ import annotations

from typing import Any

from podrun.spec.fields import duration_s, got
from podrun.spec.messages import EXPECTED

MAX_STOP_GRACE_S = 3600.0


def parse_stop_grace(value: Any) -> float:
    """`stop_grace` (and `exec --grace`): a duration from 0s to 1h, a number being seconds -> seconds."""
    seconds = _seconds(value)
    if seconds is None or not 0 <= seconds <= MAX_STOP_GRACE_S:  # NaN fails the comparison too
        raise ValueError(f"expected {EXPECTED['stop_grace']}, got {got(value)}")
    return float(seconds)


STALL_AUTO = "auto"


def parse_stall(value: Any) -> float | str:
    """`stall` (and `exec --stall`): a duration above 0, a number being seconds -> seconds; or `auto`
    (launch/stall.py derives the bound from the job's step times)."""
    if isinstance(value, str) and value.strip().lower() == STALL_AUTO:
        return STALL_AUTO
    return above_zero(value, "stall")


def parse_idle_delete(value: Any) -> float:
    """`idle_delete` (and `create --idle-delete`): a duration above 0, a number being seconds -> seconds."""
    return above_zero(value, "idle_delete")


def above_zero(value: Any, field: str) -> float:
    seconds = _seconds(value)
    if seconds is None or not 0 < seconds < float("inf"):  # NaN fails the comparison too
        raise ValueError(f"expected {EXPECTED[field]}, got {got(value)}")
    return float(seconds)


def _seconds(value: Any) -> float | None:
    """A duration's seconds (`90`, `1m30s`, 90), or None if it is none."""
    return duration_s(value) if isinstance(value, str) else value if type(value) in (int, float) else None


def lower_choice(field: str, choices: tuple[str, ...]):
    def parse(value: Any) -> Any:
        if isinstance(value, str) and value.lower() in choices:
            return value.lower()
        raise ValueError(f"expected {EXPECTED[field]}, got {got(value)}")
    return parse
