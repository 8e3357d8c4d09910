"""A TPU's capacity: its node (one, or a multislice's slices) or queued resource, made from the spec's
accelerator_type where it does not exist, in the first of its zones that has capacity (cloud/zone_moves.py);
lost when the API shows it preempted or taken out of service; made again after a preemption; deleted as
delete_after says. The API calls are cloud/capacity.py's."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from podrun.capacity.base import Capacity
from podrun.cloud import accelerators
from podrun.cloud.settings import location
from podrun.errors import NoCapacity, PodrunError, SpecError
from podrun.output import say
from podrun.spec.model import JobSpec
from podrun.target_kinds.tpu import TpuOptions

if TYPE_CHECKING:
    from podrun.cloud.oslogin import OsLogin
    from podrun.cloud.request import TpuRequest
    from podrun.cloud.tpu_api import TpuApi
    from podrun.cloud.tpu_resources import TpuNode


class TpuCapacity(Capacity):
    departs = True  # preempted (spot), or taken away by maintenance

    def __init__(self, spec: JobSpec, key_line: Callable[[], str]):
        super().__init__()
        self.spec = spec
        self.tpu: TpuOptions = spec.target.options
        self.node_names = self.tpu.node_names  # one, or the slices in slice order
        self.key_line = key_line  # the user's key as the `ssh-keys` metadata holds it, for a TPU made
        self._api: TpuApi | None = None
        self._oslogin: OsLogin | None = None

    @property
    def api(self) -> TpuApi:
        """The API in the TPU's zone: of several (zones), the first that holds it, else the first."""
        if self._api is None:
            from podrun.cloud import zone_moves

            apis = self._zone_apis()
            self._api = (len(apis) > 1 and zone_moves.holding(apis, self.node_names, self.tpu.label)) or apis[0]
        return self._api

    def _zone_apis(self) -> list[TpuApi]:
        from podrun.cloud.tpu_api import TpuApi  # Google's libraries load only for TPU targets
        return [TpuApi(location(self.tpu.project, zone)) for zone in self.tpu.zone_order]

    @property
    def oslogin(self) -> OsLogin:
        """OS Login in the TPU's project: kept for the capacity's life, so that a node made again after a
        preemption finds the key imported already."""
        if self._oslogin is None:
            from podrun.cloud.oslogin import OsLogin

            self._oslogin = OsLogin(self.api)
        return self._oslogin

    @property
    def multislice(self) -> bool:
        return len(self.node_names) > 1

    @property
    def apart(self) -> bool:
        """Its slices made apart, each its own queued resource, and made again alone (recreate: slice)."""
        return self.tpu.recreate == "slice"

    def labelling_api(self) -> TpuApi:
        return self.api

    def acquire(self) -> None:
        """Create the TPU the spec declares (accelerator_type) when it does not exist; refuse one of that
        name that is of another type or shape, or dead (preempted, a failed or suspended queued resource)."""
        from podrun.cloud import capacity

        tpu = self.tpu
        if not tpu.accelerator_type:
            return
        if problem := capacity.blocked(self.api, self.node_names, tpu.label):
            raise PodrunError(problem)
        if (existing := self.existing()) is None:
            self._create()
            return
        self.refuse_another_shape(existing)

    def refuse_another_shape(self, existing: list[TpuNode]) -> None:
        """Refuse a TPU of the spec's name that exists (`existing`: its nodes found) as another type or
        with fewer slices than the spec declares: a spec error (exit 2), for exec and --dry-run alike."""
        tpu = self.tpu
        if not existing:
            raise PodrunError(f"multislice {tpu.label}: its queued resource exists but has made no slice yet; "
                              f"`podrun describe {tpu.label} {self.api.location.flags}` shows its state")
        if all(node.accelerator_type == tpu.accelerator_type for node in existing) and len(existing) == len(self.node_names):
            return
        shape = f"{len(self.node_names)} x {tpu.accelerator_type}" if self.multislice else tpu.accelerator_type
        found = f"{len(existing)} x {existing[0].accelerator_type}" if self.multislice else existing[0].accelerator_type
        raise SpecError(self.spec.path, "target.tpu.accelerator_type",
                        f"{tpu.label} exists as a {found}, but the spec declares a {shape}; delete it "
                        f"(`podrun delete {tpu.label} {self.api.location.flags}`) or give the spec another "
                        f"target.tpu.name")

    def existing(self) -> list[TpuNode] | None:
        """The spec's nodes that exist; None while nothing holds its name (no node, no multislice request). Of
        slices made apart, None while any is missing: _create() makes those."""
        existing = [node for node in map(self.api.find, self.node_names) if node is not None]
        if self.apart:
            return existing if len(existing) == len(self.node_names) else None
        return None if not existing and not (self.multislice and self.api.get_queued(self.tpu.label)) else existing

    def lost(self, watch: bool = False) -> str | None:
        from podrun.cloud import capacity

        return capacity.departure(self.api, self.node_names, self.tpu.label, nodes_only=watch)

    def reacquire(self) -> None:
        """The TPU deleted and made again; of slices made apart, those lost alone, in their zone, the others
        staying with their code and host keys: where that zone has no capacity for them, the whole multislice
        moves to the next of its zones."""
        from podrun.cloud import capacity, zone_moves

        lost = [name for name in self.node_names if capacity.out_of_service(self.api.find(name))] if self.apart else []
        if not lost or len(lost) == len(self.node_names):
            self.give_back()
            self._create()
            return
        say(f"making {', '.join(f'slice {self.node_names.index(name)} ({name})' for name in lost)} again alone; "
            f"the other slices stay")
        for name in lost:
            capacity.release(self.api, name)
        others = [api for api in self._zone_apis() if api.location.zone != self.api.location.zone]
        try:
            zone_moves.obtain_in_zone(self.api, self._requests(lost), True, self._capacity_found,
                                      self.tpu.zone_wait_s if others else None)
        except NoCapacity as error:
            if not others:
                raise
            line = f"no capacity for {', '.join(lost)} in {self.api.location.zone} ({error.why}): the whole " \
                   f"multislice moves to {others[0].location.zone}"
            say(line)
            self._moved(self.api.location.zone, others[0].location.zone, line)
            self.give_back()
            self._create(others)
        self.just_created = True

    def give_back(self) -> None:
        from podrun.cloud import capacity

        for name in self._deleted_names():
            capacity.release(self.api, name)

    def self_delete_config(self) -> dict | None:
        from podrun.cloud import capacity

        return capacity.self_delete_config(self.api, self._deleted_names())

    def give_back_lost(self) -> None:
        if self.tpu.accelerator_type:
            say(f"deleting the preempted TPU VM {self.tpu.label}; the next `podrun exec` creates it again")
            self.give_back()
        else:
            say(f"the preempted TPU VM {self.tpu.label} keeps its name and quota until deleted: "
                f"`{self.give_back_command()}`")

    def give_back_command(self) -> str:
        return " && ".join(f"podrun delete {name} {self.api.location.flags} --yes"
                           for name in self._deleted_names())

    def _deleted_names(self) -> list[str]:
        """What give_back() deletes: the TPU VM or the multislice's queued resource; with names:, or slices made
        apart, each slice by itself."""
        return [self.tpu.label] if self.tpu.name and not self.apart else self.node_names

    def _create(self, zones: list[TpuApi] | None = None) -> None:
        """Create the TPU, in the first of its zones that has capacity (zone_moves.py; `zones`: these), with the
        user's key in its metadata, as `gcloud ... create --metadata ssh-keys=...` does: its workers take it as
        they boot, with no metadata update after; not where the project has OS Login on (the key goes to OS
        Login then). Of slices made apart, those that do not exist."""
        from podrun.cloud import zone_moves

        zones = zones or zone_moves.ordered(self._zone_apis(), self.api.location.zone)  # the zone that worked last first
        names = [name for name in self.node_names if zones[0].find(name) is None] if self.apart else None
        self._api, _ = zone_moves.obtain(zones, self._requests(names), self.tpu.zone_wait_s, self._capacity_found,
                                         self._moved)
        self.just_created = True

    def _requests(self, slice_names: list[str] | None = None) -> list[TpuRequest]:
        """What creating the TPU asks for; `slice_names`: those slices alone, each its own request (made apart)."""
        ssh_keys = "" if self.oslogin.governs(None) else self.key_line()
        if slice_names is None:
            return [self.request(ssh_keys)]
        return [self.request(ssh_keys, name) for name in slice_names]

    def _moved(self, from_zone: str, to_zone: str, line: str) -> None:
        self.moves.append({"at": time.time(), "from": from_zone, "to": to_zone, "why": line})

    def _capacity_found(self) -> None:
        """A queued request left the queue: the wait for capacity ends, the creation goes on (`podrun report`)."""
        self.queued_until = time.time()

    def request(self, ssh_keys: str = "", slice_name: str | None = None) -> TpuRequest:
        """What creating the TPU asks the API for; `slice_name`: that slice alone, of slices made apart (its own
        queued resource, as the multislice's would be)."""
        from podrun.cloud.request import TpuRequest, through_queue

        tpu = self.tpu
        assert tpu.accelerator_type and tpu.name, "only a TPU the spec declares by name and type is created"
        return TpuRequest(slice_name or tpu.name, tpu.accelerator_type,
                          tpu.runtime_version or accelerators.parse(tpu.accelerator_type).default_runtime,
                          queued=through_queue(tpu.queued, tpu.reservation, tpu.slices), spot=tpu.spot,
                          reservation=tpu.reservation, valid_for_s=tpu.valid_for_s,
                          metadata={"ssh-keys": ssh_keys} if ssh_keys else {},
                          slices=1 if slice_name else tpu.slices or 1, external_ips=not tpu.internal_ip, labels=self.labels)
