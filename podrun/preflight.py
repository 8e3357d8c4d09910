"""Pre-flight checks before `run`: what would otherwise fail late and obscurely fails now, by name.

TPU devices: a process left from an earlier run that still holds /dev/accel* (or /dev/vfio/*, or
libtpu's lockfile) makes the next run die with "TPU in use". Before a TPU job starts, every worker's
agent searches for such processes (agent.tpu_holders, in its probe); they are named here with their
PIDs and command lines, and killed only when the user asks (exec --kill-stale).

Docker: with `docker` in the spec, every worker must have the docker CLI on the job's PATH.

Rendezvous: prove torchrun's rendezvous can work, in seconds.

Worker 0 listens briefly on the rendezvous port (failing if it is taken), and every worker opens a
TCP connection to worker 0's internal address on it. A failure names the worker and the address,
instead of torchrun's c10d timeout a minute later. The kernel completes the connections from the
listen backlog, so the listener never needs to accept them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex

from podrun.errors import PodrunError
from podrun.output import say
from podrun.plan import WorkerPlan
from podrun.targets import Worker, naming_lost_connections
from podrun.transport import ChannelLost

CONNECT_TIMEOUT_S = 5
LISTENER = """\
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    server.bind(("", int(sys.argv[1])))
    server.listen(4096)
except OSError as error:
    print("busy", error.strerror, flush=True)
    sys.exit(1)
print("listening", flush=True)
sys.stdin.read()  # until the launcher is done
"""
CONNECTOR = """\
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
except OSError as error:
    print(error.strerror or "timed out", flush=True)
    sys.exit(1)
"""


# where the TPU runtime's files are; PODRUN_ACCELERATOR_FILES (glob patterns, colon-separated)
# replaces the list, for images that put them elsewhere
ACCELERATOR_FILES = "/dev/accel*:/dev/vfio/[0-9]*:/tmp/libtpu_lockfile"
STALE_KILL_GRACE_S = 3


def accelerator_files() -> str:
    return os.environ.get("PODRUN_ACCELERATOR_FILES", ACCELERATOR_FILES)


def report_tpu_holders(found: list[tuple[Worker, str]], kill: bool) -> None:
    """Given each worker's holders as its agent's probe reported them ("pid TAB file TAB command"
    lines): fail, naming them, or with `kill` (they are gone already) say so and go on."""
    lines = []
    for worker, holders in found:
        for line in holders.splitlines():
            pid, path, command = line.split("\t", 2)
            lines.append(f"worker {worker.index} ({worker.address}): pid {pid} holds {path}: {command}")
    if lines and kill:
        say(f"killed {len(lines)} process(es) that held the TPU:\n  " + "\n  ".join(lines))
    elif lines:
        raise PodrunError("the TPU is in use on the workers (left from an earlier run?):\n  " + "\n  ".join(lines)
                          + "\nstop them, or run again with --kill-stale to have podrun kill them")


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


async def check_rendezvous(workers: list[Worker], port: int) -> None:
    first = workers[0]
    endpoint = f"{first.internal_ip}:{port}"
    listener = await first.transport.start_python(LISTENER, str(port))
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
    channel = await worker.transport.start_python(CONNECTOR, ip, str(port), str(CONNECT_TIMEOUT_S))
    async with naming_lost_connections(worker, "during the rendezvous check"):
        channel.stdin.write_eof()
        output, code = await asyncio.gather(channel.stdout.read(), channel.wait())
    return None if code == 0 else output.decode().strip() or f"exit code {code}"

