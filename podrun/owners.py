"""Whether a live job owns a TPU that carries podrun's labels (cloud/labels.py): `podrun list
--orphans` asks this of each one.

A job owns what is labelled with its id while its record reads `running` (a pointer to a supervisor
host's job too; an attached job whose launcher died reads `lost`, as in `podrun jobs`), and, before
its record exists, while its launcher runs: from the moment it picks the job's id until it ends, the
launcher keeps a claim, PODRUN_HOME/creating/<label>.json, that names its process. A launcher killed
during a create leaves a claim whose process is gone, and no record: what it made is owned by nobody.

An orphan is what podrun made that nobody owns and podrun meant to delete (podrun-delete-after
`true`): a job's TPU with delete_after success or always, or exec --down. A TPU kept on purpose
(delete_after never, for the next run to use, or one `podrun create` made, which the user deletes)
is the user's: an orphan only to `--all`. A TPU made with `idle_delete` (labelled `podrun-idle-delete`)
deletes itself from its worker 0 once idle that long; one that is up longer than that, and no running
job owns, is an orphan too, `create`'s included: its VM's service account may have been refused the
deletion (or it has been in use all along, which podrun cannot tell from here).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from podrun import jobstore, paths
from podrun.cloud import labels
from podrun.cloud.labels import label_value
from podrun.cloud.tpu_resources import QueuedResource, TpuNode
from podrun.errors import PodrunError
from podrun.output import counted, say

if TYPE_CHECKING:
    from podrun.cloud.tpu_api import TpuApi

FRACTION_PAST_MICROSECONDS = re.compile(r"(\.\d{6})\d+")


def claims_dir() -> str:
    return os.path.join(paths.podrun_home(), "creating")


@contextlib.contextmanager
def claim(job_id: str) -> Iterator[None]:
    """This process owns what is labelled with job_id while the block runs."""
    paths.make_private_dir(claims_dir())
    path = os.path.join(claims_dir(), f"{label_value(job_id)}.json")
    jobstore.write_json(path, jobstore.process_identity(os.getpid()))
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def owned(job_label: str) -> bool:
    """Whether a live job owns what carries podrun-job `job_label`: a running record of a job whose id
    gives that label, or a launcher's claim whose process still runs."""
    try:
        with open(os.path.join(claims_dir(), f"{job_label}.json")) as handle:
            if jobstore.is_alive(json.load(handle)):
                return True
    except (OSError, ValueError, AttributeError):
        pass  # no claim, or one half-written by a launcher killed then
    for job_id in jobstore.job_ids():
        if label_value(job_id) == job_label:
            try:
                record = jobstore.load_if_there(job_id)
            except PodrunError:  # a record that cannot be read may be a live job's: never an orphan's
                return True
            if record is not None and record.current_state() == jobstore.RUNNING:
                return True
    return False


@dataclass(frozen=True)
class Orphan:
    """What podrun made that no live job owns: a queued resource with the nodes it made, or a node made
    directly. `name` is what `podrun delete NAME` takes."""

    name: str
    labels: dict[str, str]
    requested_at: float  # epoch seconds: when it was asked for
    nodes: list[TpuNode]  # its TPU VMs (none while a queued request waits: nothing bills then)
    queued: QueuedResource | None = None

    @property
    def billed_from(self) -> float | None:
        """When the first of its TPU VMs was made: Google bills from then."""
        return min((_epoch(node.created, self.requested_at) for node in self.nodes), default=None)


def orphans(nodes: list[TpuNode], requests: list[QueuedResource], everything: bool = False,
            user: str | None = None) -> list[Orphan]:
    """The labelled ones no live job owns, oldest first: those podrun is to delete after their job
    (podrun-delete-after true), and with `everything` also those kept on purpose (delete_after never,
    `podrun create`'s); of every user, or of `user` (a label value)."""
    made: list[Orphan] = [Orphan(queued.name, queued.labels, _epoch(queued.created, time.time()),
                                 [node for node in nodes if node.queued_resource == queued.name], queued)
                          for queued in requests]
    listed = {queued.name for queued in requests}
    made += [Orphan(node.name, node.labels, _epoch(node.created, time.time()), [node]) for node in nodes
             if node.queued_resource not in listed]
    owned_by: dict[str, bool] = {}
    found = []
    for each in made:
        job = each.labels.get(labels.JOB)
        if job is None or (user and each.labels.get(labels.USER) != user):
            continue
        idle_over = _idle_over(each)
        if not everything and not idle_over and (job == labels.CREATED_BY_COMMAND
                                                 or each.labels.get(labels.DELETE_AFTER) != "true"):
            continue
        if job == labels.CREATED_BY_COMMAND or not owned_by.setdefault(job, owned(job)):
            found.append(each)
    return sorted(found, key=lambda each: each.requested_at)


def _idle_over(made: Orphan) -> bool:
    """Whether it was made with idle_delete and has been up longer than that: it was to delete itself by now."""
    from podrun.spec.fields import duration_s

    idle_s = duration_s(made.labels.get(labels.IDLE_DELETE, "") or "x")
    return idle_s is not None and time.time() - made.requested_at > idle_s


def _epoch(timestamp: str, default: float) -> float:
    """An RFC 3339 time as the API writes it (`2026-11-27T16:00:00.123456789Z`), in epoch seconds."""
    try:
        return datetime.fromisoformat(FRACTION_PAST_MICROSECONDS.sub(r"\1", timestamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def warn_of_orphans(api: TpuApi) -> None:
    """One line when this user has orphan TPU VMs in the API's zone (`exec`, `create`): one GET of the
    zone's nodes; nothing when that fails, which must never fail the command."""
    try:
        found = orphans(api.nodes_page(), [], user=labels.user())
    except Exception:  # noqa: BLE001 -- a warning's failure of any kind is no reason to stop the command
        return
    if found:
        names = ", ".join(each.name for each in found)
        say(f"{counted(len(found), 'orphan TPU VM')} of yours in {api.location.project}/{api.location.zone} that no "
            f"running job owns ({names}): `podrun list --orphans` shows what they cost, `podrun delete --orphans` "
            f"deletes them")
