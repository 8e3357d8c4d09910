"""`podrun create`, `list`, `describe` and `delete`: TPU VMs and their queued resources through the
Cloud TPU API (the lifecycle itself is cloud/capacity.py's)."""

from __future__ import annotations

import getpass
import re
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from podrun import exits, owners
from podrun.cloud import accelerators, capacity, labels, zone_moves
from podrun.cloud.request import NODE_NAME, NODE_NAME_RULE, TpuRequest, through_queue
from podrun.cloud.settings import Location, location
from podrun.errors import PodrunError, UsageError
from podrun.output import print_table, say

if TYPE_CHECKING:
    from podrun.cloud.tpu_api import TpuApi
    from podrun.cloud.tpu_resources import QueuedResource

@dataclass(frozen=True)
class CreateOptions:
    """`podrun create`'s arguments, as the CLI parsed them."""

    positional: str | None  # the accelerator type (podrun's order), or with accelerator_flag the name (gcloud's)
    name: str | None = None
    zone: str | None = None
    project: str | None = None
    version: str | None = None
    spot: bool = False
    wait: bool = True
    queued: bool = False
    reservation: str | None = None
    valid_for: str | None = None
    replace: bool = False
    slices: int = 1
    internal_ips: bool = False
    accelerator_flag: str | None = None
    zones: str | None = None  # --zones A,B: tried in order (zone_moves.py)
    zone_wait: str | None = None
    idle_delete: str | None = None  # --idle-delete 2h: worker 0 deletes the TPU once no job ran on it that long


def create(options: CreateOptions) -> int:
    accelerator_type, name = _type_and_name(options.positional, options.accelerator_flag, options.name)
    accelerator = _accelerator(accelerator_type, gcloud_order=options.accelerator_flag is not None)  # before any API call
    name = name or default_node_name(accelerator.name)
    if not NODE_NAME.match(name):
        raise UsageError(f"--name {name!r}: expected {NODE_NAME_RULE}")
    slices = options.slices
    if not 1 <= slices <= accelerators.MAX_SLICES:
        raise UsageError(f"--slices {slices}: expected a number of slices from 2 to {accelerators.MAX_SLICES} "
                         f"(1: a single TPU VM)")
    queued = options.queued or options.zone_wait is not None  # only a queued request waits in a zone
    if options.valid_for is not None and not through_queue(queued, options.reservation, slices):
        raise UsageError("--valid-for: how long a queued request may wait for capacity; add --queued")
    zones = _zones(options, accelerator.name)
    idle_s = _duration_s("--idle-delete", options.idle_delete)
    if idle_s is not None and not options.wait:
        raise UsageError("--idle-delete: worker 0 watches from the moment the TPU VM is READY; drop --no-wait")
    request = TpuRequest(name, accelerator.name, options.version or accelerator.default_runtime, queued,
                         options.spot, options.reservation, _duration_s("--valid-for", options.valid_for), slices=slices,
                         external_ips=not options.internal_ips,
                         labels=labels.owner_labels(labels.CREATED_BY_COMMAND, delete_after=False, idle_delete_s=idle_s))
    apis = [api_for(location(options.project, zone)) for zone in zones]
    api = (len(apis) > 1 and zone_moves.holding(apis, request.node_names, name)) or apis[0]
    owners.warn_of_orphans(api)
    if problem := capacity.blocked(api, request.node_names, name):
        if not options.replace:
            raise PodrunError(problem)
        capacity.release(api, name)
    try:
        api, nodes = zone_moves.obtain(zone_moves.ordered(apis, api.location.zone), [request],
                                       _duration_s("--zone-wait", options.zone_wait), wait=options.wait)
    except KeyboardInterrupt:
        return exits.INTERRUPTED
    if not nodes:
        what = f"the queued request for {name} was accepted" if request.through_queue else f"creation of {name} started"
        say(f"{what}; `podrun describe {name} {api.location.flags}` shows when it is READY")
        return 0
    print(_slices_text(nodes))
    if idle_s is not None:
        _watch_idle(request, api.location, idle_s)
    return 0


def _watch_idle(request: TpuRequest, where: Location, idle_s: float) -> None:
    """--idle-delete: the TPU's worker 0 watches it (launch/idle_watch.py); a watch that cannot start fails the
    command, naming the TPU, which stays."""
    from podrun.launch import idle_watch
    from podrun.targets.tpu import created_tpu

    target = created_tpu(request, where)
    try:
        idle_watch.start(target, target.workers(dry_run=False), idle_s)
    except PodrunError as error:
        raise PodrunError(f"{request.name} was created, but {error}; it stays until deleted: "
                          f"`{target.capacity.give_back_command()}`") from None


def _type_and_name(positional: str | None, accelerator_flag: str | None, name: str | None) -> tuple[str, str | None]:
    """The accelerator type and the name, from podrun's order (`ACCEL_TYPE [--name N]`) or gcloud's
    (`NAME --accelerator-type ACCEL_TYPE`)."""
    if accelerator_flag is None:
        if positional is None:
            raise UsageError("no accelerator type: `podrun create ACCEL_TYPE [--name N]` (e.g. v4-8), or in gcloud's "
                             "order `podrun create NAME --accelerator-type ACCEL_TYPE`")
        return positional, name
    if positional is not None and name is not None and positional != name:
        raise UsageError(f"two names, {positional!r} and --name {name!r}: with --accelerator-type, the positional "
                         f"argument is the TPU's name, as in gcloud; give one of them")
    return accelerator_flag, positional or name


def _accelerator(accelerator_type: str, gcloud_order: bool) -> accelerators.AcceleratorType:
    """The type parsed; a positional that is no type at all but could be a name gets gcloud's order named."""
    try:
        return accelerators.parse(accelerator_type)
    except UsageError:
        if gcloud_order or accelerators.suggestions(accelerator_type) or not NODE_NAME.match(accelerator_type):
            raise
        raise UsageError(f"unknown accelerator type {accelerator_type!r}: podrun create takes the type first "
                         f"(`podrun create v4-8 --name {accelerator_type}`); to name the TPU first, as gcloud does, "
                         f"give the type with --accelerator-type (`podrun create {accelerator_type} "
                         f"--accelerator-type v4-8`)") from None


def _zones(options: CreateOptions, accelerator_type: str) -> list[str | None]:
    """The zones to ask in, in order: --zones (those the type's known zones lack, a warning), else --zone's."""
    if options.zones is None:
        if options.zone_wait is not None:
            raise UsageError("--zone-wait: how long a queued request waits in one of --zones; add --zones")
        return [options.zone]
    zones = [zone.strip() for zone in options.zones.split(",")]
    if options.zone:
        raise UsageError("--zone and --zones exclude each other: list every zone in --zones, the first is tried first")
    if "" in zones or len(set(zones)) < len(zones):
        raise UsageError(f"--zones {options.zones!r}: expected zones, each once, separated by commas")
    if not_zones := [zone for zone in zones if not accelerators.ZONE_NAME.match(zone)]:
        raise UsageError(f"--zones: expected zones such as us-east5-a (a region and a letter), got "
                         f"{', '.join(map(repr, not_zones))}")
    if unlisted := accelerators.unlisted_zones(accelerator_type, zones):
        say(f"--zones: {unlisted}")
    return list(zones)


def _duration_s(flag: str, duration: str | None) -> float | None:
    if duration is None:
        return None
    from podrun.spec.values import parse_idle_delete
    from podrun.target_kinds.tpu import parse_valid_for

    try:
        return (parse_idle_delete if flag == "--idle-delete" else parse_valid_for)(duration)
    except ValueError as error:
        raise UsageError(f"{flag} {duration!r}: {error}") from None


def list_nodes(zone: str | None, project: str | None) -> int:
    """The TPU VMs and the queued resources of a zone, one row per name: a multislice's slices as one
    row under its queued resource's name, and a request whose TPU VM does not exist yet with its own
    state."""
    where = location(project, zone)
    api = api_for(where)
    nodes, requests = api.list(), {queued.name: queued for queued in api.list_queued()}
    where_text = f"in project {where.project}, zone {where.zone}"
    if not nodes and not requests:
        say(f"no TPU VMs or queued resources {where_text}")
        return 0
    multislices = {name: queued for name, queued in requests.items() if len(queued.node_names) > 1}
    rows = [(node.name, node.state, node.accelerator_type, str(len(node.workers)), node.runtime_version,
             _how_made(node.spot, requests.get(node.queued_resource or ""))) for node in nodes
            if node.queued_resource not in multislices]
    for name, queued in multislices.items():
        slices = [node for node in nodes if node.queued_resource == name]
        rows.append((name, _multislice_state(queued, slices), f"{len(queued.node_names)} x {queued.accelerator_type}",
                     str(sum(len(node.workers) for node in slices)) if slices else "-", queued.runtime_version,
                     _how_made(queued.spot, queued)))
    made = {name for node in nodes for name in [node.queued_resource] if name}
    rows += [(queued.name, f"{queued.state} (queued)", queued.accelerator_type, "-", queued.runtime_version,
              _how_made(queued.spot, queued)) for queued in requests.values()
             if queued.name not in made and queued.name not in multislices]
    say(f"TPU VMs and queued resources {where_text}:")
    print_table([("NAME", "STATE", "ACCELERATOR", "WORKERS", "RUNTIME", "CAPACITY"), *sorted(rows)])
    return 0


def _multislice_state(queued: QueuedResource, slices: list) -> str:
    """`READY`, or what keeps the set from serving: slices gone (`READY, 1 of 2 slices gone`), its
    queued resource not ACTIVE (`..., queued resource SUSPENDED`), or only the request (`WAITING_FOR_RESOURCES (queued)`)."""
    if not slices:
        return f"{queued.state} (queued)"
    parts = [", ".join(sorted({node.state for node in slices}))]
    if gone := len(queued.node_names) - len(slices):
        parts.append(f"{gone} of {len(queued.node_names)} slices gone")
    if queued.state != "ACTIVE":
        parts.append(f"queued resource {queued.state}")
    return ", ".join(parts)


def _how_made(spot: bool, queued: QueuedResource | None) -> str:
    """`spot, queued`, `reservation R, queued`, `on demand`."""
    parts = ["spot"] if spot or (queued and queued.spot) else []
    parts += [f"reservation {queued.reservation}"] if queued and queued.reservation else []
    parts += ["queued"] if queued else []
    return ", ".join(parts) or "on demand"


def describe(name: str, zone: str | None, project: str | None) -> int:
    """One TPU VM and its queued resource, or a multislice's queued resource and each of its slices."""
    api = api_for(location(project, zone))
    node = api.find(name)
    queued = api.get_queued(node.queued_resource if node and node.queued_resource else name)
    if node is None and queued is None:
        api.get(name)  # the API's own not-found, in podrun's words
    if node is None and queued and len(queued.node_names) > 1:
        slices = [found for found in map(api.find, queued.node_names) if found]
        lines = [queued_text(queued)] + ([_slices_text(slices)] if slices else [])
    else:
        lines = ([describe_text(node)] if node else []) + ([queued_text(queued)] if queued else [])
    print("\n".join(lines))
    return 0


def _slices_text(nodes: list) -> str:
    """One node's description, or each slice's under its slice number."""
    if len(nodes) == 1:
        return describe_text(nodes[0])
    return "\n".join(f"slice {index}\n" + "\n".join(f"  {line}" for line in describe_text(node).splitlines())
                     for index, node in enumerate(nodes))


def delete(name: str, zone: str | None, project: str | None, yes: bool) -> int:
    where = location(project, zone)
    if not yes and not confirm(f"delete TPU VM {name} (and its queued resource) in {where.project}/{where.zone}?"):
        say("nothing deleted")
        return exits.FAILURE
    api = api_for(where)
    started = time.monotonic()
    try:
        if not capacity.release(api, name):
            api.get(name)  # not there: the API's own not-found, in podrun's words
    except KeyboardInterrupt:
        return exits.INTERRUPTED
    say(f"deleted {name} after {time.monotonic() - started:.0f}s")
    return 0


def queued_text(queued: QueuedResource) -> str:
    lines = [f"queued resource {queued.name}",
             f"  state        {queued.state}" + (f" ({queued.initiator})" if queued.initiator else ""),
             f"  capacity     {_how_made(queued.spot, queued)}",
             f"  nodes        {', '.join(queued.node_names)} ({queued.accelerator_type})"]
    lines += [f"  valid for    {queued.valid_until}"] if queued.valid_until else []
    lines += [f"  error        {queued.error}"] if queued.error else []
    return "\n".join(lines)


def describe_text(node) -> str:
    lines = [f"name         {node.name}",
             f"zone         {node.location.zone} (project {node.location.project})",
             f"state        {node.state} (health {node.health})",
             f"accelerator  {node.accelerator_type}, {len(node.workers)} worker(s)",
             f"runtime      {node.runtime_version}",
             f"spot         {'yes' if node.spot else 'no'}"]
    lines += [f"worker {index:<5} internal {worker.internal_ip}  external {worker.external_ip or '-'}"
              for index, worker in enumerate(node.workers)]
    return "\n".join(lines)


def default_node_name(accelerator_type: str) -> str:
    user = re.sub(r"[^a-z0-9-]", "-", getpass.getuser().lower()).strip("-") or "podrun"
    return f"{user}-{accelerator_type}"[:63].rstrip("-")


def api_for(where: Location) -> TpuApi:
    from podrun.cloud.tpu_api import TpuApi  # Google's libraries load only for the commands that need them

    return TpuApi(where)


def confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise PodrunError(f"{question[:-1]}: refusing without --yes, since there is no terminal to ask on")
    return input(f"podrun: {question} [y/N] ").strip().lower() in ("y", "yes")
