"""`podrun list --orphans` and `podrun delete --orphans`: the TPU VMs and queued resources podrun made
(cloud/labels.py) that no live job owns (owners.py has the rule), with their age and what they cost
so far; deleted, queued resources with force, after asking."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from podrun import exits, owners
from podrun.cloud import capacity, labels
from podrun.cloud.prices import tpu_price
from podrun.cloud.settings import location
from podrun.commands.tpu import api_for, confirm
from podrun.errors import UsageError
from podrun.output import counted, duration_text, print_table, say
from podrun.report.cost import money

if TYPE_CHECKING:
    from podrun.cloud.tpu_api import TpuApi

WHAT = ("TPUs podrun made, was to delete after their job or once idle, and no running job owns; --all adds those "
        "kept on purpose")
WHAT_ALL = "TPUs podrun made that no running job owns, those kept on purpose too"


def list_orphans(zone: str | None, project: str | None, everything: bool) -> int:
    found = _find(api_for(location(project, zone)), everything)
    if found:
        print_table(_rows(found))
    return 0


def delete_orphans(zone: str | None, project: str | None, everything: bool, yes: bool) -> int:
    where = location(project, zone)
    api = api_for(where)
    found = _find(api, everything)
    if not found:
        return 0
    print_table(_rows(found))
    names = ", ".join(each.name for each in found)
    question = f"delete {counted(len(found), 'orphan')} ({names}) in {where.project}/{where.zone}?"
    if not yes and not confirm(question):
        say("nothing deleted")
        return exits.FAILURE
    try:
        for each in found:
            capacity.release(api, each.name)  # a queued resource with its nodes (force), else the node
    except KeyboardInterrupt:
        return exits.INTERRUPTED
    say(f"deleted {counted(len(found), 'orphan')}")
    return 0


def _find(api: TpuApi, everything: bool) -> list[owners.Orphan]:
    """The zone's orphans (one list of nodes, one of queued resources), and a line that says how many."""
    where = api.location
    found = owners.orphans(api.list(), api.list_queued(), everything)
    what = WHAT_ALL if everything else WHAT
    say(f"{counted(len(found), 'orphan') if found else 'no orphans'} in project {where.project}, zone {where.zone} "
        f"({what})")
    return found


def _rows(found: list[owners.Orphan]) -> list[tuple[str, ...]]:
    now = time.time()
    rows: list[tuple[str, ...]] = [("NAME", "WHAT", "STATE", "JOB", "USER", "DELETE_AFTER", "AGE", "COST SO FAR")]
    for each in found:
        rows.append((each.name, _what(each), _state(each), each.labels.get(labels.JOB, "-"),
                     each.labels.get(labels.USER, "-"), each.labels.get(labels.DELETE_AFTER, "-"),
                     duration_text(now - each.requested_at), _cost(each, now)))
    return rows


def _what(orphan: owners.Orphan) -> str:
    """`v4-8 TPU VM`, `2 x v4-16 multislice`, `v4-8 queued resource` (while it has made nothing)."""
    queued = orphan.queued
    accelerator = orphan.nodes[0].accelerator_type if orphan.nodes else queued.accelerator_type if queued else "?"
    if queued and len(queued.node_names) > 1:
        return f"{len(queued.node_names)} x {accelerator} multislice"
    return f"{accelerator} {'TPU VM' if orphan.nodes else 'queued resource'}"


def _state(orphan: owners.Orphan) -> str:
    states = sorted({node.state for node in orphan.nodes})
    if orphan.queued:
        states.append(f"queued {orphan.queued.state}")
    return ", ".join(states)


def _cost(orphan: owners.Orphan, now: float) -> str:
    """What its TPU VMs cost from their creation to now, at podrun's price table; `$0.00` while only a
    request waits; `-` where the table has no price."""
    billed_from = orphan.billed_from
    if billed_from is None:
        return money(0)
    node = orphan.nodes[0]
    try:
        price = tpu_price(node.accelerator_type, node.location.zone, spot=node.spot, reserved=node.reserved,
                          slices=len(orphan.nodes))
    except (KeyError, UsageError):  # a type or generation the table does not know
        return "-"
    if price["per_hour"] is None:
        return "-"
    return money(price["per_hour"] * max(0.0, now - billed_from) / 3600)
