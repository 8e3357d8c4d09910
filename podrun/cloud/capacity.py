"""TPU capacity, got and given back (docs/targets/tpu.md: A TPU's whole life): create a TPU VM directly or through
a queued resource and wait until it is READY; tell a preempted one; delete one with whatever holds
its name.

Used by `podrun create`/`delete` and by `podrun exec` for a TPU its spec declares. The rule for
interrupts: what podrun asked Google for, podrun deletes when the user interrupts the wait, and the
DELETE request itself is sent with Ctrl-C held off, so that a second Ctrl-C cannot leave a request
queued or a half-made node billing. Waiting for a deletion may be interrupted: Google finishes it.

A queued request is polled with backoff: POLL_FIRST_S after it is accepted, then each wait
POLL_GROWTH times the last, up to POLL_MAX_S (about 6 reads a minute while it waits in the queue,
which can last hours): for as long as the request is valid (`valid_for`: Google fails it then), else
up to PODRUN_WAIT_TIMEOUT, which also bounds it wherever it is set. A wait that runs out deletes what
podrun asked for, as an interrupt does.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from podrun import interrupts
from podrun.cloud.no_external_ips import ExternalIpsRefused, external_ips_refused, refuses_external_ips
from podrun.cloud.request import duration_text
from podrun.cloud.settings import WAIT_TIMEOUT
from podrun.errors import NoCapacity, PodrunError, WaitTimedOut
from podrun.output import say

if TYPE_CHECKING:
    from podrun.cloud.request import TpuRequest
    from podrun.cloud.tpu_api import TpuApi
    from podrun.cloud.tpu_resources import QueuedResource, TpuNode

POLL_FIRST_S = 0.5
POLL_GROWTH = 1.5
POLL_MAX_S = 10.0
QUEUE_EXPIRY_MARGIN_S = 60  # past valid_for, Google takes a moment to fail the request
PREEMPTED_NODE_STATES = ("PREEMPTED", "TERMINATED")
PREEMPTED_QUEUED_STATES = ("SUSPENDING", "SUSPENDED")
IN_QUEUE_STATES = ("ACCEPTED", "WAITING_FOR_RESOURCES")  # a queued request without capacity yet


class RequestFailed(NoCapacity):
    """Google gave up on a queued request (FAILED, or SUSPENDED before it was ACTIVE)."""


class ZoneWaitOver(WaitTimedOut):
    """A queued request waited in its zone as long as `zone_wait` lets it."""


def obtain(api: TpuApi, request: TpuRequest, wait: bool = True,
           on_capacity: Callable[[], None] | None = None, zone_wait_s: float | None = None) -> list[TpuNode]:
    """Create the TPU VM (or the slices) and (wait) wait until it is READY, saying so on one line;
    [] without wait, once Google accepted the request. An interrupt, or a queued request that Google
    gave up on, deletes what was asked for before it is raised; an API that fails to answer leaves
    it (podrun cannot delete through it either) and says so. `on_capacity`: called once a queued request
    is seen out of the queue (its capacity found), as polled. No capacity in the zone (a stockout, a
    queued request FAILED, or still waiting after `zone_wait_s`) deletes what was asked for and raises
    NoCapacity, for the next zone (zone_moves.py)."""
    where = api.location
    what = "multislice" if request.slices > 1 else "TPU VM"
    say(f"creating {what} {request.name} ({request.summary()}) in {where.project}/{where.zone}")
    with _deleted_unless_made(api, request, zone_wait_s) as (waiting, limits):
        if request.through_queue:
            api.wait(api.create_queued(request), lambda elapsed: None)  # accepted: it waits in the queue
            if not wait:
                return []
            _until_out_of_queue(api, request, waiting, limits, on_capacity, zone_wait_s)
        else:
            pending = api.create(request)
            if not wait:
                return []
            waiting.start(interrupt="deletes it")
            api.wait(pending, waiting.update)
    return _made(api, request, waiting)


def wait_ready(api: TpuApi, request: TpuRequest, on_capacity: Callable[[], None] | None = None,
               zone_wait_s: float | None = None) -> list[TpuNode]:
    """Wait for a queued request that obtain(wait=False) made until its TPU VM is READY, as obtain waits,
    deleting it as obtain does: the slices of a multislice made apart are all asked for first, then each
    waited for, so that they wait in the queue together."""
    assert request.through_queue, "only a queued request is waited for after it was made"
    with _deleted_unless_made(api, request, zone_wait_s) as (waiting, limits):
        _until_out_of_queue(api, request, waiting, limits, on_capacity, zone_wait_s)
    return _made(api, request, waiting)


def _until_out_of_queue(api: TpuApi, request: TpuRequest, waiting: Waiting, limits: dict[str, float],
                        on_capacity: Callable[[], None] | None, zone_wait_s: float | None) -> None:
    limits["s"], limit = _queue_limit(api, request)
    if zone_wait_s is not None and zone_wait_s < limits["s"]:
        limit = f"in {api.location.zone} at most {duration_text(zone_wait_s)} (zone_wait), then {limit}"
    waiting.start(limit, interrupt="deletes the request")
    _wait_in_queue(api, request, waiting, limits["s"], on_capacity, zone_wait_s)


def _made(api: TpuApi, request: TpuRequest, waiting: Waiting) -> list[TpuNode]:
    nodes = [api.get(name) for name in request.node_names]
    say(f"{request.name} is {nodes[0].state if len(nodes) == 1 else 'READY'} after {waiting.elapsed():.0f}s")
    return nodes


@contextlib.contextmanager
def _deleted_unless_made(api: TpuApi, request: TpuRequest,
                         zone_wait_s: float | None) -> Iterator[tuple[Waiting, dict[str, float]]]:
    """What was asked for deleted when its wait ends otherwise than READY (obtain's docstring says how), with a
    second Ctrl-C held until its DELETE is out; the wait, and its limit (limits["s"]) for what is said of it."""
    waiting = Waiting(api, request.name, f"{request.name} to be READY")
    limits = {"s": api.wait_timeout_s}
    with interrupts.interruptible_once():
        try:
            with waiting:
                yield waiting, limits
        except KeyboardInterrupt:
            say(f"interrupted: deleting what podrun asked for ({request.name}), so that nothing is left queued or "
                f"billing")
            release(api, request.name)
            raise
        except (NoCapacity, ExternalIpsRefused):
            release(api, request.name, quiet=True)
            raise
        except ZoneWaitOver:
            release(api, request.name, quiet=True)
            waited = f"still waiting after {duration_text(zone_wait_s or 0)}"
            raise NoCapacity(f"queued resource {request.name} in {api.location.zone}: {waited} (zone_wait); podrun "
                             f"deleted the request", waited) from None
        except WaitTimedOut:
            # the limit, not the time measured: a poll that ends after it is the same timeout
            waited = f"{request.name} was not READY within {limits['s']:g}s ({WAIT_TIMEOUT[0]})"
            say(f"{waited}: deleting what podrun asked for, so that nothing is left queued or billing")
            what = "the request" if request.through_queue else "it"
            try:
                release(api, request.name)
            except WaitTimedOut:  # the deletion outlasts the wait too: the timeout is still the news
                raise PodrunError(f"{waited}; podrun asked Google to delete {what}, which goes on there: `podrun "
                                  f"describe {request.name} {api.location.flags}` shows it until it is gone") from None
            raise PodrunError(f"{waited}; podrun deleted {what}") from None


def _queue_limit(api: TpuApi, request: TpuRequest) -> tuple[float, str]:
    """How long a queued request is waited for, and those words: PODRUN_WAIT_TIMEOUT where it is set or
    the request has no valid_for; else as long as the request is valid (Google fails it then)."""
    if os.environ.get(WAIT_TIMEOUT[0], "").strip() or not request.valid_for_s:
        return api.wait_timeout_s, f"at most {api.wait_timeout_s:g}s ({WAIT_TIMEOUT[0]})"
    valid_for = duration_text(request.valid_for_s)
    return request.valid_for_s + QUEUE_EXPIRY_MARGIN_S, f"as long as the request is valid ({valid_for})"


def _wait_in_queue(api: TpuApi, request: TpuRequest, waiting: Waiting, limit_s: float,
                   on_capacity: Callable[[], None] | None, zone_wait_s: float | None = None) -> None:
    """Poll the queued resource until every node it makes is READY; its failure as a PodrunError, and
    running past `limit_s` as WaitTimedOut; still in the queue after `zone_wait_s`, as ZoneWaitOver."""
    name, interval = request.name, POLL_FIRST_S
    in_queue = True
    while True:
        if in_queue and zone_wait_s is not None and waiting.elapsed() >= zone_wait_s:
            raise ZoneWaitOver(f"queued resource {name} still waits after {waiting.elapsed():.0f}s")
        if waiting.elapsed() >= limit_s:
            raise WaitTimedOut(f"queued resource {name} still waits after {waiting.elapsed():.0f}s")
        queued = api.get_queued(name)
        if queued is None:
            raise PodrunError(f"queued resource {name} was deleted while podrun waited for it")
        if queued.state == "FAILED" and refuses_external_ips(queued.error):
            raise external_ips_refused(f"queued resource {name} FAILED", api.location.project)
        if queued.state == "FAILED":
            raise RequestFailed(f"queued resource {name} FAILED: {queued.error or 'Google gave no reason'}; podrun "
                                f"deleted the request", queued.error or "its queued request FAILED")
        if queued.state in PREEMPTED_QUEUED_STATES:
            raise RequestFailed(f"queued resource {name} went {queued.state} before its TPU VM was READY; podrun "
                                f"deleted it", f"its queued request went {queued.state}")
        in_queue = queued.state in IN_QUEUE_STATES
        if on_capacity and not in_queue:
            on_capacity()
            on_capacity = None
        if queued.state == "ACTIVE" and all(api.state(node) == "READY" for node in request.node_names):
            return
        waiting.show(queued.state if queued.state != "ACTIVE" else "ACTIVE, the TPU VM starting", waiting.elapsed())
        bound = min(limit_s, zone_wait_s) if in_queue and zone_wait_s is not None else limit_s
        time.sleep(max(0.0, min(interval, bound - waiting.elapsed())))
        interval = min(interval * POLL_GROWTH, POLL_MAX_S)


def release(api: TpuApi, name: str, quiet: bool = False) -> bool:
    """Delete what holds the name: its queued resource with its node (force), else the node; wait
    until it is gone (also when its deletion had begun already). Whether there was anything."""
    waiting = Waiting(api, name, f"{name} to be deleted")
    try:
        with interrupts.uninterrupted():  # what to delete is read here too: an interrupt before the DELETE would leave it
            queued = api.get_queued(name)
            state = queued.state if queued else api.state(name)
            if state == "gone":
                return False
            pending = None if state == "DELETING" else api.delete_queued(name) if queued else api.delete(name)
        if not quiet:
            say(f"deleting {f'queued resource {name} and its TPU VM' if queued else f'TPU VM {name}'}")
        with waiting:
            waiting.start(interrupt="stops the wait, not the deletion at Google")
            if pending:
                api.wait(pending, waiting.update)
            else:
                _until_gone(api, name, queued is not None, waiting)
    except KeyboardInterrupt:
        say(f"interrupted: podrun stopped waiting, but the deletion of {name} goes on at Google: `podrun describe "
            f"{name} {api.location.flags}` shows its state until it is gone")
        raise
    return True


def self_delete_config(api: TpuApi, names: list[str]) -> dict:
    """What a TPU VM needs to delete what release() would delete for `names`, with its own credentials
    (remote/self_delete.py): this API's base URL, and each name's queued resource where one holds it,
    else its node, by full name. The metadata server is the VM's own (None)."""
    parent = api.location.parent
    return {"api": api.base_url, "metadata_host": None,
            "names": [f"{parent}/queuedResources/{name}" if api.get_queued(name) else f"{parent}/nodes/{name}"
                      for name in names]}


def _until_gone(api: TpuApi, name: str, queued: bool, waiting: Waiting) -> None:
    """Poll a deletion that another podrun (or an earlier interrupt) began, up to the wait timeout."""
    interval = POLL_FIRST_S
    while (api.get_queued(name) is not None) if queued else api.state(name) != "gone":
        if waiting.elapsed() > api.wait_timeout_s:
            raise WaitTimedOut(f"{name} is still being deleted after {api.wait_timeout_s:g}s; it goes on at Google")
        waiting.show("DELETING", waiting.elapsed())
        time.sleep(interval)
        interval = min(interval * POLL_GROWTH, POLL_MAX_S)


def departure(api: TpuApi, names: list[str], label: str | None = None, nodes_only: bool = False) -> str | None:
    """Whether the TPU VM (or a slice of several, in slice order; `label` names them as a whole and is
    their queued resource's name) went away, asked of the API: preempted (a node PREEMPTED or
    TERMINATED, its queued resource SUSPENDING or SUSPENDED), or out of service otherwise (a node not
    READY, under maintenance or gone, its queued resource no longer ACTIVE); why, in words, naming the
    slice. None while every node serves, or when the API cannot say. `nodes_only`: one read per node
    (the watch while a job runs); the queued resource is read only once a node looks gone."""
    label = label or names[0]
    try:
        nodes = {name: api.find(name) for name in names}
        away = [name for name, node in nodes.items() if out_of_service(node)]
        if nodes_only and not away:
            return None
        requests = dict.fromkeys(node.queued_resource for node in nodes.values() if node and node.queued_resource)
        queued = [found for found in map(api.get_queued, requests or [label]) if found is not None]
    except PodrunError:
        return None
    unqueued = [request for request in queued if request.state != "ACTIVE"]
    if not away and not unqueued:
        return None
    preempted = (any(nodes[name] and nodes[name].state in PREEMPTED_NODE_STATES for name in away)  # type: ignore[union-attr]
                 or any(request.state in PREEMPTED_QUEUED_STATES for request in unqueued))
    if len(names) == 1:
        what = f"TPU VM {names[0]} was"
    elif away:
        what = ", ".join(f"slice {names.index(name)} ({name})" for name in away) + (" were" if len(away) > 1 else " was")
    else:
        what = f"multislice {label} was"
    parts = [_node_condition(nodes[name]) for name in away[:1] or names[:1]]
    parts += [f"queued resource {request.name} {request.state}" for request in queued]
    return f"{what} {'preempted' if preempted else 'taken out of service'} ({', '.join(parts)})"


def out_of_service(node: TpuNode | None) -> bool:
    """Whether a node (None: gone) does not serve: not READY, or under maintenance."""
    return node is None or node.state != "READY" or node.health == "UNHEALTHY_MAINTENANCE"


def _node_condition(node: TpuNode | None) -> str:
    if node is None:
        return "node deleted"
    return f"node {node.state}" + (f", health {node.health}" if node.health == "UNHEALTHY_MAINTENANCE" else "")


def blocked(api: TpuApi, names: list[str], label: str | None = None) -> str | None:
    """Why a TPU cannot be made or used under these names (one node's, or a multislice's slices whose
    queued resource is `label`), with the command that clears it: a queued resource FAILED or
    SUSPENDED, a node PREEMPTED or TERMINATED. None if nothing stands in the way."""
    label = label or names[0]
    queued = api.get_queued(label)
    if queued is not None and queued.state == "FAILED":
        return (f"queued resource {label} FAILED ({queued.error or 'no reason given'}) and holds the name; "
                f"`podrun delete {label} {api.location.flags}` clears it (or `podrun create ... --replace`)")
    for name in names:
        node = api.find(name)
        request = node.queued_resource if node and node.queued_resource else label if len(names) == 1 else None
        node_queued = queued if request == label else api.get_queued(request) if request else None
        if dead := _dead(node, node_queued):
            clear = request if node_queued else name
            return (f"TPU VM {name} was preempted ({dead}) and keeps its name and quota until deleted; "
                    f"`podrun delete {clear} {api.location.flags}` clears it (or `podrun create ... --replace`)")
    return None


def _dead(node: TpuNode | None, queued: QueuedResource | None) -> str:
    parts = [f"node {node.state}"] if node and node.state in PREEMPTED_NODE_STATES else []
    parts += [f"queued resource {queued.state}"] if queued and queued.state in PREEMPTED_QUEUED_STATES else []
    return ", ".join(parts)


class Waiting:
    """A wait for a TPU VM, told as it goes: a line when it starts, then its state when it changes and
    every 30 s; on a terminal, the state and the seconds waited are redrawn in place instead."""

    REPORT_EVERY_S = 30

    def __init__(self, api: TpuApi, node: str, waiting_for: str):
        self.api, self.node, self.waiting_for = api, node, waiting_for
        self.started = time.monotonic()
        self.terminal = sys.stderr.isatty()
        self.state: str | None = None
        self.checked_at = 0.0
        self.reported_at = 0.0
        self.drawn = False

    def start(self, limit: str | None = None, interrupt: str = "stops the wait, not the operation at Google") -> None:
        """The wait's first line: how long it lasts (default: the API's wait timeout) and what Ctrl-C does."""
        limit = limit or f"at most {self.api.wait_timeout_s:g}s"
        say(f"waiting for {self.waiting_for} ({limit}; Ctrl-C {interrupt})")

    def update(self, elapsed: float) -> None:
        """After a poll of an operation: the node's state, read every 30 s (at once on a terminal)."""
        if elapsed - self.checked_at >= self.REPORT_EVERY_S or (self.terminal and self.state is None):
            self.checked_at = elapsed
            self.show(self.api.state(self.node), elapsed)
        elif self.terminal and self.state:
            self.show(self.state, elapsed)

    def show(self, state: str, elapsed: float) -> None:
        changed, self.state = state != self.state, state
        if self.terminal:
            sys.stderr.write(f"\rpodrun: waiting for {self.waiting_for}: {state}, {elapsed:.0f}s\x1b[K")
            sys.stderr.flush()
            self.drawn = True
        elif changed or elapsed - self.reported_at >= self.REPORT_EVERY_S:
            say(f"waiting for {self.waiting_for}: {state} after {elapsed:.0f}s")
            self.reported_at = elapsed

    def __enter__(self) -> Waiting:
        return self

    def __exit__(self, *exception) -> None:
        """End the line redrawn in place, so that what is said next starts on a line of its own."""
        if self.drawn:
            sys.stderr.write("\n")
            self.drawn = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started
