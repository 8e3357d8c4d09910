"""Preflight, the health check before run (`preflight` in the spec): what would make a big job hang at its
start, or crawl, found in seconds and named, before anything of the job's run starts.

On every worker at once, the job's own python3 (on the job's PATH: what the job will import) reads its
facts (remote/health_facts.py): the accelerator devices the target promises (Target.promised_devices: a
TPU type's chips per host, torchrun.nproc_per_node GPUs) and what holds them, its Python and framework
versions, the free disk where the job runs. A worker that lacks devices, differs from the others' versions
(the most workers' versions are right), or has less than min_free_gb free fails.

The network check (remote/health_network.py) then joins every worker in torch.distributed with the job's
backend (NCCL on GPUs, else gloo), all-reduces network_mib twice and times rounds in which every worker
receives from a neighbour: its rate from each of two neighbours. A worker whose every link out (or in)
carries less than a SLOW_SHARE of the median link is slow: named. It needs torch on the workers; without
any, it is skipped, and the line says so. The whole check is bounded by preflight.timeout.

A failing check raises WorkersUnhealthy, one line naming each failing worker and why: they are left out
as lost workers are, where the target has spares (holding.replace_lost).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import statistics
import time

from podrun.errors import WorkersUnhealthy
from podrun.output import counted, say, size_text
from podrun.plan import WorkerPlan
from podrun.targets.base import Worker
from podrun.transport.base import ChannelLost, remote_source

PREFIX = "preflight: "
SLOW_SHARE = 1 / 3  # of the median link's rate: a worker below it on every link is far behind
NETWORK_VARIABLES = ("PATH", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")  # and every NCCL_* and GLOO_* the job sets


def failed_it(summary: str | None) -> bool:
    """Whether an attempt's summary is a preflight's failure (its workers left out as failed, not lost)."""
    return summary is not None and summary.startswith(PREFIX)


async def check(plans: list[WorkerPlan], preflight: dict) -> None:
    started = time.monotonic()
    deadline = started + preflight["timeout_s"]
    facts = await _everywhere(plans, deadline, "health_facts", "the health check",
                              lambda rank, plan: [os.path.dirname(plan.code_dir) or ".", json.dumps(preflight["devices"])])
    failing: dict[int, list[str]] = {}
    checks = preflight["checks"]
    if "devices" in checks and preflight["devices"]:
        _devices(plans, facts, preflight["devices"], failing)
    if "versions" in checks:
        _versions(plans, facts, failing)
    if "disk" in checks:
        _disk(plans, facts, preflight["min_free_gb"], failing)
    _raise_named(plans, failing)
    network = ""
    if "network" in checks:
        network = await _network(plans, facts, preflight, deadline)
    say(PREFIX + f"{counted(len(plans), 'worker')} healthy in {time.monotonic() - started:.1f}s: "
        + _summary(facts, preflight) + network)


def _summary(facts: list[dict], preflight: dict) -> str:
    versions = [f"Python {facts[0]['python']}"] + [f"{name} {version}" for name, version in facts[0]["frameworks"].items()
                                                   if name != "numpy"]
    said = [", ".join(versions)]
    if "disk" in preflight["checks"]:
        said.append(f"{size_text(min(each['free_bytes'] for each in facts))} free or more")
    if preflight["devices"] and "devices" in preflight["checks"]:
        said.append(f"{counted(preflight['devices']['count'], preflight['devices']['kind'])} each")
    return "; ".join(said)


def _raise_named(plans: list[WorkerPlan], failing: dict[int, list[str]]) -> None:
    if not failing:
        return
    workers = {plan.worker.index: plan.worker for plan in plans}
    named = "; ".join(f"worker {index} ({workers[index].address}) {' and '.join(why)}"
                      for index, why in sorted(failing.items()))
    raise WorkersUnhealthy(f"{PREFIX}{named}; nothing of the job ran", sorted(failing))


def _devices(plans: list[WorkerPlan], facts: list[dict], promised: dict, failing: dict[int, list[str]]) -> None:
    kind, count = promised["kind"], promised["count"]
    for plan, found in zip(plans, facts):
        why = failing.setdefault(plan.worker.index, [])
        if found["devices"] is None:
            why.append(f"shows no {kind}s ({found['devices_error']}), of the {count} {promised['why']} promises")
        elif found["devices"] < count:
            why.append(f"has {found['devices']} of the {count} {kind}s {promised['why']} promises")
        if found["busy"]:
            why.append(f"has its {kind}s in use ({', '.join(found['busy'][:3])})")
        if not why:
            del failing[plan.worker.index]


def _versions(plans: list[WorkerPlan], facts: list[dict], failing: dict[int, list[str]]) -> None:
    """Python's and each framework's version, where any worker has it: the most workers' is right. A worker
    apart: `has Python 3.11.2 (the others 3.11.7), torch 2.12.0 (the others 2.13.0) and no jax (which the
    others have) in the job's python3`."""
    names = sorted({name for found in facts for name in found["frameworks"]})
    differing: dict[int, list[str]] = {}
    missing: dict[int, list[str]] = {}
    for name, version_of in [("Python", lambda found: found["python"])] + [
            (name, lambda found, name=name: found["frameworks"].get(name)) for name in names]:
        groups: dict[str | None, list[int]] = {}
        for plan, found in zip(plans, facts):
            groups.setdefault(version_of(found), []).append(plan.worker.index)
        right = max(groups, key=lambda version: (len(groups[version]), version is not None, -groups[version][0]))
        for version, indexes in groups.items():
            for index in indexes if version != right else ():
                if version is None:
                    missing.setdefault(index, []).append(name)
                else:
                    differing.setdefault(index, []).append(f"{name} {version} (the others {right or 'none'})")
    for index in sorted({*differing, *missing}):
        has = differing.get(index, []) + ([f"no {', '.join(missing[index])} (which the others have)"]
                                          if index in missing else [])
        failing.setdefault(index, []).append(
            f"has {', '.join(has[:-1]) + ' and ' + has[-1] if len(has) > 1 else has[0]} in the job's python3")


def _disk(plans: list[WorkerPlan], facts: list[dict], min_free_gb: float, failing: dict[int, list[str]]) -> None:
    for plan, found in zip(plans, facts):
        if found["free_bytes"] < min_free_gb * 2 ** 30:  # as size_text counts a GB
            failing.setdefault(plan.worker.index, []).append(
                f"has {size_text(found['free_bytes'])} free where the job runs, below preflight.min_free_gb "
                f"({min_free_gb:g})")


async def _network(plans: list[WorkerPlan], facts: list[dict], preflight: dict, deadline: float) -> str:
    """The all-reduce and each worker's rate from its neighbours: what the line says of them."""
    without = [plan.worker.index for plan, found in zip(plans, facts) if "torch" not in found["frameworks"]]
    if len(without) == len(plans):
        return "; network not checked: the job's python3 has no torch, which the check runs"
    _raise_named(plans, {index: ["has no torch in the job's python3, which the network check runs"]
                         for index in without})
    if len(plans) == 1:
        return ""
    first = plans[0]
    common = [str(len(plans)), first.worker.internal_ip]
    backend = preflight["backend"]
    tail = [backend, str(preflight["network_mib"] << 20), f"{max(deadline - time.monotonic(), 1):.0f}"]
    store = await _start(first, "health_network", ["0", *common, "0", *tail])
    port = (await _next_report(first.worker, store, deadline, "the network check"))["port"]
    first_report, others = await asyncio.gather(
        _output_of(first, store, deadline, "the network check"),
        _everywhere(plans[1:], deadline, "health_network", "the network check",
                    lambda rank, plan: [str(rank + 1), *common, str(port), *tail]))
    reports = [first_report, *others]
    return _judged_links(plans, reports, preflight["network_mib"])


def _judged_links(plans: list[WorkerPlan], reports: list[dict], mib: int) -> str:
    links = {(int(source), rank): rate for rank, report in enumerate(reports)
             for source, rate in report["received"].items()}
    median = statistics.median(links.values())
    slow = {link for link, rate in links.items() if rate < median * SLOW_SHARE}
    failing: dict[int, list[str]] = {}
    for rank, plan in enumerate(plans):
        out = [link for link in links if link[0] == rank]
        into = [link for link in links if link[1] == rank]
        for direction, its in (("sent", out), ("received", into)):
            if len(its) > 1 or len(plans) == 2:  # two workers' one link in each direction: its both ends named
                if all(link in slow for link in its):
                    failing.setdefault(plan.worker.index, []).append(
                        f"{direction} at {_rate(max(links[link] for link in its))} on the network, far below the "
                        f"median link's {_rate(median)}")
    _raise_named(plans, failing)
    allreduce_s = max(report["allreduce_s"] for report in reports)
    return (f"; all-reduce of {mib} MiB in {allreduce_s:.3f}s, each worker receiving at "
            f"{_rate(min(links.values()))} to {_rate(max(links.values()))}")


def _rate(bytes_per_s: float) -> str:
    return f"{size_text(int(bytes_per_s))}/s"


async def _everywhere(plans: list[WorkerPlan], deadline: float, script: str, doing: str, arguments) -> list[dict]:
    """Each plan's worker's JSON report from `script`, run by the job's python3 with `arguments(position, plan)`
    (its position in `plans`); `doing` names the check in a failure's line."""
    async def one(position: int, plan: WorkerPlan) -> dict:
        channel = await _start(plan, script, arguments(position, plan))
        return await _output_of(plan, channel, deadline, doing)

    return list(await asyncio.gather(*(one(position, plan) for position, plan in enumerate(plans))))


async def _start(plan: WorkerPlan, script: str, arguments: list[str]):
    """`script` run by the job's own python3, its source on stdin, the job's PATH and network variables set."""
    env = {key: value for key, value in plan.env.items()
           if key in NETWORK_VARIABLES or key.startswith(("NCCL_", "GLOO_"))}
    exported = f"export {' '.join(f'{key}={shlex.quote(value)}' for key, value in env.items())}; " if env else ""
    channel = await plan.worker.transport.start(
        f"{exported}exec python3 - {' '.join(shlex.quote(arg) for arg in arguments)} 2>&1")
    channel.stdin.write(remote_source(script))
    channel.stdin.write_eof()
    return channel


async def _output_of(plan: WorkerPlan, channel, deadline: float, doing: str) -> dict:
    """The script's report, once it ended."""
    report = await _next_report(plan.worker, channel, deadline, doing)
    await _bounded(plan.worker, channel.wait(), deadline, doing)
    return report


async def _next_report(worker: Worker, channel, deadline: float, doing: str) -> dict:
    """The next JSON line of the script's output (its stderr's warnings in between are passed over); at its
    end without one, a failure naming the worker with the last line it said (a traceback's, often)."""
    said = ""
    while line := await _bounded(worker, channel.stdout.readline(), deadline, doing):
        text = line.decode(errors="replace").strip()
        if text.startswith("{"):
            try:
                return json.loads(text)
            except ValueError:
                pass
        said = text or said
    raise WorkersUnhealthy(f"{PREFIX}worker {worker.index} ({worker.address}): {doing} failed"
                           + (f": {said}" if said else "") + "; nothing of the job ran", [worker.index])


async def _bounded(worker: Worker, work, deadline: float, doing: str):
    try:
        return await asyncio.wait_for(work, max(deadline - time.monotonic(), 0))
    except asyncio.TimeoutError:
        raise WorkersUnhealthy(f"{PREFIX}worker {worker.index} ({worker.address}) did not finish {doing} within "
                               f"preflight.timeout; nothing of the job ran", [worker.index]) from None
    except ChannelLost as lost:
        raise WorkersUnhealthy(f"{PREFIX}worker {worker.index} ({worker.address}) lost its connection during "
                               f"{doing} ({lost})", [worker.index]) from None

