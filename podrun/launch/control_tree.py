"""Which workers a launch reaches through a control tree (transport/tree.py), and through which relay.

From PODRUN_CONTROL_TREE workers on (SSH workers only), every PODRUN_CONTROL_TREE_FANOUT + 1'th worker
is a relay, connected to from here, and the workers after it, up to the next relay, are reached through
it. Worker 0 is always a relay, so it (the job's hub and rendezvous) stays on a connection of the
launcher's. The defaults come from measurement (docs/benchmarks.md, "The control tree").
"""

from __future__ import annotations

import dataclasses
import os

from podrun.errors import UsageError
from podrun.output import counted
from podrun.plan import JobPlan, WorkerPlan
from podrun.transport.base import Transport

DEFAULT_FROM = 64
DEFAULT_FANOUT = 32
MAX_FANOUT = 1024


def settings() -> tuple[int | None, int]:
    """(the worker count from which the tree is used, or None: never; workers behind each relay)."""
    start = os.environ.get("PODRUN_CONTROL_TREE", "").strip() or str(DEFAULT_FROM)
    if start != "off" and not (start.isdigit() and int(start) >= 2):
        raise UsageError(f"PODRUN_CONTROL_TREE={start!r}: expected the worker count from which podrun reaches "
                         f"workers through relay workers, 2 or more, or off (default {DEFAULT_FROM})")
    fanout = os.environ.get("PODRUN_CONTROL_TREE_FANOUT", "").strip() or str(DEFAULT_FANOUT)
    if not (fanout.isdigit() and 1 <= int(fanout) <= MAX_FANOUT):
        raise UsageError(f"PODRUN_CONTROL_TREE_FANOUT={fanout!r}: expected how many workers each relay worker "
                         f"connects to, 1 to {MAX_FANOUT} (default {DEFAULT_FANOUT})")
    return (None if start == "off" else int(start)), int(fanout)


def relay_positions(job: JobPlan) -> list[int]:
    """Where the relays are in the job's plans, or [] where the launcher connects to every worker itself."""
    start, fanout = settings()
    plans = job.workers
    if start is None or len(plans) < start or any(plan.worker.transport.endpoint()["kind"] != "ssh" for plan in plans):
        return []
    return list(range(0, len(plans), fanout + 1))


def described(job: JobPlan) -> str:
    """How the launch reaches its workers, where a tree does: for the lines that say what a job runs on."""
    relays = relay_positions(job)
    if not relays:
        return ""
    first = ", ".join(str(job.workers[position].worker.index) for position in relays[:3])
    more = f" and {len(relays) - 3} more" if len(relays) > 3 else ""
    return f" (through {counted(len(relays), 'relay worker')}: {first}{more}; PODRUN_CONTROL_TREE)"


def arrange(job: JobPlan) -> JobPlan:
    """The job's plans, with the workers beyond the first level reached through relays (or as they were)."""
    relays = set(relay_positions(job))
    if not relays:
        return job
    # here, not at import: a launch on fewer workers, or local ones, never loads the SSH library
    from podrun.transport.ssh import SshTransport
    from podrun.transport.tree import Relay, RelayHead, SharedAgent, TreeTransport

    plans = job.workers
    agent = SharedAgent(plans[0].worker.transport.identity_file, len(relays))  # type: ignore[attr-defined]
    arranged: list[WorkerPlan] = []
    relay: Relay | None = None
    for position, plan in enumerate(plans):
        worker = plan.worker
        inner = worker.transport
        assert isinstance(inner, SshTransport)
        if position in relays:
            relay = Relay(inner, f"worker {worker.index} ({worker.address})", agent)
            transport: Transport = RelayHead(relay)
        else:
            assert relay is not None
            transport = TreeTransport(inner, relay, worker.internal_ip)
        arranged.append(dataclasses.replace(plan, worker=dataclasses.replace(worker, transport=transport)))
    return dataclasses.replace(job, workers=arranged)
