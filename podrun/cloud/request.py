"""What podrun asks Google for: one TPU VM, directly or through a queued resource, or a multislice
(docs/targets/tpu.md: A TPU's whole life, Multislice). Plain data, shared by cloud/capacity.py, which creates it,
and cloud/tpu_api.py, which sends it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from podrun.cloud import accelerators

NODE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?\Z")  # Google's rule for a TPU VM's (and a queued resource's) name
NODE_NAME_RULE = "lowercase letters, digits and dashes, starting with a letter, at most 63 characters"


@dataclass(frozen=True)
class TpuRequest:
    """What to create: a TPU VM `name` of `accelerator_type`, directly or through a queued resource
    of the same name (`queued`, which a reservation and slices imply); with `slices`, a multislice:
    one queued resource `name` for the nodes NAME-0 .. NAME-(N-1)."""

    name: str
    accelerator_type: str
    runtime_version: str
    queued: bool = False
    spot: bool = False
    reservation: str | None = None
    valid_for_s: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)  # the node's: `ssh-keys` lets exec in without an update
    slices: int = 1
    # networkConfig.enableExternalIps, which the API takes as false when it is left out; gcloud
    # sends true unless --internal-ips, and without it a laptop cannot reach the workers
    external_ips: bool = True
    labels: dict[str, str] = field(default_factory=dict)  # who owns it (cloud/labels.py), on every node it makes

    @property
    def through_queue(self) -> bool:
        return through_queue(self.queued, self.reservation, self.slices)

    @property
    def node_names(self) -> list[str]:
        return multislice_node_names(self.name, self.slices) if self.slices > 1 else [self.name]

    def summary(self) -> str:
        """`v4-32: 4 workers, runtime tpu-ubuntu2204-base, spot, queued for at most 6h`;
        `2 x v4-16: 2 slices of 2 workers, ...`."""
        hosts = accelerators.parse(self.accelerator_type).hosts
        workers = f"{hosts} worker{'s' * (hosts > 1)}"
        shape = (f"{self.slices} x {self.accelerator_type}: {self.slices} slices of {workers}" if self.slices > 1
                 else f"{self.accelerator_type}: {workers}")
        parts = [shape, f"runtime {self.runtime_version}"]
        parts += ["spot"] * self.spot + [f"reservation {self.reservation}"] * bool(self.reservation)
        parts += ["internal IPs only"] * (not self.external_ips)
        if self.through_queue:
            parts.append(f"queued for at most {duration_text(self.valid_for_s)}" if self.valid_for_s else "queued")
        return ", ".join(parts)


def through_queue(queued: bool, reservation: str | None, slices: int | None) -> bool:
    """Whether a TPU is asked for through a queued resource, where `valid_for` has a meaning: when asked
    to, and always for a reservation or several slices (create's flags and a spec's fields alike)."""
    return queued or reservation is not None or (slices or 1) > 1


def multislice_node_names(name: str, slices: int) -> list[str]:
    """The nodes of a multislice queued resource: multisliceParams.nodeIdPrefix `name`, `-0` on."""
    return [f"{name}-{index}" for index in range(slices)]


def duration_text(seconds: float) -> str:
    """`6h`, `1h30m`, `45m`, `1m30s`, `10s`: as exact as the duration asked for."""
    hours, rest = divmod(round(seconds), 3600)
    parts = [(hours, "h"), *zip(divmod(rest, 60), "ms")]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    while len(parts) > 1 and parts[-1][0] == 0:
        parts.pop()
    (first, unit), *rest_parts = parts
    return f"{first}{unit}" + "".join(f"{value:02d}{unit}" for value, unit in rest_parts)
