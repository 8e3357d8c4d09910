"""What a Cloud TPU costs per hour: a dated table of on-demand and Spot prices per chip-hour, by
generation and region, and the one-line price (or why there is none) that a job's record keeps.

Where the figures come from, and how sure they are (looked up on 2026-11-27):
- Google publishes them at https://cloud.google.com/tpu/pricing; the stored copies of that page that
  could be read on that day were of its 2022 version, which gives v4 at $3.22 per chip-hour on demand
  (as also quoted from it in August 2022, infer-pub.com question 1114). That figure is confirmed.
- Every other figure is taken from SkyPilot's catalog of Google Cloud prices
  (github.com/skypilot-org/skypilot-catalog, catalogs/v7/gcp/vms.csv at commit 017e2502), which
  SkyPilot builds from Google's Cloud Billing Catalog API, divided by each type's chips. The on-demand
  figures agree with those commonly quoted from Google's page (v5e $1.20, v5p $4.20, v6e $2.70 per
  chip-hour in us-central1), but were not read on Google's page itself: unconfirmed, as is every
  Spot figure. Spot prices change as often as once a month; regions not listed have no price here.
- v2 and v3 price a single device (v2-8, v3-8) and a Pod slice (larger) apart.
- A reservation is billed at its committed-use contract's price, which no table can know.

A job's record keeps what podrun knew where the job started (`price`): the table's figure and where it
came from, or the spec's `cost.per_hour`, or why it shows no cost; `podrun report` and `podrun jobs`
read it from there.
"""

from __future__ import annotations

from podrun.cloud import accelerators

AS_OF = "2026-11-27"
TABLE = f"Cloud TPU price table of {AS_OF}"
# generation, or a type priced apart from its generation's Pod slices -> region -> (on-demand, Spot),
# USD per chip-hour (None: no Spot price there)
PER_CHIP_HOUR: dict[str, dict[str, tuple[float, float | None]]] = {
    "v2-8": {"us-central1": (1.125, 0.3375), "europe-west4": (1.2375, 0.3155625), "asia-east1": (1.305, 0.3915)},
    "v2": {"us-central1": (1.5, 0.3825), "europe-west4": (1.5, 0.3825)},
    "v3-8": {"us-central1": (2.0, 0.51), "us-east1": (2.0, None), "europe-west4": (2.2, 0.561)},
    "v3": {"us-east1": (2.0, 0.6), "europe-west4": (2.0, 0.66)},
    "v4": {"us-central2": (3.22, 0.9215)},
    "v5litepod": {"us-central1": (1.2, 0.21298), "us-east1": (1.2, 0.21298), "us-west1": (1.2, 0.21298),
                  "us-east5": (1.2, 0.6), "us-west4": (1.2, 0.4692), "us-south1": (1.416, 0.5664),
                  "europe-west4": (1.56, 0.44261), "europe-west1": (1.32132, 0.66066),
                  "europe-north1": (1.32132, 0.66066), "asia-southeast1": (1.56, 0.78),
                  "asia-east1": (1.38948, 0.69474)},
    "v5p": {"us-central1": (4.2, 1.68), "us-east1": (4.2, 1.68), "us-east5": (4.2, 1.56009),
            "us-south1": (4.779, 2.3954), "europe-west4": (4.2525, 1.34849), "europe-west1": (4.459455, 1.7837825)},
    "v6e": {"us-central1": (2.7, 0.64833), "us-east1": (2.7, 0.64833), "us-east4": (2.7, 0.85833),
            "us-east5": (2.7, 1.08), "us-south1": (2.7, 1.89), "us-west1": (2.7, 0.64833),
            "europe-west4": (2.97, 0.71316), "asia-southeast1": (2.97, 0.72958), "asia-northeast1": (3.24, 1.07681),
            "asia-south1": (3.24, 2.27)},
}
SET_IT = "set cost.per_hour in the spec to see its cost"


def region_of(zone: str) -> str:
    """`us-central2-b` -> `us-central2`: the zone without its last `-x`."""
    return zone.rsplit("-", 1)[0]


def tpu_price(accelerator_type: str, zone: str, spot: bool, reserved: bool = False, slices: int = 1) -> dict:
    """What `slices` TPUs of this type in this zone cost per hour, as a record keeps it:
    {"per_hour": X, "source": "..."}, or {"per_hour": None, "why": "..."} where the table has no price."""
    shape = accelerators.parse(accelerator_type)
    what = f"{slices} x {shape.name}" if slices > 1 else shape.name
    if reserved:
        return {"per_hour": None, "why": f"{what} runs in a reservation, billed at its committed-use contract's "
                                         f"price, which podrun cannot know; {SET_IT}"}
    region = region_of(zone)
    priced = shape.name if shape.name in PER_CHIP_HOUR else shape.generation
    prices = PER_CHIP_HOUR[priced].get(region)
    kind = "Spot" if spot else "on-demand"
    per_chip = prices[1 if spot else 0] if prices else None
    if per_chip is None:
        return {"per_hour": None, "why": f"podrun's {TABLE} has no {kind} price for {priced} in {region} "
                                         f"({zone}); {SET_IT}"}
    chips = shape.chips * slices
    return {"per_hour": round(per_chip * chips, 6),
            "source": f"{TABLE}: {what} {kind} in {region}, {chips} chips at ${per_chip:g}/chip-hour"}
