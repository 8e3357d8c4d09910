"""Cloud TPU accelerator types: `v4-32` -> generation, chips, hosts (workers), default runtime.

Google's naming (https://cloud.google.com/tpu/docs/system-architecture-tpu-vm, and the per-version
pages https://cloud.google.com/tpu/docs/v4, /v5p, /v5e, /v6e):
- v2, v3, v4 and v5p names count TensorCores, two per chip, four chips per host: hosts = cores / 8
  (v4-8 -> 1 host, v4-32 -> 4, v5p-12288 -> 1536).
- v5litepod (v5e) and v6e names count chips: up to 8 chips is one host, larger slices have 4 chips
  per host (v6e-16 -> 4 hosts).

The sizes each generation comes in (https://cloud.google.com/tpu/docs/types-topologies and the
per-version pages): v2 8, 32, 128, 256, 512; v3 8, 32, 64 ... 2048; v5litepod and v6e 1, 4, 8, 16,
32, 64, 128, 256 chips (1x1 ... 16x16). v4 and v5p slices are 3-D shapes AxBxC of chips: below a
cube 2x2x1, 2x2x2, 2x2x4, 2x4x4 (v4-8, -16, -32, -64), else every side a multiple of 4, so whole
4x4x4 cubes (128 TensorCores each) up to the largest slice: a v4 pod's 4096 chips (v4-8192), v5p's
16x16x24 (6144 chips, v5p-12288). v5litepod-24 or v4-40 are no slice of any shape.

The zones each generation is offered in (ZONES) are Google's table "TPU regions and zones"
(https://cloud.google.com/tpu/docs/regions-zones), as read on ZONES_AS_OF: a zone of `target.tpu.zones`
or `create --zones` that it does not list for the type is one warning line before anything is asked
for, and podrun asks there all the same: Google adds zones, so the table may be behind the API,
whose answer decides. A name that is no zone's at all (ZONE_NAME) is an error.

Names are taken in any case (`V4-8` is v4-8). Other spellings are refused with the name the API
takes: Google's docs call v5litepod "v5e", but the API, the console, quotas and `podrun list` say
v5litepod, so a spec or a script that says v5e would not match what every other place shows.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from podrun.errors import UsageError

SUB_CUBE_CORES = (8, 16, 32, 64)  # v4 and v5p slices smaller than a cube: 2x2x1, 2x2x2, 2x2x4, 2x4x4 chips
CUBE_CORES = 128  # a 4x4x4 cube of chips; larger v4 and v5p slices are made of whole cubes
CHIP_COUNTS = (1, 4, 8, 16, 32, 64, 128, 256)  # v5e and v6e: 1x1, 2x2, 2x4, 4x4 ... 16x16
# generation -> (what the number counts, the sizes it comes in, default runtime version)
GENERATIONS = {
    "v2": ("cores", (8, 32, 128, 256, 512), "tpu-ubuntu2204-base"),
    "v3": ("cores", (8, 32, 64, 128, 256, 512, 1024, 2048), "tpu-ubuntu2204-base"),
    "v4": ("cores", SUB_CUBE_CORES + tuple(CUBE_CORES * cubes for cubes in range(1, 64 + 1)), "tpu-ubuntu2204-base"),
    "v5p": ("cores", SUB_CUBE_CORES + tuple(CUBE_CORES * cubes for cubes in range(1, 96 + 1)), "v2-alpha-tpuv5"),
    "v5litepod": ("chips", CHIP_COUNTS, "v2-alpha-tpuv5-lite"),
    "v6e": ("chips", CHIP_COUNTS, "v2-alpha-tpuv6e"),
}
MAX_SLICES = 256  # slices in one multislice job (target.tpu.slices, create --slices)
TYPE_PATTERN = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)$")
# what people also write: a generation by another name, another separator, a `tpu` prefix, no size
LOOSE_PATTERN = re.compile(r"^(?:tpu[-_ ]?)?(v\d+[a-z]*|trillium)[-_ ]*(\d*)$")
GENERATION_ALIASES = {"v5e": "v5litepod", "v5lite": "v5litepod", "v6": "v6e", "trillium": "v6e"}
SEE_HELP = "(podrun create --help lists the generations)"
ZONES_AS_OF = "2026-11-27"
ZONE_NAME = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]\Z")  # a region (us-central2, europe-west4) and a letter
ZONES = {
    "v2": ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "europe-west4-a", "asia-east1-c"),
    "v3": ("us-central1-a", "us-central1-b", "us-central1-f", "europe-west4-a"),
    "v4": ("us-central2-b",),
    "v5p": ("us-central1-a", "us-east5-a", "us-east5-b", "us-east5-c", "us-south1-a", "europe-west4-b"),
    "v5litepod": ("us-central1-a", "us-east5-a", "us-east5-b", "us-east5-c", "us-south1-a", "us-west1-c", "us-west4-a",
                  "us-west4-b", "europe-west4-b", "asia-southeast1-b"),
    "v6e": ("us-central1-b", "us-east1-d", "us-east4-a", "us-east4-b", "us-east5-a", "us-east5-b", "us-east5-c",
            "us-west1-c", "europe-west4-a", "asia-northeast1-b", "southamerica-east1-c"),
}


@dataclass(frozen=True)
class AcceleratorType:
    name: str
    generation: str
    chips: int
    hosts: int
    default_runtime: str


def parse(name: str) -> AcceleratorType:
    match = TYPE_PATTERN.match(name.strip().lower())
    if not match or int(match[2]) not in valid_sizes(match[1]):
        raise UsageError(_not_valid(name, known_generation=match is not None))
    generation, count = match[1], int(match[2])
    counts, _, runtime = GENERATIONS[generation]
    if counts == "cores":
        chips, hosts = count // 2, count // 8
    else:
        chips, hosts = count, 1 if count <= 8 else count // 4
    return AcceleratorType(match[0], generation, chips, hosts, runtime)


def valid_sizes(generation: str) -> list[int]:
    """The sizes a generation's slices come in, ascending."""
    return list(GENERATIONS[generation][1])


def suggestions(name: str) -> list[str]:
    """The valid types a user most likely meant: the same size under the API's name for the
    generation, or the nearest sizes of that generation."""
    match = LOOSE_PATTERN.match(name.strip().lower())
    if not match:
        return []
    generation = GENERATION_ALIASES.get(match[1], match[1])
    if generation not in GENERATIONS:
        return []
    sizes = valid_sizes(generation)
    count = int(match[2]) if match[2] else sizes[0]
    if count in sizes:
        return [f"{generation}-{count}"]
    above = bisect.bisect(sizes, count)
    return [f"{generation}-{size}" for size in sizes[max(above - 1, 0):above + 1]]


def _not_valid(name: str, known_generation: bool) -> str:
    problem = f"accelerator type {name!r} has no valid size" if known_generation else f"unknown accelerator type {name!r}"
    if meant := suggestions(name):
        return f"{problem}; did you mean {' or '.join(meant)}? {SEE_HELP}"
    return f"{problem}; expected a generation and a size, such as v4-8, v5p-8, v5litepod-8 or v6e-8 {SEE_HELP}"


def unlisted_zones(name: str, zones: list[str]) -> str | None:
    """A warning, in one line, naming the zones that the table does not list for the type's generation;
    None when it lists every one."""
    generation = parse(name).generation
    offered = ZONES[generation]
    if not (missing := [zone for zone in zones if zone not in offered]):
        return None
    return (f"{name} is not in {', '.join(missing)} by podrun's table, which lists {', '.join(offered)} for "
            f"{generation} (Google's TPU regions and zones, as of {ZONES_AS_OF}; Google adds zones): podrun asks "
            f"there all the same, and the API's answer decides")
