"""`podrun create`, `list`, `describe` and `delete`: TPU VMs through the Cloud TPU API."""

from __future__ import annotations

import getpass
import re
import sys
from typing import TYPE_CHECKING

from podrun import exits
from podrun.cloud import accelerators
from podrun.cloud.capacity import Waiting
from podrun.cloud.settings import Location, location
from podrun.errors import PodrunError, UsageError
from podrun.output import print_table, say

if TYPE_CHECKING:
    from podrun.cloud.tpu_api import TpuApi

NODE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def create(accelerator_type: str, name: str | None, zone: str | None, project: str | None,
           version: str | None, spot: bool, wait: bool) -> int:
    accelerator = accelerators.parse(accelerator_type)  # before any API call
    name = name or default_node_name(accelerator.name)
    if not NODE_NAME.match(name):
        raise UsageError(f"--name {name!r}: expected lowercase letters, digits and dashes, starting with a letter")
    where = location(project, zone)
    runtime = version or accelerator.default_runtime
    api = _api(where)
    workers = f"{accelerator.hosts} worker{'s' * (accelerator.hosts > 1)}"
    say(f"creating TPU VM {name} ({accelerator.name}: {workers}, runtime {runtime}{', spot' * spot}) "
        f"in {where.project}/{where.zone}")
    waiting = Waiting(api, name, f"{name} to be READY")
    try:
        with waiting:
            pending = api.create(name, accelerator.name, runtime, spot)
            if wait:
                waiting.start()
                api.wait(pending, waiting.update)
    except KeyboardInterrupt:
        say(f"interrupted: podrun stopped waiting, but {name} may still be created at Google (and billed once "
            f"READY): {_how_to_check(name, where)}; `podrun delete {name} --zone {where.zone} "
            f"--project {where.project}` deletes it")
        return exits.INTERRUPTED
    if not wait:
        say(f"creation of {name} started; `podrun describe {name} --zone {where.zone}` shows when it is READY")
        return 0
    node = api.get(name)
    say(f"{name} is {node.state} after {waiting.elapsed():.0f}s")
    print(describe_text(node))
    return 0


def list_nodes(zone: str | None, project: str | None) -> int:
    where = location(project, zone)
    nodes = _api(where).list()
    listed = f"TPU VMs in project {where.project}, zone {where.zone}"
    if not nodes:
        say(f"no {listed}")
        return 0
    say(f"{listed}:")
    print_table([("NAME", "STATE", "ACCELERATOR", "WORKERS", "RUNTIME"),
                 *((node.name, node.state, node.accelerator_type, str(len(node.workers)), node.runtime_version)
                   for node in nodes)])
    return 0


def describe(name: str, zone: str | None, project: str | None) -> int:
    print(describe_text(_api(location(project, zone)).get(name)))
    return 0


def delete(name: str, zone: str | None, project: str | None, yes: bool) -> int:
    where = location(project, zone)
    if not yes and not _confirm(f"delete TPU VM {name} in {where.project}/{where.zone}?"):
        say("nothing deleted")
        return exits.FAILURE
    api = _api(where)
    waiting = Waiting(api, name, f"{name} to be deleted")
    try:
        with waiting:
            pending = api.delete(name)
            waiting.start()
            api.wait(pending, waiting.update)
    except KeyboardInterrupt:
        say(f"interrupted: podrun stopped waiting, but the deletion of {name} goes on at Google: "
            f"{_how_to_check(name, where)} until it is gone")
        return exits.INTERRUPTED
    say(f"deleted {name} after {waiting.elapsed():.0f}s")
    return 0


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


def _api(where: Location) -> TpuApi:
    from podrun.cloud.tpu_api import TpuApi  # Google's libraries load only for the commands that need them

    return TpuApi(where)


def _how_to_check(name: str, where: Location) -> str:
    return f"`podrun describe {name} --zone {where.zone} --project {where.project}` shows its state"


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise PodrunError(f"{question[:-1]}: refusing without --yes, since there is no terminal to ask on")
    return input(f"podrun: {question} [y/N] ").strip().lower() in ("y", "yes")
