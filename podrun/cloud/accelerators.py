"""Cloud TPU accelerator types: `v4-32` -> generation, chips, hosts (workers), default runtime.

Google's naming (https://cloud.google.com/tpu/docs/system-architecture-tpu-vm, and the per-version
pages https://cloud.google.com/tpu/docs/v4, /v5p, /v5e, /v6e):
- v2, v3, v4 and v5p names count TensorCores, two per chip, four chips per host: hosts = cores / 8
  (v4-8 -> 1 host, v4-32 -> 4, v5p-12288 -> 1536).
- v5litepod (v5e) and v6e names count chips: up to 8 chips is one host, larger slices have 4 chips
  per host (v6e-16 -> 4 hosts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from podrun.errors import UsageError

# generation -> (what the number counts, largest slice, default runtime version)
GENERATIONS = {
    "v2": ("cores", 512, "tpu-ubuntu2204-base"),
    "v3": ("cores", 2048, "tpu-ubuntu2204-base"),
    "v4": ("cores", 8192, "tpu-ubuntu2204-base"),
    "v5p": ("cores", 17920, "v2-alpha-tpuv5"),
    "v5litepod": ("chips", 256, "v2-alpha-tpuv5-lite"),
    "v6e": ("chips", 256, "v2-alpha-tpuv6e"),
}
SINGLE_HOST_CHIP_COUNTS = (1, 4, 8)  # v5e and v6e slices that fit on one host
VALID_FORMS = ("v2-8..v2-512, v3-8..v3-2048, v4-8..v4-8192, v5p-8..v5p-17920 (TensorCores, a multiple of 8); "
               "v5litepod-N, v6e-N (chips: 1, 4, 8, or a multiple of 8 up to 256)")
TYPE_PATTERN = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)$")


@dataclass(frozen=True)
class AcceleratorType:
    name: str
    generation: str
    chips: int
    hosts: int
    default_runtime: str


def parse(name: str) -> AcceleratorType:
    match = TYPE_PATTERN.match(name)
    if not match:
        raise UsageError(f"unknown accelerator type {name!r}; expected one of: {VALID_FORMS}")
    generation, count = match[1], int(match[2])
    counts, largest, runtime = GENERATIONS[generation]
    if counts == "cores":
        valid = count % 8 == 0 and 8 <= count <= largest
        chips, hosts = count // 2, count // 8
    else:
        valid = count in SINGLE_HOST_CHIP_COUNTS or (count % 8 == 0 and count <= largest)
        chips, hosts = count, 1 if count <= 8 else count // 4
    if not valid:
        raise UsageError(f"accelerator type {name!r} has no valid size; expected one of: {VALID_FORMS}")
    return AcceleratorType(name, generation, chips, hosts, runtime)
