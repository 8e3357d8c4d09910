"""What the Cloud TPU API describes, as plain data: nodes and their workers, queued resources,
long-running operations, what a worker's guest agent published; read from the API's JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

from podrun.cloud.settings import Location


@dataclass(frozen=True)
class WorkerAddress:
    internal_ip: str
    external_ip: str | None


@dataclass(frozen=True)
class TpuNode:
    name: str  # the short name (node id)
    location: Location
    state: str
    accelerator_type: str
    runtime_version: str
    health: str
    spot: bool
    workers: list[WorkerAddress]
    metadata: dict[str, str] = field(default_factory=dict)
    queued_resource: str | None = None  # the short name of the queued resource that created it
    id: str = ""  # the number Google gave it; a node made again under the same name gets another
    reserved: bool = False  # it runs in a reservation (its schedulingConfig says)
    labels: dict[str, str] = field(default_factory=dict)
    created: str = ""  # createTime, RFC 3339 ("" where the API gave none)

    @property
    def full_name(self) -> str:
        return f"{self.location.parent}/nodes/{self.name}"


@dataclass(frozen=True)
class Published:
    """What a TPU worker's guest agent published about its VM (the node's guest attributes)."""

    host_keys: tuple[str, ...] = ()  # its sshd's keys, "ssh-ed25519 AAAA..."
    instance: str | None = None  # its Compute Engine instance's name (t1v-n-...-w-0), which IAP tunnels to


@dataclass(frozen=True)
class QueuedResource:
    """A queued resource (a request for TPU capacity) as the API has it."""

    name: str  # the short name (queued resource id)
    location: Location
    state: str  # ACCEPTED, WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE, FAILED, SUSPENDED, ...
    initiator: str  # who moved it there: USER or SERVICE
    error: str | None  # Google's message, for a FAILED (or SUSPENDED) request
    node_names: list[str]  # the nodes it makes: its node id, or a multislice prefix's NAME-0 .. NAME-(N-1)
    accelerator_type: str
    runtime_version: str
    spot: bool
    reservation: str | None
    valid_until: str | None  # its queueing policy, as the API writes it (e.g. "21600s")
    labels: dict[str, str] = field(default_factory=dict)  # its node spec's node's (the API gives it none of its own)
    created: str = ""  # createTime, RFC 3339


@dataclass(frozen=True)
class Pending:
    """A long-running operation at Google: its name, what it does (`creating TPU VM x`), on which node."""

    operation: str
    doing: str
    node: str


def node_from_json(node: dict, location: Location) -> TpuNode:
    """A node as the API's JSON has it: camelCase fields, enums by name, defaults left out."""
    scheduling = node.get("schedulingConfig", {})
    return TpuNode(
        name=node["name"].rsplit("/", 1)[-1], location=location,
        state=node.get("state", "STATE_UNSPECIFIED"), accelerator_type=node.get("acceleratorType", ""),
        runtime_version=node.get("runtimeVersion", ""), health=node.get("health", "HEALTH_UNSPECIFIED"),
        spot=bool(scheduling.get("spot") or scheduling.get("preemptible")),
        workers=[WorkerAddress(endpoint.get("ipAddress", ""),
                               endpoint.get("accessConfig", {}).get("externalIp") or None)
                 for endpoint in node.get("networkEndpoints", [])],
        metadata=dict(node.get("metadata", {})),
        queued_resource=node["queuedResource"].rsplit("/", 1)[-1] if node.get("queuedResource") else None,
        id=node.get("id", ""), reserved=bool(scheduling.get("reserved")), labels=dict(node.get("labels", {})),
        created=node.get("createTime", ""))


def queued_from_json(resource: dict, location: Location) -> QueuedResource:
    """A queued resource as the API's JSON has it (camelCase, enums by name, defaults left out)."""
    state = resource.get("state", {})
    data = next((value for key, value in state.items() if key.endswith("Data") and isinstance(value, dict)), {})
    specs = resource.get("tpu", {}).get("nodeSpec", [])
    names: list[str] = []
    for spec in specs:
        multislice = spec.get("multisliceParams")
        names += ([f"{multislice.get('nodeIdPrefix')}-{i}" for i in range(int(multislice.get("nodeCount", 0)))]
                  if multislice else [spec.get("nodeId", "")])
    node = specs[0].get("node", {}) if specs else {}
    return QueuedResource(
        name=resource["name"].rsplit("/", 1)[-1], location=location,
        state=state.get("state", "STATE_UNSPECIFIED"), initiator=state.get("stateInitiator", ""),
        error=(data.get("error") or {}).get("message"), node_names=names,
        accelerator_type=node.get("acceleratorType", ""), runtime_version=node.get("runtimeVersion", ""),
        spot="spot" in resource, reservation=resource.get("reservationName", "").rsplit("/", 1)[-1] or None,
        valid_until=(resource.get("queueingPolicy") or {}).get("validUntilDuration"),
        labels=dict(node.get("labels", {})), created=resource.get("createTime", ""))
