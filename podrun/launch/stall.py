"""A stalled job (the spec's `stall`): how its silence is told, and how a detached job's agents watch it.

An attached job is watched by its launcher (Launch, which sees every worker's output); a detached one
by worker 0's agent (agent.Hub), which each other agent tells of its output as "alive", at most every
alive_every(stall) seconds: a job's silence is seen that much late at most, and a chatty job costs
one message per worker per interval, never one per line.
"""

from __future__ import annotations

from podrun.output import duration_text, worker_ranges

ALIVE_EVERY_S = 5.0


def alive_every(stall_s: float) -> float:
    """How often, at most, a detached job's agent tells the hub that its worker printed something."""
    return min(ALIVE_EVERY_S, stall_s / 4)


def summary(silent_s: dict[int, float]) -> str:
    """`no output from any worker for 3.0s (w0-2 silent 3.0s, w3 silent 12.4s)`: workers silent for
    the same time (as duration_text shows it) are named as ranges."""
    by_silence: dict[str, list[int]] = {}
    for index, seconds in sorted(silent_s.items(), key=lambda item: item[1]):
        by_silence.setdefault(duration_text(seconds), []).append(index)
    shortest = min(silent_s.values())
    return (f"no output from any worker for {duration_text(shortest)} ("
            + ", ".join(f"{worker_ranges(indexes)} silent {silence}" for silence, indexes in by_silence.items()) + ")")
