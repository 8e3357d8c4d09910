"""Capacity in another zone (`target.tpu.zones`, `create --zones`): the TPU is asked for in each zone
in turn, until one has capacity. A stockout (RESOURCE_EXHAUSTED), a queued request that Google fails,
or one still in the queue after `zone_wait`, moves the request to the next zone: what was asked for in
the zone it leaves is deleted first (capacity.obtain does, force), so that nothing waits on there. A
multislice moves as a whole: one queued resource, or its slices made apart (`recreate: slice`). Each
move is one line, and `on_move` keeps it for the job's phases (`podrun report`). The last zone waits as
a single zone would (valid_for, PODRUN_WAIT_TIMEOUT): there is nowhere further to go.

Restarts after a preemption ask in the zone that just worked first, then the others in order
(`ordered`); where a TPU of the spec's name already is, `holding` finds its zone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from podrun.cloud import capacity
from podrun.errors import NoCapacity, PodrunError
from podrun.output import say

if TYPE_CHECKING:
    from podrun.cloud.request import TpuRequest
    from podrun.cloud.tpu_api import TpuApi
    from podrun.cloud.tpu_resources import TpuNode


def ordered(apis: list[TpuApi], first_zone: str) -> list[TpuApi]:
    """The zones' APIs with `first_zone` first (the zone that just worked), then the others in order."""
    return sorted(apis, key=lambda api: api.location.zone != first_zone)


def holding(apis: list[TpuApi], names: list[str], label: str) -> TpuApi | None:
    """The API of the first zone in which a node of these names, or their queued resource, exists."""
    for api in apis:
        if api.find(names[0]) is not None or api.get_queued(label) is not None:
            return api
    return None


def obtain(apis: list[TpuApi], requests: list[TpuRequest], zone_wait_s: float | None = None,
           on_capacity: Callable[[], None] | None = None, on_move: Callable[[str, str, str], None] | None = None,
           wait: bool = True) -> tuple[TpuApi, list[TpuNode]]:
    """What `requests` ask for (one TPU, or the slices of a multislice made apart, each its own queued resource)
    in each zone in turn, until one has capacity for all: that zone's API and the nodes. `on_move(from_zone,
    to_zone, line)` for each move."""
    for position, api in enumerate(apis):
        further = apis[position + 1:]
        try:
            return api, obtain_in_zone(api, requests, wait, on_capacity, zone_wait_s if further else None)
        except NoCapacity as error:
            accelerator_type = requests[0].accelerator_type
            if not further:
                if len(apis) == 1:
                    raise
                tried = ", ".join(each.location.zone for each in apis)
                raise PodrunError(f"no capacity for {accelerator_type} in any of {tried}: {error}") from None
            line = (f"no capacity for {accelerator_type} in {api.location.zone} ({error.why}): "
                    f"trying {further[0].location.zone}")
            say(line)
            if on_move:
                on_move(api.location.zone, further[0].location.zone, line)
    raise AssertionError("apis lists at least one zone")


def obtain_in_zone(api: TpuApi, requests: list[TpuRequest], wait: bool, on_capacity: Callable[[], None] | None,
               zone_wait_s: float | None) -> list[TpuNode]:
    """capacity.obtain in one zone (a queued request waiting at most `zone_wait_s` there, for another zone);
    several requests are all asked for before any is waited for, and what one failed, or an interrupt, deletes
    all of them: nothing is left queued or billing for a multislice that cannot be whole."""
    if len(requests) == 1:
        return capacity.obtain(api, requests[0], wait=wait, on_capacity=on_capacity, zone_wait_s=zone_wait_s)
    made: list[TpuRequest] = []
    try:
        for request in requests:
            capacity.obtain(api, request, wait=False)
            made.append(request)
        if not wait:
            return []
        return [node for request in requests for node in capacity.wait_ready(api, request, on_capacity, zone_wait_s)]
    except BaseException:
        for request in made:  # the one whose wait failed is gone already
            capacity.release(api, request.name, quiet=True)
        raise
