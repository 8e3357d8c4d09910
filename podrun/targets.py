"""Resolve a spec's target to its workers, in rank order, each carrying its transport."""

from __future__ import annotations

from dataclasses import dataclass

from podrun import paths
from podrun.errors import PodrunError
from podrun.spec import JobSpec
from podrun.transport import LocalTransport, Transport

LOCAL_IP = "127.0.0.1"


@dataclass(frozen=True)
class Worker:
    index: int
    address: str  # what podrun connects to, as shown to the user
    internal_ip: str  # what the workers use to reach each other (rendezvous, PODRUN_WORKER_IPS)
    transport: Transport


def resolve_workers(spec: JobSpec) -> list[Worker]:
    target = spec.target
    if target.local is not None:
        return [Worker(index, f"local/w{index}", LOCAL_IP, LocalTransport(paths.local_worker_root(index)))
                for index in range(target.local.workers)]
    raise PodrunError(f"target '{target.kind}' is not supported by this version of podrun yet; use target: local")
