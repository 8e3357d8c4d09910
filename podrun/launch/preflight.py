"""Pre-flight checks before `run`: what would otherwise fail late and obscurely fails now, by name.

A target's own checks come with the agents' probes (Target.probe, Target.check_probes: the TPU
target names the processes that still hold the TPU).

Docker: with `docker` in the spec, every worker must have the docker CLI on the job's PATH.

torchrun: every worker must find torchrun on the job's PATH, of the same torch version (read from
the package metadata of the Python that runs torchrun, without importing torch). Checked right
before run, after setup (which may install it); a container brings its own.

Interfaces: where a worker's hostname resolves to loopback, gloo and NCCL would advertise it to the
other workers; its first step's agent sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to the interface
that reaches MASTER_ADDR unless the job sets either (remote/interfaces.py); the launcher keeps them
for the job's later steps, and says so where the job reads them (reads_interface_variables).

Shared home: where every worker's root is one directory (Target.shares_root: a cluster's shared
home), the code ships to one worker; every other must see it there, or the job would not find it.

Rendezvous: prove torchrun's rendezvous can work, in seconds.

Worker 0 listens briefly on the rendezvous port (failing if it is taken), and every worker opens a
TCP connection to worker 0's internal address on it. A failure names the worker and the address,
instead of torchrun's c10d timeout a minute later. The kernel completes the connections from the
listen backlog, so the listener never needs to accept them.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from dataclasses import replace

from podrun.errors import PodrunError
from podrun.output import counted, say
from podrun.plan import WorkerPlan, checks_interfaces
from podrun.remote import code_record, interfaces
from podrun.targets.base import Worker
from podrun.transport.base import ChannelLost

CONNECT_TIMEOUT_S = 5


@contextlib.asynccontextmanager
async def naming_lost_connections(worker: Worker, doing: str):
    """Turn a broken connection into one line that names the worker and what it was doing."""
    try:
        yield
    except ChannelLost as lost:
        raise PodrunError(f"worker {worker.index} ({worker.address}) lost its connection {doing} ({lost})") from None


async def check_docker(plans: list[WorkerPlan]) -> None:
    outcomes = await asyncio.gather(*(_has_docker(plan) for plan in plans))
    for plan, has_docker in zip(plans, outcomes):
        if not has_docker:
            worker = plan.worker
            raise PodrunError(f"worker {worker.index} ({worker.address}): no docker command on the job's PATH; "
                              f"install Docker there or remove docker: from the spec")


async def _has_docker(plan: WorkerPlan) -> bool:
    path = f"PATH={shlex.quote(plan.env['PATH'])} " if "PATH" in plan.env else ""
    channel = await plan.worker.transport.start(f"{path}command -v docker >/dev/null")
    async with naming_lost_connections(plan.worker, "during the docker check"):
        channel.stdin.write_eof()
        return await channel.wait() == 0


# prints "PATH VERSION" of the torchrun on the job's PATH; exits 3 when there is none
TORCHRUN_PROBE = ("t=$(command -v torchrun) || exit 3; python=$(sed -n '1s/^#! *//p' \"$t\"); "
                  "v=$(${python:-python3} -c 'import importlib.metadata as m; print(m.version(\"torch\"))' 2>/dev/null); "
                  'echo "$t ${v:--}"')  # -: its Python has no torch package
WORKERS_NAMED = 5  # a message names this many workers, then says how many more


async def check_torchrun(plans: list[WorkerPlan]) -> None:
    found = await asyncio.gather(*(_torchrun_of(plan) for plan in plans))
    missing = [plan.worker for plan, torchrun in zip(plans, found) if torchrun is None]
    having = _grouped((torchrun, plan.worker) for plan, torchrun in zip(plans, found) if torchrun)
    if missing:
        them = "".join(f"; {_named(group)} have {path} ({_torch(version)})" for (path, version), group in having.items())
        raise PodrunError(f"no torchrun on the job's PATH on {_named(missing)}{them}; install torch there "
                          f"(setup: can), or set PATH in env")
    versions = _grouped((version, worker) for (_, version), group in having.items() for worker in group)
    if len(versions) > 1:
        raise PodrunError("the workers' torchrun comes with different torch versions: " +
                          "; ".join(f"{_torch(version)} on {_named(group)}" for version, group in versions.items()) +
                          "; install one version everywhere")


def interface_probe(plans: list[WorkerPlan]) -> dict:
    """What the first step's agents check for the interface doctor (plan.checks_interfaces)."""
    return {"route_to": plans[0].env["MASTER_ADDR"]} if checks_interfaces(plans) else {}


def with_interfaces_set(plans: list[WorkerPlan], reports: list[dict]) -> list[WorkerPlan]:
    """The plans with the interface variables the agents set (their probe reports), for the job's
    later steps; says so in one line where the job can read them (reads_interface_variables)."""
    chosen = {plan.worker.index: report["interface_set"] for plan, report in zip(plans, reports)
              if report.get("interface_set")}
    if not chosen:
        return plans
    if reads_interface_variables(plans[0]):
        resolved = sorted({report["resolves_to"] or "nothing" for report in reports if report.get("interface_set")})
        workers = [plan.worker for plan in plans if plan.worker.index in chosen]
        groups = _grouped((chosen[worker.index], worker) for worker in workers)
        where = " and to ".join(f"{interface} on {_named(group)}" for interface, group in groups.items())
        say(f"set {' and '.join(interfaces.VARIABLES)} to {where}: the interface of the route to MASTER_ADDR "
            f"{plans[0].env['MASTER_ADDR']}, as the host name resolves to {' or '.join(resolved)} there, which gloo "
            f"and NCCL would advertise to the other workers. To choose otherwise, set either variable in the spec's "
            f"env or with --env (then podrun sets neither)")
    return [replace(plan, env={**plan.env, **dict.fromkeys(interfaces.VARIABLES, chosen[plan.worker.index])})
            if plan.worker.index in chosen else plan for plan in plans]


def reads_interface_variables(plan: WorkerPlan) -> bool:
    """Whether the job may read GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME: under torchrun (the spec's, or one
    its own command starts), or on GPUs, where NCCL carries torch's and JAX's collectives. A JAX job on
    CPUs (its gloo reads no variable) or a plain command gets them set all the same, without a word."""
    commands = f"{plan.setup or ''}\n{plan.run}"
    return (plan.term_leader_only or plan.env.get("PJRT_DEVICE") == "CUDA"
            or "torchrun" in commands or "torch.distributed" in commands)


def _torch(version: str) -> str:
    return "no torch package" if version == "-" else f"torch {version}"


def _grouped(pairs) -> dict:
    groups: dict = {}
    for key, worker in pairs:
        groups.setdefault(key, []).append(worker)
    return groups


async def _torchrun_of(plan: WorkerPlan) -> tuple[str, str] | None:
    path = f"PATH={shlex.quote(plan.env['PATH'])}; " if "PATH" in plan.env else ""
    channel = await plan.worker.transport.start(path + TORCHRUN_PROBE)
    async with naming_lost_connections(plan.worker, "during the torchrun check"):
        channel.stdin.write_eof()
        output, code = await asyncio.gather(channel.stdout.read(), channel.wait())
    torchrun, _, version = output.decode(errors="replace").strip().rpartition(" ")
    return (torchrun, version) if code == 0 and torchrun else None


def _named(workers: list[Worker]) -> str:
    """`worker 2 (10.0.0.3)`, `workers 0, 1 (10.0.0.1, 10.0.0.2)`, then `and N more`."""
    shown = workers[:WORKERS_NAMED]
    more = f" and {len(workers) - len(shown)} more" if len(workers) > len(shown) else ""
    noun = "worker" if len(workers) == 1 else "workers"
    return (f"{noun} {', '.join(str(w.index) for w in shown)} ({', '.join(w.address for w in shown)}){more}")


async def check_rendezvous(workers: list[Worker], port: int) -> None:
    first = workers[0]
    endpoint = f"{first.internal_ip}:{port}"
    listener = await first.transport.start_python("rendezvous_listener", str(port))
    try:
        async with naming_lost_connections(first, "during the rendezvous check"):
            answer = (await listener.stdout.readline()).decode().strip()
        if answer != "listening":
            reason = answer.removeprefix("busy ") or "the listener did not start"
            raise PodrunError(f"rendezvous port {port} is not free on worker 0 ({first.address}): {reason}; "
                              f"another job's torchrun may hold it; pick another torchrun.port")
        outcomes = await asyncio.gather(*(_can_reach(worker, first.internal_ip, port) for worker in workers))
    finally:
        with contextlib.suppress(ChannelLost):  # then the listener is gone already
            listener.stdin.write_eof()
        await asyncio.gather(listener.wait(), return_exceptions=True)
    for worker, unreachable in zip(workers, outcomes):
        if unreachable:
            raise PodrunError(f"worker {worker.index} ({worker.address}) cannot reach the rendezvous "
                              f"endpoint {endpoint} on worker 0: {unreachable}")


async def _can_reach(worker: Worker, ip: str, port: int) -> str | None:
    channel = await worker.transport.start_python("rendezvous_connector", ip, str(port), str(CONNECT_TIMEOUT_S))
    async with naming_lost_connections(worker, "during the rendezvous check"):
        channel.stdin.write_eof()
        output, code = await asyncio.gather(channel.stdout.read(), channel.wait())
    return None if code == 0 else output.decode().strip() or f"exit code {code}"



async def check_shared_code(plans: list[WorkerPlan], shipped_to: Worker) -> None:
    """The workers of `plans` see the code just shipped to `shipped_to`, in the home they all share."""
    async def sees(plan: WorkerPlan) -> bool:
        channel = await plan.worker.transport.start(f"test -e {shlex.quote(plan.code_dir + code_record.SUFFIX)}")
        channel.stdin.write_eof()
        return await channel.wait() == 0

    seen = await asyncio.gather(*(sees(plan) for plan in plans))
    blind = [plan.worker.address for plan, sees_it in zip(plans, seen) if not sees_it]
    if blind:
        shown = ", ".join(blind[:3]) + (f" and {counted(len(blind) - 3, 'more')}" if len(blind) > 3 else "")
        raise PodrunError(f"{shown} do(es) not see the code shipped to {shipped_to.address} ({plans[0].code_dir} in "
                          f"{shipped_to.transport.root}): its workers must share one home directory, where podrun "
                          f"ships the code once, and they do not")


def changed_code_line(index: int, named: list[str], count: int) -> str:
    """A worker's copy of the code that a job wrote into (remote/checkout.verify removed it)."""
    more = f" and {count - len(named)} more" if count > len(named) else ""
    them, copies = ("it", "a copy of it") if count == 1 else ("them", "copies of them")
    return (f"worker {index}: {counted(count, 'code file')} changed since it was shipped ({', '.join(named)}{more}): "
            f"a job wrote into {them} through the run directory; shipping the code again to restore {them} "
            f"(from now on the run directory gets {copies}, not links)")
