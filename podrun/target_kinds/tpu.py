"""A TPU VM target's options (`target: {tpu: {...}}`, `exec --tpu NAME`): an existing TPU VM, one podrun
creates from its accelerator type, or the slices of a multislice. The target itself is tpu.py's."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema, model_validator

from podrun.cloud import accelerators
from podrun.cloud.request import NODE_NAME, NODE_NAME_RULE, multislice_node_names, through_queue
from podrun.errors import PodrunError
from podrun.output import counted
from podrun.spec.fields import DURATION_SCHEMA, Model, duration_s, got
from podrun.target_kinds.kind import AdhocFlag, TargetKind

EXPECTED = {
    "": "a mapping such as {name: my-pod, zone: us-central2-b}",
    "name": "the TPU VM's name, such as my-pod",
    "names": "a list of two or more TPU VM names, such as [pod-a, pod-b]",
    "names.*": "a TPU VM's name, such as pod-a",
    "slices": f"a number of slices from 2 to {accelerators.MAX_SLICES}",
    "recreate": "all (the multislice is one queued resource) or slice (each slice its own, made again alone)",
    "zone": "a zone such as us-central2-b",
    "zones": "a list of zones to try in order, such as [us-east5-a, us-central1-a]",
    "zones.*": "a zone such as us-east5-a",
    "zone_wait": "a duration above 0 such as 30m, 6h or 1h30m",
    "project": "a project id such as my-project",
    "internal_ip": "true or false",
    "iap": "true or false",
    "accelerator_type": "an accelerator type such as v4-8, v5p-8, v5litepod-16 or v6e-8",
    "runtime_version": "a runtime version such as tpu-ubuntu2204-base",
    "queued": "true or false",
    "spot": "true or false",
    "reservation": "a reservation's name",
    "valid_for": "a duration above 0 such as 30m, 6h or 1h30m",
}
# what says how podrun creates the TPU; each needs accelerator_type, without which podrun creates nothing
CREATION_FIELDS = ("runtime_version", "queued", "spot", "reservation", "valid_for_s", "zones", "zone_wait_s", "recreate")
SPEC_NAMES = {"valid_for_s": "valid_for", "zone_wait_s": "zone_wait"}  # fields whose spec name is another


def _accelerator_type(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValueError(f"expected {EXPECTED['accelerator_type']}, got {got(value)}")
    try:
        return accelerators.parse(value).name
    except PodrunError as error:
        raise ValueError(str(error)) from None


def parse_valid_for(value: Any) -> float:
    """`target.tpu.valid_for` (and `create --valid-for`), `zone_wait` too: a duration above 0 -> seconds."""
    seconds = duration_s(value) if isinstance(value, str) else value if type(value) in (int, float) else None
    if seconds is None or not seconds > 0:
        raise ValueError(f"expected {EXPECTED['valid_for']}, got {got(value)}")
    return float(seconds)


def _shown(fields: list[str]) -> str:
    return ", ".join(SPEC_NAMES.get(name, name) for name in fields)


def _node_name(value: str) -> str:
    if not NODE_NAME.match(value):
        raise ValueError(f"expected a TPU VM name ({NODE_NAME_RULE}), got {value!r}")
    return value


def _zone_name(value: str) -> str:
    if not accelerators.ZONE_NAME.match(value):
        raise ValueError(f"expected {EXPECTED['zones.*']} (a region and a letter), got {value!r}")
    return value


ZoneName = Annotated[str, AfterValidator(_zone_name),
                     WithJsonSchema({"type": "string", "pattern": accelerators.ZONE_NAME.pattern.replace("\\Z", "$")})]
TpuName = Annotated[str, AfterValidator(_node_name),
                    WithJsonSchema({"type": "string", "pattern": NODE_NAME.pattern.replace("\\Z", "$")})]


class TpuOptions(Model):
    name: TpuName | None = Field(None, description="TPU VM name; with slices, its queued resource's, and the prefix "
                                                   "of its slices' names (NAME-0, NAME-1, ...)")
    names: list[TpuName] | None = Field(
        None, min_length=2, description="Multislice: TPU VMs created separately, joined as slices in this order")
    slices: int | None = Field(None, ge=2, le=accelerators.MAX_SLICES,
                               description="Multislice: this many slices, NAME-0 .. NAME-(N-1), as one queued resource")
    recreate: Literal["all", "slice"] = Field(
        "all", description="with slices: what a preemption of one slice makes again: all (the multislice is one "
                           "queued resource, deleted and made again whole) or slice (each slice its own queued "
                           "resource, NAME-i: the lost one is made again alone, the others stay)")
    zone: str | None = None
    zones: list[ZoneName] | None = Field(
        None, min_length=1, description="zones to create the TPU in, tried in order: a stockout, or a queued request "
                                        "waiting past zone_wait, moves it to the next (instead of zone)")
    zone_wait_s: Annotated[float, BeforeValidator(parse_valid_for), WithJsonSchema(DURATION_SCHEMA)] | None = Field(
        None, alias="zone_wait", description="with zones: how long a queued request may wait in one zone before podrun "
                                             "deletes it and asks in the next, e.g. 30m (the TPU is asked for queued)")
    project: str | None = None
    internal_ip: bool = Field(False, description="connect to the workers' internal IPs")
    iap: bool = Field(False, description="reach each worker through an IAP tunnel (`gcloud compute start-iap-tunnel`), "
                                         "as gcloud's tpu-vm ssh --tunnel-through-iap does: no external IP needed")
    accelerator_type: Annotated[str, BeforeValidator(_accelerator_type)] | None = Field(
        None, description="e.g. v4-32, v5litepod-16: `podrun exec` creates the TPU VM when it does not exist")
    runtime_version: str | None = Field(None, min_length=1, description="default: the generation's runtime")
    queued: bool = Field(False, description="create it through a queued resource, waiting for capacity")
    spot: bool = Field(False, description="a Spot TPU: cheaper, may be preempted")
    reservation: str | None = Field(None, min_length=1, description="create it in this reservation (queued)")
    valid_for_s: Annotated[float, BeforeValidator(parse_valid_for), WithJsonSchema(DURATION_SCHEMA)] | None = Field(
        None, alias="valid_for", description="how long a queued request may wait for capacity, e.g. 6h")

    @model_validator(mode="after")
    def _creation_needs_a_type(self) -> TpuOptions:
        if (self.name is None) == (self.names is None):
            raise ValueError("expected exactly one of name and names: name for a TPU VM (with slices, a multislice), "
                             "names for TPU VMs created separately, joined as slices" + ("; got both" if self.name else ""))
        if self.names is not None:
            said = [name for name in ("slices", "accelerator_type", *CREATION_FIELDS) if name in self.model_fields_set]
            if said:
                shown = _shown(said)
                raise ValueError(f"names joins TPU VMs created separately, which podrun does not create: remove {shown} "
                                 f"(or use name with slices: N to have podrun create the slices)")
            if len(set(self.names)) < len(self.names):
                raise ValueError(f"names lists a TPU VM twice: {', '.join(self.names)}")
        given = [name for name in CREATION_FIELDS if name in self.model_fields_set]
        if given and not self.accelerator_type:
            if "zones" in given:
                raise ValueError("zones are where podrun creates the TPU VM, which needs accelerator_type (e.g. v4-8); "
                                 "a TPU VM that exists is in one zone: give it as zone")
            raise ValueError(f"{_shown(given)} say(s) how to create the TPU VM: set accelerator_type too (e.g. v4-8)")
        if self.recreate == "slice" and not self.slices:
            raise ValueError("recreate: slice makes the slices of a multislice again one by one: set slices too")
        if self.spot and self.reservation:
            raise ValueError("spot and reservation exclude each other: a TPU is either Spot or reserved")
        self._check_zones()
        if self.valid_for_s is not None and not through_queue(self.queued, self.reservation, self.slices):
            raise ValueError("valid_for is how long a queued request waits: set queued: true too")
        return self

    def _check_zones(self) -> None:
        if self.zones is None:
            if self.zone_wait_s is not None:
                raise ValueError("zone_wait is how long a queued request waits in one of zones: set zones too")
            return
        if self.zone:
            raise ValueError("zone and zones exclude each other: list every zone in zones, the first is tried first")
        if len(set(self.zones)) < len(self.zones):
            raise ValueError(f"zones lists a zone twice: {', '.join(self.zones)}")
        if self.zone_wait_s is not None:
            self.queued = True  # only a queued request waits: zone_wait asks through the queue, as slices do

    @property
    def node_names(self) -> list[str]:
        """The TPU VMs the job runs on, slice by slice."""
        if self.names:
            return list(self.names)
        assert self.name is not None, "a TpuOptions has a name or names"
        return multislice_node_names(self.name, self.slices) if self.slices else [self.name]

    @property
    def zone_order(self) -> list[str | None]:
        """The zones to create the TPU in, in order: zones, else the one zone (None: gcloud's)."""
        return list(self.zones) if self.zones else [self.zone]

    @property
    def label(self) -> str:
        """What to call it in messages and commands: the name, or the joined names."""
        return self.name or "+".join(self.names or [])


def _summary(tpu: TpuOptions) -> str:
    shape = f", {tpu.accelerator_type}" if tpu.accelerator_type else ""
    if tpu.names or tpu.slices:
        return f"the multislice {tpu.label} ({counted(len(tpu.node_names), 'slice')}{shape})"
    return f"the TPU VM {tpu.label}" + (f" ({tpu.accelerator_type}, created if missing)" if shape else "")


def _doubts(tpu: TpuOptions) -> list[tuple[str, str]]:
    """Zones that podrun's table does not list for the type: asked in all the same (accelerators.py)."""
    if tpu.zones and tpu.accelerator_type and (unlisted := accelerators.unlisted_zones(tpu.accelerator_type, tpu.zones)):
        return [("zones", unlisted)]
    return []


def _worker_count(tpu: TpuOptions) -> int | None:
    """Known before the API is asked only for a TPU podrun creates: its type says."""
    if not tpu.accelerator_type:
        return None
    return accelerators.parse(tpu.accelerator_type).hosts * len(tpu.node_names)


def _from_flags(value: str, extras: Any) -> dict:
    names = value.split(",")
    where = {key: extras[key] for key in ("zone", "project") if extras.get(key)}
    iap = {"iap": True} if extras.get("tunnel_through_iap") else {}
    return {**({"names": names} if len(names) > 1 else {"name": value}), **where, **iap}


KIND = TargetKind(
    name="tpu", annotation=TpuOptions, description="a TPU VM or pod slice, or the slices of a multislice",
    implementation="podrun.targets.tpu:TpuVm", expected=EXPECTED, nothing="the TPU VM's fields (at least name)",
    flag=AdhocFlag("--tpu", "NAME", "a TPU VM (slices created separately: NAME,NAME,...)"),
    extra_flags=(AdhocFlag("--zone", "Z", "the TPU's zone (default: gcloud's)"),
                 AdhocFlag("--project", "P", "the TPU's project (default: gcloud's)"),
                 AdhocFlag("--tunnel-through-iap", "", "reach the TPU's workers through IAP, as gcloud's tpu-vm ssh "
                           "does: no external IP needed (target.tpu.iap: true; with a spec too)", spec_field="iap")),
    to_options=_from_flags, uses_ssh=True, summary=_summary, worker_count=_worker_count, doubts=_doubts,
    recreates=lambda tpu: bool(tpu.accelerator_type), deletes=True, default_restart_on=("preemption",))
