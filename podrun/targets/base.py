"""What a target is to the rest of podrun: its workers, in rank order, each carrying its transport,
and the few things only the target knows (its device, container flags, checks before a run). What
the workers run on, made, lost and given back, is its capacity (podrun/capacity/).

launch, plan and the commands work with a Target and its Workers; only the modules beside this one
know what a TPU VM, an SSH host or a local worker is.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from podrun.capacity.base import Capacity
from podrun.output import counted
from podrun.spec.model import JobSpec
from podrun.target_kinds import registry
from podrun.transport.base import Transport

JAX_COORDINATOR_PORT = 8476  # the port JAX's own Cloud TPU detection gives its coordinator


@dataclass(frozen=True)
class Worker:
    index: int
    address: str  # what podrun connects to, as shown to the user
    internal_ip: str  # what the workers use to reach each other (rendezvous, PODRUN_WORKER_IPS)
    transport: Transport
    slice: tuple[int, int] | None = None  # on a multislice TPU: (its slice, its worker id in the slice)


class Target(ABC):
    """Where a job runs, as its spec says."""

    worker_noun: str  # what one of its workers is called in messages ("SSH host")
    default_device: str  # PJRT_DEVICE when the spec sets no `device`
    container_flags: tuple[str, ...] = ()  # what `docker run` needs here beyond podrun's usual flags
    shares_root = False  # whether every worker's root is one directory (a cluster's shared home): code ships once
    # variables of the worker's starting environment that torchrun's ranks must not see (plan.py): on Slurm, the
    # srun step's own, which say one task per node where torchrun runs several ranks
    rank_env_removed: tuple[str, ...] = ()
    capacity: Capacity  # what its workers run on (capacity/): a kind that holds something has its own

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.capacity = Capacity()

    @property
    def options(self) -> Any:
        """The spec's options for this kind of target (target_kinds/<kind>.py's model)."""
        return self.spec.target.options

    @abstractmethod
    def workers(self, dry_run: bool) -> list[Worker]:
        """The workers in rank order, ready to connect to. With dry_run nothing changes anywhere."""

    def ssh_hosts(self) -> list[str]:
        """The SSH hosts the spec names (`user@host:port` entries) that a supervisor host would connect to:
        the keys this machine holds for them travel with a handover (supervisor/handover.py)."""
        return []

    def record_label(self, workers: list[Worker]) -> str:
        """What `podrun jobs` shows it as: its kind and worker count, and what the kind adds (a Slurm job id)."""
        return f"{self.spec.target.kind}:{len(workers)}"

    def describe(self, workers: list[Worker]) -> str:
        """One line saying what the job runs on, for --dry-run."""
        return counted(len(workers), self.worker_noun)

    def price(self) -> dict:
        """What its workers cost per hour, as the job's record keeps it (cloud/prices.py), once workers() has
        answered: {"per_hour": X, "source": ...}, or {"per_hour": None, "why": ...}. Only Google's TPUs have
        a price table; the spec's cost.per_hour, which overrides it, is the only price of other kinds."""
        return {"per_hour": None, "why": f"a {self.spec.target.kind} target has no price table: its cost comes only "
                                         f"from the spec's cost.per_hour"}

    def worker_env(self, worker: Worker, workers: list[Worker]) -> dict[str, str]:
        """Variables the target adds for this worker (the user's `env` may override them). JAX reads
        JAX_COORDINATOR_ADDRESS itself; on a TPU VM it finds its coordinator in the VM's metadata
        instead, and the TPU target adds its own variables."""
        return {"JAX_COORDINATOR_ADDRESS": f"{workers[0].internal_ip}:{JAX_COORDINATOR_PORT}"}

    def promised_devices(self) -> dict | None:
        """The accelerators each worker must have, for preflight's devices check (launch/health.py): {kind
        (what one is called), count, why (what promises them)}; None where nothing is promised. On GPUs,
        torchrun.nproc_per_node's."""
        torchrun = self.spec.torchrun
        if (self.spec.device or self.default_device) in ("CUDA", "ROCM") and torchrun \
                and isinstance(torchrun.nproc_per_node, int):
            return {"kind": "GPU", "count": torchrun.nproc_per_node, "why": "torchrun.nproc_per_node"}
        return None

    def probe(self, kill_stale: bool) -> dict:
        """What each first-step agent checks before anything starts, beyond the code (agent.py)."""
        return {}

    def check_probes(self, reports: list[tuple[Worker, dict]], kill_stale: bool) -> None:
        """Raise PodrunError if the agents' probe reports say the job must not start."""


def target_for(spec: JobSpec) -> Target:
    """The target the spec names, its module imported now."""
    module, _, name = registry.kind(spec.target.kind).implementation.partition(":")
    target: type[Target] = getattr(importlib.import_module(module), name)
    return target(spec)
