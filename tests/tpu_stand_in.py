"""A stand-in for Google's Cloud TPU v2 REST API on 127.0.0.1 (or the lab's bridge), whose nodes' workers are lab hosts.

It speaks the API as Google documents it (https://cloud.google.com/tpu/docs/reference/rest/v2/
projects.locations.nodes) and as the real clients on these machines were seen to need: paths
`/v2/projects/P/locations/Z/nodes[/ID]`, camelCase fields, enums as strings (the Python client sends
integers, both are accepted), `"apiVersion": "V2"`, long-running operations
named `projects/P/locations/Z/operations/ID` that finish after `operation_delay_s`, and errors as
google.rpc.Status bodies. A bearer token is required, as Google requires one; with `accepted_tokens`
set, any other is answered 401 UNAUTHENTICATED, as Google answers an expired one. `deny(token,
permission)` takes an IAM permission (`tpu.nodes.delete`, `tpu.queuedResources.delete`) from the
account of that token (a VM's service account, tests/metadata_stand_in.py): its DELETE is answered 403
PERMISSION_DENIED in Google's words.

Capacity is the lab: a node of k hosts takes the next k free lab hosts as its `networkEndpoints`
(internal `ipAddress`; `accessConfig.externalIp` only when its `networkConfig.enableExternalIps` is
true: left out, it takes the API's default, false, as on Google); when too few are free, its create
operation fails with RESOURCE_EXHAUSTED, as a zone out of capacity does. Hosts a node takes are new
VMs: they come with sshd host keys of their own (`on_new_vm`), which `:getGuestAttributes`
(namespace `hostkeys`) publishes, as a TPU VM's guest agent does, with each worker's Compute Engine
instance name (key `hostname`, `t1v-n-<8 hex>-w-<worker>`), which Compute Engine's `instances.get`
(`/compute/v1/projects/P/zones/Z/instances/NAME`) resolves to its nic0 address, as IAP resolves a
tunnel's instance (tests/gcloud_iap_stand_in.py asks it). In a project of `external_ips_denied_projects`
(the organization policy constraints/compute.vmExternalIpAccess allowing no VM an external IP), a node
that asks for external IPs is refused as its VMs are made, with Compute Engine's words: its create
operation fails FAILED_PRECONDITION and the node is gone; a queued resource goes FAILED with that error.
Like a TPU VM's guest agent too, the `ssh-keys` metadata of a node is written to its hosts'
authorized_keys (see `on_ssh_keys`), unless OS Login governs the node (`enable-oslogin` TRUE in its
metadata, else in its project's, `project_metadata`, which compute's `projects.get` serves): then those
keys count for nothing, and its hosts take keys only from the OS Login stand-in (tests/oslogin_stand_in.py).
A node's `labels` (checked against Google's rules) are kept and returned as given, on a node made
directly or from a queued resource's node spec; left out, a node has none, as on Google.
Every request's body is kept (`bodies`); `node_requests()` gives the Node of each create. Who sent
each request (its client address and bearer token) is kept too (`received`, `callers()`): served on the
lab's bridge (`serve(BRIDGE_IP)`), a request from a lab host comes from that host's address.

Queued resources (`/v2/projects/P/locations/Z/queuedResources[/ID]`): create is a
long-running operation that leaves the request ACCEPTED; then, driven by time like the operations
(each state lasts at least `operation_delay_s`, checked on every request), it goes
WAITING_FOR_RESOURCES -> PROVISIONING (its node(s) are created, CREATING, taking lab hosts as node
create does) -> ACTIVE (nodes READY). It waits in WAITING_FOR_RESOURCES while capacity is withheld
(`withhold_capacity(seconds)`), its zone is in `exhausted_zones`, too few lab hosts are free (the
real service queues rather than fails) or before its `validAfter*`; its `validUntil*` passing while
it waits makes it FAILED. `DELETE` without `force` takes only ACCEPTED, WAITING_FOR_RESOURCES,
FAILED or SUSPENDED requests with no nodes (else FAILED_PRECONDITION); `force=true` deletes the
nodes first. `preempt(node)` is what happens to a spot VM: the node goes PREEMPTED, its queued
resource SUSPENDED (stateInitiator SERVICE), never re-queued, keeping its name until force-deleted,
and its hosts vanish at once while the API shows all that only `preemption_lag_s` later (Google
shows it once the VM's shutdown is over, tens of seconds after SSH felt it; math.inf: never):
`on_preempt(endpoints)` is called (on a lab: every process in the hosts'
namespaces is killed, sshd included); when the node is deleted its hosts come back as fresh
capacity through `on_revive(endpoints)` (on a lab: an empty home, as a new VM's boot disk, and sshd
started again with a new host key), and `shutdown()` revives any host still gone, so a later test finds the lab whole.

An API that is slow or does not answer: with `stall_s` set, every request is read and then left
unanswered for that many seconds (math.inf: never, until shutdown), the connection held open.

Run alone for benchmarks:  python tests/tpu_stand_in.py --hosts 10.99.0.10,10.99.16.10 ...
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import SplitResult, parse_qs, urlsplit

NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
METADATA_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
QUEUED_RESOURCE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
NODE_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_KEY, LABEL_VALUE = re.compile(r"^[a-z][a-z0-9_-]{0,62}\Z"), re.compile(r"^[a-z0-9_-]{0,63}\Z")  # Google's label rules
PROJECT_NUMBER = "4815162342"  # every project's number here (Compute Engine's projects.get `id`)
# the zone's acceleratorTypes and how many hosts (workers) each has
ACCELERATOR_HOSTS = {
    **{f"v2-{cores}": cores // 8 for cores in (8, 32, 128, 256, 512)},
    **{f"v3-{cores}": cores // 8 for cores in (8, 32, 64, 128, 256, 512, 1024, 2048)},
    **{f"v4-{cores}": cores // 8 for cores in (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)},
    **{f"v5p-{cores}": cores // 8 for cores in (8, 16, 32, 64, 128, 256, 512, 1024)},
    **{f"{family}-{chips}": 1 if chips <= 8 else chips // 4
       for family in ("v5litepod", "v6e") for chips in (1, 4, 8, 16, 32, 64, 128, 256)},
}
# the zone's runtimeVersions
RUNTIME_VERSIONS = {"tpu-ubuntu2204-base", "tpu-vm-tf-2.16.1-pod-pjrt", "v2-alpha-tpuv5", "v2-alpha-tpuv5-lite",
                    "v2-alpha-tpuv6e"}
# Google's answer to an access token that expired or was never valid
INVALID_CREDENTIALS = ("Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or "
                       "other valid authentication credential. See "
                       "https://developers.google.com/identity/sign-in/web/devconsole-project.")
# google.rpc.Code numbers and the HTTP status each maps to
CODES = {"INVALID_ARGUMENT": (3, 400), "NOT_FOUND": (5, 404), "ALREADY_EXISTS": (6, 409),
         "FAILED_PRECONDITION": (9, 400),
         "PERMISSION_DENIED": (7, 403), "RESOURCE_EXHAUSTED": (8, 429), "UNAUTHENTICATED": (16, 401)}
# enum fields as the Python client sends them (integers), by their names in the v2 protos
ENUMS = {"state": ["STATE_UNSPECIFIED", "CREATING", "READY", "RESTARTING", "REIMAGING", "DELETING",
                   "REPAIRING", "STOPPED", "STOPPING", "STARTING", "PREEMPTED", "TERMINATED", "HIDING",
                   "HIDDEN", "UNHIDING", "UNKNOWN"],
         "health": ["HEALTH_UNSPECIFIED", "HEALTHY", "TIMEOUT", "UNHEALTHY_TENSORFLOW",
                    "UNHEALTHY_MAINTENANCE"],
         "apiVersion": ["API_VERSION_UNSPECIFIED", "V1_ALPHA1", "V1", "V2_ALPHA1", "V2"]}
# google.cloud.tpu.v2.QueuedResourceState: State and StateInitiator, by number
QUEUED_STATES = ["STATE_UNSPECIFIED", "CREATING", "ACCEPTED", "PROVISIONING", "FAILED", "DELETING", "ACTIVE",
                 "SUSPENDING", "SUSPENDED", "WAITING_FOR_RESOURCES"]
STATE_INITIATORS = ["STATE_INITIATOR_UNSPECIFIED", "USER", "SERVICE"]
# the oneof state_data member each state carries (WAITING_FOR_RESOURCES has none in v2)
STATE_DATA = {"CREATING": "creatingData", "ACCEPTED": "acceptedData", "PROVISIONING": "provisioningData",
              "FAILED": "failedData", "DELETING": "deletingData", "ACTIVE": "activeData",
              "SUSPENDING": "suspendingData", "SUSPENDED": "suspendedData"}
# what DELETE without force takes (and only with no nodes); WAITING_FOR_RESOURCES replaced ACCEPTED
DELETABLE_WITHOUT_FORCE = {"ACCEPTED", "WAITING_FOR_RESOURCES", "FAILED", "SUSPENDED"}


class ApiError(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class LabEndpoint:
    internal_ip: str
    external_ip: str
    host_index: int  # the lab host it is
    host_key: str = ""  # its sshd's public key, "ssh-ed25519 AAAA...", as the guest agent publishes it; "": none


@dataclass(frozen=True)
class Received:
    """One request as it arrived: from which client address, with which bearer token ("" if none)."""
    method: str
    path: str
    client: str
    token: str


@dataclass
class Operation:
    name: str
    target: str
    verb: str
    done_at: float
    finish: Callable[[], dict | ApiError]  # runs once, when the operation is done: its response or error
    created: str = field(default_factory=lambda: _timestamp())
    outcome: dict | ApiError | None = None


@dataclass
class Queued:
    """What the stand-in keeps beside a queued resource's JSON."""
    resource: dict  # the QueuedResource as the API returns it
    zone: str
    specs: list[tuple[str, dict]]  # (node full name, the Node body to create it from)
    hosts: int  # lab hosts all its nodes take together
    since: float  # monotonic time it entered its state
    not_before: float  # validAfter*, monotonic
    deadline: float  # validUntil*, monotonic (math.inf: none)
    nodes: list[str] = field(default_factory=list)  # full names of the nodes it created that still exist


class TpuStandIn:
    """The API's state; `serve()` puts it on a port. Tests read and set it directly."""

    def __init__(self, endpoints: list[LabEndpoint], operation_delay_s: float = 0.5,
                 on_ssh_keys: Callable[[list[LabEndpoint], str], None] | None = None,
                 on_preempt: Callable[[list[LabEndpoint]], None] | None = None,
                 on_revive: Callable[[list[LabEndpoint]], None] | None = None,
                 on_new_vm: Callable[[list[LabEndpoint]], None] | None = None):
        self.free = list(endpoints)
        self.operation_delay_s = operation_delay_s
        self.on_ssh_keys = on_ssh_keys or (lambda endpoints, keys: None)
        # a preempted node's hosts vanish (on_preempt) and come back as fresh capacity when it is deleted
        self.on_preempt = on_preempt or (lambda endpoints: None)
        self.on_revive = on_revive or (lambda endpoints: None)
        # hosts a node takes are new VMs, with host keys of their own (their `host_key` is updated)
        self.on_new_vm = on_new_vm or (lambda endpoints: None)
        self.vanished: list[LabEndpoint] = []
        self.queued: dict[str, Queued] = {}  # by full name
        self.capacity_withheld_until = 0.0  # monotonic; until then queued requests keep waiting
        self.nodes: dict[str, dict] = {}  # by full name
        self.node_endpoints: dict[str, list[LabEndpoint]] = {}
        self.operations: dict[str, Operation] = {}
        self.exhausted_zones: set[str] = set()
        self.denied_projects: set[str] = set()  # projects where the API is not enabled
        # each project's metadata (compute projects.get's commonInstanceMetadata): `enable-oslogin`, ...
        self.project_metadata: dict[str, dict[str, str]] = {}
        self.quota_exhausted_projects: set[str] = set()
        # projects whose organization policy constraints/compute.vmExternalIpAccess allows no VM an external IP
        self.external_ips_denied_projects: set[str] = set()
        self.requests: list[tuple[str, str]] = []  # (method, path) as received
        self.bodies: list[tuple[str, str, dict, dict]] = []  # (method, path, query, JSON body) as received
        self.received: list[Received] = []  # every request, answered or refused, with who sent it
        self.accepted_tokens: set[str] | None = None  # None: any bearer token; else others get 401, as an expired one does
        self.lacking: dict[str, set[str]] = {}  # bearer token -> the IAM permissions its account lacks (deny)
        self.publishes_host_keys = True  # False: guest agents that published nothing (yet)
        self.stall_s = 0.0  # seconds each request waits before it is answered; math.inf: never
        self.preemption_lag_s = 1.0  # from a preemption (its hosts gone) to the API showing it
        self.lagging: list[tuple[float, str]] = []  # (monotonic time the API shows it, node full name)
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.server: ThreadingHTTPServer | None = None

    @classmethod
    def on_lab(cls, lab, operation_delay_s: float, capacity: list[int] | None = None) -> TpuStandIn:
        """Capacity: the hosts of a tests/lab.py Lab (those of indices `capacity`; None: all of them), the
        only hosts nodes ever take, also when a node is created again. Like a TPU VM's guest agent, the
        node's `ssh-keys` metadata ("user:key" lines) for root is installed on its hosts."""
        def install_root_keys(endpoints: list[LabEndpoint], ssh_keys: str) -> None:
            keys = "".join(line.partition(":")[2] + "\n" for line in ssh_keys.splitlines() if line.startswith("root:"))
            for endpoint in endpoints:
                lab.authorize(endpoint.host_index, keys)

        def vanish(endpoints: list[LabEndpoint]) -> None:
            """A preempted VM: every process on the host (its sshd, a job's workers) is gone."""
            for endpoint in endpoints:
                host = lab.hosts[endpoint.host_index]
                pids = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True,
                                      text=True).stdout.split()
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if host.sshd:
                    host.sshd.wait()

        def new_vm(endpoints: list[LabEndpoint]) -> None:
            """A VM made (again) on the hosts: sshd with a host key made now, which its guest agent publishes."""
            for endpoint in endpoints:
                lab.renew_host_key(endpoint.host_index)
                endpoint.host_key = lab.hosts[endpoint.host_index].host_key()

        def revive(endpoints: list[LabEndpoint]) -> None:
            """A VM created again: a fresh boot disk (nothing of the old home is left) and sshd up."""
            for endpoint in endpoints:
                home = lab.hosts[endpoint.host_index].home
                shutil.rmtree(home)
                home.mkdir()
                lab.authorize(endpoint.host_index)
                for user_home in lab.hosts[endpoint.host_index].homes.iterdir():  # as pam_mkhomedir makes them
                    owner = user_home.stat()
                    shutil.rmtree(user_home)
                    user_home.mkdir(0o700)
                    os.chown(user_home, owner.st_uid, owner.st_gid)
            new_vm(endpoints)

        hosts = [lab.hosts[i] for i in capacity] if capacity is not None else lab.hosts
        return cls([LabEndpoint(h.ip, h.external_ip, h.index, h.host_key()) for h in hosts], operation_delay_s,
                   install_root_keys, vanish, revive, new_vm)

    # --- serving ---------------------------------------------------------------------------
    def serve(self, address: str = "127.0.0.1", port: int = 0) -> str:
        """Start answering on `address` (the lab's BRIDGE_IP: lab hosts reach it too); returns its URL."""
        stand_in = self

        class Handler(JsonHandler):
            def answer(self, method: str, url: SplitResult, body: dict) -> None:
                authorization = self.headers.get("Authorization", "")
                with stand_in.lock:
                    stand_in.received.append(Received(method, url.path, self.client_address[0],
                                                      authorization.removeprefix("Bearer ").strip()))
                if stand_in.stall():
                    return
                try:
                    if not authorization.startswith("Bearer "):
                        raise ApiError("UNAUTHENTICATED", "Request is missing required authentication credential.")
                    if stand_in.accepted_tokens is not None and authorization[7:] not in stand_in.accepted_tokens:
                        raise ApiError("UNAUTHENTICATED", INVALID_CREDENTIALS)
                    stand_in.check_permission(method, url.path, authorization[7:])
                    status, answer = 200, stand_in.handle(method, url.path, parse_qs(url.query), body)
                except ApiError as error:
                    status, answer = error_body(error)
                send_json(self, status, answer)

        self.server = ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://{address}:{self.server.server_address[1]}"

    def stall(self) -> bool:
        """Hold the request for stall_s; whether the stand-in is shutting down meanwhile (then the
        request is never answered)."""
        if not self.stall_s:
            return False
        return self.stopping.wait(None if math.isinf(self.stall_s) else self.stall_s)

    def shutdown(self) -> None:
        self.stopping.set()
        if self.server:
            self.server.shutdown()
            self.server.server_close()
        with self.lock:
            vanished, self.vanished = self.vanished, []
        if vanished:
            self.on_revive(vanished)

    def check_permission(self, method: str, path: str, token: str) -> None:
        """PERMISSION_DENIED, as IAM words it, for a DELETE whose permission the token's account lacks."""
        deleted = re.fullmatch(r"/v2/(projects/[^/]+/locations/[^/]+/(nodes|queuedResources)/[^/:]+)", path)
        if method != "DELETE" or not deleted:
            return
        permission = f"tpu.{deleted[2]}.delete"
        with self.lock:
            lacking = permission in self.lacking.get(token, set())
        if lacking:
            raise ApiError("PERMISSION_DENIED", f"Permission '{permission}' denied on resource "
                                                f"'//tpu.googleapis.com/{deleted[1]}' (or it may not exist).")

    # --- test hooks ----------------------------------------------------------------------------
    def deny(self, token: str, *permissions: str) -> None:
        """The account whose access token is `token` lacks these IAM permissions from now on."""
        with self.lock:
            self.lacking.setdefault(token, set()).update(permissions)

    def withhold_capacity(self, seconds: float) -> None:
        """For `seconds` from now (math.inf: until called again with 0), queued requests find no
        capacity and stay WAITING_FOR_RESOURCES."""
        with self.lock:
            self.capacity_withheld_until = time.monotonic() + seconds

    def preempt(self, node: str) -> None:
        """Preempt a node (its id or full name), as Google preempts a spot VM: its hosts vanish at once
        (`on_preempt`); `preemption_lag_s` later the node goes PREEMPTED and its queued resource (if any)
        SUSPENDED by the SERVICE."""
        with self.lock:
            self._advance()
            name = self._full_node_name(node)
            self._find(self.nodes, name, "Node")
            endpoints = [e for e in self.node_endpoints.get(name, []) if e not in self.vanished]
            self.vanished += endpoints
            self.lagging.append((time.monotonic() + self.preemption_lag_s, name))
            self._show_preemptions()
        if endpoints:
            self.on_preempt(endpoints)

    def start_maintenance(self, node: str) -> None:
        """A maintenance event on a node (its id): its health turns UNHEALTHY_MAINTENANCE while it stays
        READY and its hosts keep running, until the VM is restarted."""
        with self.lock:
            self._find(self.nodes, self._full_node_name(node), "Node")["health"] = "UNHEALTHY_MAINTENANCE"

    def node_endpoints_of(self, node: str) -> list[LabEndpoint]:
        """The lab hosts a node (its id) runs on, in worker order."""
        with self.lock:
            return list(self.node_endpoints[self._full_node_name(node)])

    def _full_node_name(self, node: str) -> str:
        return node if "/" in node else next((full for full in self.nodes if full.endswith(f"/nodes/{node}")), node)

    def _show_preemptions(self) -> None:
        """What the API shows of the preemptions whose lag is over."""
        now = time.monotonic()
        for shown_at, name in [each for each in self.lagging if each[0] <= now]:
            self.lagging.remove((shown_at, name))
            if self.nodes[name]["state"] == "DELETING":
                continue
            self.nodes[name]["state"] = "PREEMPTED"
            for queued in self.queued.values():
                if name in queued.nodes:
                    self._set_state(queued, "SUSPENDED", "SERVICE")

    def callers(self, since: int = 0) -> set[tuple[str, str]]:
        """Who sent the requests received from the `since`-th on (len(received) at some moment): each
        (client address, bearer token) pair."""
        with self.lock:
            return {(request.client, request.token) for request in self.received[since:]}

    def node_requests(self) -> list[tuple[str, dict]]:
        """The Node of every create request received, in order, with the id it was asked under: a
        node's (nodeId), or each node spec's of a queued resource (queuedResourceId)."""
        with self.lock:
            bodies = list(self.bodies)
        nodes = []
        for method, path, query, body in bodies:
            if method == "POST" and path.endswith("/nodes"):
                nodes.append((query.get("nodeId", [""])[0], body))
            elif method == "POST" and path.endswith("/queuedResources"):
                nodes += [(query.get("queuedResourceId", [""])[0], spec.get("node", {}))
                          for spec in (body.get("tpu") or {}).get("nodeSpec", [])]
        return nodes

    def node_names(self, queued_resource: str) -> list[str]:
        """The full names of the nodes a queued resource (its id or full name) names, in order."""
        with self.lock:
            name = queued_resource if "/" in queued_resource else next(
                (full for full in self.queued if full.endswith(f"/queuedResources/{queued_resource}")), "")
            return [node for node, _ in self._find(self.queued, name, "QueuedResource").specs]

    # --- the API ---------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, body: dict) -> dict:
        with self.lock:
            self.requests.append((method, path))
            self.bodies.append((method, path, query, body))
            if compute := re.fullmatch(r"/compute/v1/projects/([^/]+)", path):
                if method != "GET":
                    raise ApiError("NOT_FOUND", f"{method} {path} not found")
                return self._compute_project(compute[1])
            if instance := re.fullmatch(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)", path):
                if method != "GET":
                    raise ApiError("NOT_FOUND", f"{method} {path} not found")
                return self._compute_instance(*instance.groups())
            match = re.fullmatch(r"/v2/(projects/([^/]+)/locations/([^/]+))/(nodes|operations|queuedResources)"
                                 r"(?:/([^/:]+))?(:\w+)?", path)
            if not match:
                raise ApiError("NOT_FOUND", f"The requested URL {path} was not found on this server.")
            parent, project, zone, collection, resource_id, verb = match.groups()
            if project in self.denied_projects:
                raise ApiError("PERMISSION_DENIED", f"Cloud TPU API has not been used in project {project} before "
                                                    f"or it is disabled. Enable it by visiting https://console."
                                                    f"developers.google.com/apis/api/tpu.googleapis.com/overview"
                                                    f"?project={project} then retry.")
            self._advance()
            name = f"{parent}/{collection}/{resource_id}"
            if collection == "operations" and method == "GET" and resource_id:
                return self._operation_json(self._find(self.operations, name, "Operation"))
            if collection == "queuedResources":
                return self._queued_resources(method, parent, zone, name if resource_id else "", verb, query, body)
            if collection != "nodes":
                raise ApiError("NOT_FOUND", f"{path} not found")
            if method == "POST" and not resource_id:
                return self._create(parent, zone, query.get("nodeId", [""])[0], body)
            if method == "GET" and not resource_id:
                nodes = [node for full_name, node in sorted(self.nodes.items()) if full_name.startswith(parent + "/")]
                return {"nodes": nodes} if nodes else {}
            node = self._find(self.nodes, name, "Node")
            if method == "GET" and not verb:
                return node
            if method == "DELETE":
                return self._delete(parent, name, node)
            if method == "PATCH":
                return self._patch(parent, name, node, query.get("updateMask", [""])[0], body)
            if method == "POST" and verb == ":getGuestAttributes":
                return self._guest_attributes(name, [w for w in body.get("workerIds", []) if w])
            raise ApiError("NOT_FOUND", f"{method} {path} not found")

    def _create(self, parent: str, zone: str, node_id: str, body: dict) -> dict:
        if not NODE_ID.match(node_id):
            raise ApiError("INVALID_ARGUMENT", f"Invalid node id {node_id!r}: it must match {NODE_ID.pattern}")
        name = f"{parent}/nodes/{node_id}"
        if name in self.nodes:
            raise ApiError("ALREADY_EXISTS", f"Resource '{name}' already exists")
        self._validate_node_body(zone, body)
        accelerator = body["acceleratorType"]
        if parent.split("/")[1] in self.quota_exhausted_projects:
            raise ApiError("RESOURCE_EXHAUSTED", f"Quota 'TPUV4sPodPerProjectPerZoneForTPUAPI' exhausted. "
                                                 f"Limit 0 in zone {zone}")
        node = self._new_node(parent, zone, name, body)
        self.nodes[name] = node
        hosts = ACCELERATOR_HOSTS[accelerator]

        def finish() -> dict | ApiError:
            # deleted while it was being created, and perhaps made again since: an operation acts on its own node,
            # never on a later one of the same name (as Google's: a resource's operation is that resource's)
            if self.nodes.get(name) is not node:
                return {"@type": NODE_TYPE, **node}
            if refusal := self._external_ips_refused(parent, zone, node["id"], node["networkConfig"]):
                del self.nodes[name]
                return refusal
            if zone in self.exhausted_zones or len(self.free) < hosts:
                del self.nodes[name]
                return ApiError("RESOURCE_EXHAUSTED", f"There is no more capacity in the zone \"{zone}\"; you can "
                                                      f"try in another zone where Cloud TPU Nodes are offered "
                                                      f"(see https://cloud.google.com/tpu/docs/regions)")
            self._take_hosts(name, hosts)
            self._make_ready(name)
            return {"@type": NODE_TYPE, **node}

        return self._start_operation(parent, name, "create", finish)

    def _validate_node_body(self, zone: str, body: dict) -> None:
        for key, value in (body.get("labels") or {}).items():
            if not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
                raise ApiError("INVALID_ARGUMENT", f"Invalid label {key}={value!r}: keys and values may hold lowercase "
                                                   f"letters, digits, '_' and '-', at most 63 characters; a key "
                                                   f"starts with a letter")
        accelerator = body.get("acceleratorType")
        if accelerator not in ACCELERATOR_HOSTS:
            raise ApiError("INVALID_ARGUMENT", f"Accelerator type {accelerator!r} is not available in zone {zone}")
        if body.get("runtimeVersion") not in RUNTIME_VERSIONS:
            raise ApiError("INVALID_ARGUMENT", f"Runtime version {body.get('runtimeVersion')!r} is not available "
                                               f"in zone {zone}")

    def _take_hosts(self, name: str, hosts: int) -> None:
        endpoints, self.free = self.free[:hosts], self.free[hosts:]
        self.node_endpoints[name] = endpoints
        self.on_new_vm(endpoints)

    def _make_ready(self, name: str) -> None:
        node = self.nodes[name]
        external = node["networkConfig"].get("enableExternalIps", False)
        node["networkEndpoints"] = [{"ipAddress": e.internal_ip, "port": 8470,
                                     **({"accessConfig": {"externalIp": e.external_ip}} if external else {})}
                                    for e in self.node_endpoints[name]]
        node["state"] = "READY"
        self._apply_ssh_keys(name)

    def _release_hosts(self, name: str) -> None:
        """A deleted node's hosts are free again; those that vanished with a preemption come back first."""
        endpoints = self.node_endpoints.pop(name, [])
        self.lagging = [each for each in self.lagging if each[1] != name]  # a node of that name made again is new
        revived = [e for e in endpoints if e in self.vanished]
        if revived:
            self.vanished = [e for e in self.vanished if e not in revived]
            self.on_revive(revived)
        self.free = endpoints + self.free
        for queued in self.queued.values():
            if name in queued.nodes:
                queued.nodes.remove(name)
                if queued.resource["state"]["state"] in ("ACTIVE", "PROVISIONING"):
                    self._set_state(queued, "SUSPENDED", "USER")

    def _new_node(self, parent: str, zone: str, name: str, body: dict) -> dict:
        # the API's JSON leaves out a false enableExternalIps, its default, as it does every default
        network = {"network": f"projects/{parent.split('/')[1]}/global/networks/default",
                   "subnetwork": f"projects/{parent.split('/')[1]}/regions/{zone[:-2]}/subnetworks/default",
                   **body.get("networkConfig", {})}
        if not network.get("enableExternalIps"):
            network.pop("enableExternalIps", None)
        node = {**body, "name": name, "state": "CREATING", "id": str(next(self.ids) + 4_000_000_000_000_000_000),
                "createTime": _timestamp(), "apiVersion": "V2", "health": "HEALTHY", "networkConfig": network,
                "cidrBlock": "10.130.0.0/20", "schedulingConfig": body.get("schedulingConfig", {}),
                "serviceAccount": {"email": "default", "scope": ["https://www.googleapis.com/auth/cloud-platform"]}}
        for key, names in ENUMS.items():
            if isinstance(node.get(key), int):
                node[key] = names[node[key]]
        return node

    def _delete(self, parent: str, name: str, node: dict) -> dict:
        node["state"] = "DELETING"

        def finish() -> dict:
            if self.nodes.get(name) is node:  # not a node of the same name made since (another operation's)
                del self.nodes[name]
                self._release_hosts(name)
            return {"@type": EMPTY_TYPE}

        return self._start_operation(parent, name, "delete", finish)

    def _patch(self, parent: str, name: str, node: dict, update_mask: str, body: dict) -> dict:
        fields = [path for path in update_mask.split(",") if path]
        if not fields or any(path not in ("metadata", "labels", "tags") for path in fields):
            raise ApiError("INVALID_ARGUMENT", f"Invalid update mask {update_mask!r}")

        def finish() -> dict:
            for path in fields:
                node[path] = body.get(path, {})
            self._apply_ssh_keys(name)
            return {"@type": NODE_TYPE, **node}

        return self._start_operation(parent, name, "update", finish)

    # --- queued resources ------------------------------------------------------------------------
    def _queued_resources(self, method: str, parent: str, zone: str, name: str, verb: str | None, query: dict,
                          body: dict) -> dict:
        if method == "POST" and not name:
            return self._create_queued(parent, zone, query.get("queuedResourceId", [""])[0], body)
        if method == "GET" and not name:
            found = [queued.resource for full_name, queued in sorted(self.queued.items())
                     if full_name.startswith(parent + "/")]
            return {"queuedResources": found} if found else {}
        queued = self._find(self.queued, name, "QueuedResource") if name else None
        if queued and method == "GET" and not verb:
            return queued.resource
        if queued and method == "DELETE" and not verb:
            force = query.get("force", ["false"])[0].lower() in ("true", "1")
            return self._delete_queued(parent, name, queued, force)
        raise ApiError("NOT_FOUND", f"{method} {name or parent} not found")

    def _create_queued(self, parent: str, zone: str, queued_id: str, body: dict) -> dict:
        if not NODE_ID.match(queued_id):
            raise ApiError("INVALID_ARGUMENT", f"Invalid queued resource id {queued_id!r}: it must match "
                                               f"{NODE_ID.pattern}")
        name = f"{parent}/queuedResources/{queued_id}"
        if name in self.queued:
            raise ApiError("ALREADY_EXISTS", f"Resource '{name}' already exists")
        node_specs = (body.get("tpu") or {}).get("nodeSpec") or []
        if not node_specs:
            raise ApiError("INVALID_ARGUMENT", "tpu.node_spec must hold at least one node spec")
        if "spot" in body and "guaranteed" in body:
            raise ApiError("INVALID_ARGUMENT", "Only one of spot and guaranteed may be set")
        specs: list[tuple[str, dict]] = []
        hosts = 0
        for spec in node_specs:
            if spec.get("parent") != parent:
                raise ApiError("INVALID_ARGUMENT", f"node_spec.parent {spec.get('parent')!r} must be {parent!r}")
            node_body = dict(spec.get("node") or {})
            self._validate_node_body(zone, node_body)
            multislice = spec.get("multisliceParams")
            if bool(spec.get("nodeId")) == bool(multislice):
                raise ApiError("INVALID_ARGUMENT", "Exactly one of node_spec.node_id and node_spec.multislice_params "
                                                   "must be set")
            if multislice:
                count = int(multislice.get("nodeCount") or 0)
                if count < 2:
                    raise ApiError("INVALID_ARGUMENT", f"multislice_params.node_count must be greater than 1, "
                                                       f"got {count}")
                prefix = multislice.get("nodeIdPrefix") or queued_id
                node_ids = [f"{prefix}-{i}" for i in range(count)]
                node_body["multisliceNode"] = True
            else:
                node_ids = [spec["nodeId"]]
            for node_id in node_ids:
                node_name = f"{spec['parent']}/nodes/{node_id}"
                if not NODE_ID.match(node_id):
                    raise ApiError("INVALID_ARGUMENT", f"Invalid node id {node_id!r}: it must match {NODE_ID.pattern}")
                if node_name in self.nodes or any(node_name == other for q in self.queued.values() for other, _ in q.specs):
                    raise ApiError("ALREADY_EXISTS", f"Resource '{node_name}' already exists")
                specs.append((node_name, node_body))
                hosts += ACCELERATOR_HOSTS[node_body["acceleratorType"]]
        if parent.split("/")[1] in self.quota_exhausted_projects:
            raise ApiError("RESOURCE_EXHAUSTED", f"Quota 'TPUV4sPodPerProjectPerZoneForTPUAPI' exhausted. "
                                                 f"Limit 0 in zone {zone}")
        now, wall = time.monotonic(), time.time()
        policy = body.get("queueingPolicy") or {}
        interval = policy.get("validInterval") or {}
        not_before = now + (_seconds(policy["validAfterDuration"]) if "validAfterDuration" in policy
                            else _epoch(policy.get("validAfterTime") or interval.get("startTime"), wall) - wall)
        deadline = now + (_seconds(policy["validUntilDuration"]) if "validUntilDuration" in policy
                          else _epoch(policy.get("validUntilTime") or interval.get("endTime"), math.inf) - wall)
        resource = {key: value for key, value in body.items() if key in ("tpu", "spot", "guaranteed", "queueingPolicy",
                                                                         "reservationName")}
        resource.update(name=name, createTime=_timestamp())
        queued = Queued(resource, zone, specs, hosts, now, not_before, deadline)
        self._set_state(queued, "CREATING", "USER")
        self.queued[name] = queued

        def finish() -> dict:
            self._set_state(queued, "ACCEPTED", "USER")
            return {"@type": QUEUED_RESOURCE_TYPE, **queued.resource}

        return self._start_operation(parent, name, "create", finish)

    def _delete_queued(self, parent: str, name: str, queued: Queued, force: bool) -> dict:
        state = queued.resource["state"]["state"]
        if state == "DELETING":
            raise ApiError("FAILED_PRECONDITION", f"Queued resource '{name}' is already being deleted")
        if not force and (state not in DELETABLE_WITHOUT_FORCE or queued.nodes):
            raise ApiError("FAILED_PRECONDITION",
                           f"Queued resource '{name}' in state {state} cannot be deleted"
                           + (f" while its nodes exist ({', '.join(n.rsplit('/', 1)[1] for n in queued.nodes)})"
                              if queued.nodes else "")
                           + "; set force=true to delete it with its nodes")
        self._set_state(queued, "DELETING", "USER")
        for node_name in queued.nodes:
            self.nodes[node_name]["state"] = "DELETING"

        def finish() -> dict:
            for node_name in list(queued.nodes):
                del self.nodes[node_name]
                self._release_hosts(node_name)
            del self.queued[name]
            return {"@type": EMPTY_TYPE}

        return self._start_operation(parent, name, "delete", finish)

    def _set_state(self, queued: Queued, state: str, initiator: str, error: ApiError | None = None) -> None:
        answer: dict = {"state": state}
        if state in STATE_DATA:
            data = {"error": {"code": CODES[error.status][0], "message": error.message}} if error else {}
            answer[STATE_DATA[state]] = data
        answer["stateInitiator"] = initiator
        queued.resource["state"] = answer
        queued.since = time.monotonic()

    def _advance_queued(self) -> None:
        """Move each queued request on by time, at most one state per `operation_delay_s`."""
        now = time.monotonic()
        for name, queued in self.queued.items():
            state = queued.resource["state"]["state"]
            if now - queued.since < self.operation_delay_s:
                continue
            if state in ("ACCEPTED", "WAITING_FOR_RESOURCES") and now >= queued.deadline:
                self._set_state(queued, "FAILED", "SERVICE", ApiError(
                    "RESOURCE_EXHAUSTED", f"The queued resource request could not be satisfied before its valid "
                                          f"until time: there was no capacity in zone {queued.zone}"))
            elif state == "ACCEPTED":
                self._set_state(queued, "WAITING_FOR_RESOURCES", "USER")
            elif state == "WAITING_FOR_RESOURCES":
                if (now < self.capacity_withheld_until or now < queued.not_before or queued.zone in self.exhausted_zones
                        or len(self.free) < queued.hosts):
                    continue
                parent = name.rsplit("/queuedResources/", 1)[0]
                refusals = [self._external_ips_refused(parent, queued.zone, str(next(self.ids) + 4_000_000_000_000_000_000),
                                                       body.get("networkConfig") or {}) for _, body in queued.specs]
                if refusal := next(filter(None, refusals), None):
                    self._set_state(queued, "FAILED", "SERVICE", refusal)
                    continue
                self._set_state(queued, "PROVISIONING", "USER")
                scheduling = {**({"spot": True} if "spot" in queued.resource else {}),
                              **({"reserved": True} if queued.resource.get("reservationName") else {})}
                for node_name, body in queued.specs:
                    node = self._new_node(parent, queued.zone, node_name, body)
                    node["queuedResource"] = name
                    node["schedulingConfig"] = {**node["schedulingConfig"], **scheduling}
                    self.nodes[node_name] = node
                    self._take_hosts(node_name, ACCELERATOR_HOSTS[body["acceleratorType"]])
                    queued.nodes.append(node_name)
            elif state == "PROVISIONING":
                for node_name in queued.nodes:
                    self._make_ready(node_name)
                self._set_state(queued, "ACTIVE", "USER")

    def _guest_attributes(self, name: str, worker_ids: list[str]) -> dict:
        """What each worker's guest agent published (those of `worker_ids`, else all); gcloud's
        `tpu-vm ssh` reads the `hostkeys`, podrun too."""
        node_id = self.nodes[name]["id"]

        def items(worker: int, endpoint: LabEndpoint) -> list[dict]:
            if not self.publishes_host_keys:
                return []
            hostname = [{"namespace": "", "key": "hostname", "value": instance_name(node_id, worker)}]
            if not endpoint.host_key:
                return hostname
            key_type, key = endpoint.host_key.split()[:2]
            return [{"namespace": "hostkeys", "key": key_type, "value": key}, *hostname]

        return {"guestAttributes": [{"queryPath": "", "workerId": str(worker),
                                     "queryValue": {"items": items(worker, endpoint)}}
                                    for worker, endpoint in enumerate(self.node_endpoints.get(name, []))
                                    if not worker_ids or str(worker) in worker_ids]}

    def _external_ips_refused(self, parent: str, zone: str, node_id: str, network: dict) -> ApiError | None:
        """Google's refusal of a VM with external IPs in a project under constraints/compute.vmExternalIpAccess
        (Compute Engine's 412 conditionNotMet, FAILED_PRECONDITION in the operation), naming worker 0's
        instance as Compute Engine does; None where the policy allows it."""
        project = parent.split("/")[1]
        if not network.get("enableExternalIps") or project not in self.external_ips_denied_projects:
            return None
        return ApiError("FAILED_PRECONDITION", f"Constraint constraints/compute.vmExternalIpAccess violated for project "
                                               f"{PROJECT_NUMBER}. Add instance projects/{project}/zones/{zone}/instances/"
                                               f"{instance_name(node_id, 0)} to the constraint to use external IP with it.")

    def _compute_instance(self, project: str, zone: str, instance: str) -> dict:
        """Compute Engine's `instances.get` of a TPU worker's VM (its instance name, as its guest attributes
        publish it): what IAP resolves a tunnel's instance to, its nic0 address."""
        for name, endpoints in self.node_endpoints.items():
            node = self.nodes[name]
            if name.startswith(f"projects/{project}/locations/{zone}/nodes/") and node["state"] == "READY":
                for worker, endpoint in enumerate(endpoints):
                    if instance_name(node["id"], worker) == instance and endpoint not in self.vanished:
                        return {"kind": "compute#instance", "name": instance, "status": "RUNNING",
                                "zone": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
                                "networkInterfaces": [{"name": "nic0", "networkIP": endpoint.internal_ip}]}
        raise ApiError("NOT_FOUND", f"The resource 'projects/{project}/zones/{zone}/instances/{instance}' was not found")

    def _compute_project(self, project: str) -> dict:
        """Compute Engine's `projects.get` (compute/v1), which gcloud's `tpu-vm ssh` reads to see
        whether OS Login is enabled in the project's metadata (`project_metadata`)."""
        if project in self.denied_projects:
            raise ApiError("PERMISSION_DENIED", f"Compute Engine API has not been used in project {project} before "
                                                f"or it is disabled.")
        return {"kind": "compute#project", "id": PROJECT_NUMBER, "name": project,
                "creationTimestamp": "2026-01-05T09:00:00.000-08:00",
                "commonInstanceMetadata": {"kind": "compute#metadata", "fingerprint": "c3RhbmQtaW4=",
                                           "items": [{"key": key, "value": value} for key, value
                                                     in self.project_metadata.get(project, {}).items()]},
                "defaultServiceAccount": "4815162342-compute@developer.gserviceaccount.com",
                "xpnProjectStatus": "UNSPECIFIED_XPN_PROJECT_STATUS", "defaultNetworkTier": "PREMIUM",
                "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}"}

    def os_login(self, name: str) -> bool:
        """Whether OS Login governs a node (its full name), as the guest decides: the node's own
        `enable-oslogin` metadata, else its project's."""
        node_metadata = self.nodes[name].get("metadata", {})
        project = name.split("/")[1]
        value = node_metadata.get("enable-oslogin", self.project_metadata.get(project, {}).get("enable-oslogin", ""))
        return value.lower() == "true"

    def _apply_ssh_keys(self, name: str) -> None:
        """The node's `ssh-keys` reach its hosts, unless OS Login governs it: then they count for nothing."""
        if name in self.node_endpoints:
            ssh_keys = "" if self.os_login(name) else self.nodes[name].get("metadata", {}).get("ssh-keys", "")
            self.on_ssh_keys(self.node_endpoints[name], ssh_keys)

    # --- long-running operations --------------------------------------------------------------
    def _start_operation(self, parent: str, target: str, verb: str, finish) -> dict:
        operation = Operation(f"{parent}/operations/operation-{int(time.time() * 1000)}-{next(self.ids)}",
                              target, verb, time.monotonic() + self.operation_delay_s, finish)
        self.operations[operation.name] = operation
        return self._operation_json(operation)

    def _advance(self) -> None:
        self._show_preemptions()
        for operation in self.operations.values():
            if operation.outcome is None and time.monotonic() >= operation.done_at:
                operation.outcome = operation.finish()
        self._advance_queued()

    def _operation_json(self, operation: Operation) -> dict:
        answer = {"name": operation.name,
                  "metadata": {"@type": METADATA_TYPE, "createTime": operation.created, "target": operation.target,
                               "verb": operation.verb, "cancelRequested": False, "apiVersion": "v2"},
                  "done": operation.outcome is not None}
        if isinstance(operation.outcome, ApiError):
            answer["error"] = {"code": CODES[operation.outcome.status][0], "message": operation.outcome.message}
        elif operation.outcome is not None:
            answer["response"] = operation.outcome
        return answer

    def _find(self, collection: dict, name: str, kind: str):
        if name not in collection:
            raise ApiError("NOT_FOUND", f"{kind} {name!r} not found" if kind == "Operation"
                           else f"Resource '{name}' was not found")
        return collection[name]


def error_body(error: ApiError) -> tuple[int, dict]:
    """Google's answer to a refused call: the HTTP status and the google.rpc.Status body."""
    status = CODES[error.status][1]
    return status, {"error": {"code": status, "message": error.message, "status": error.status}}


class JsonHandler(BaseHTTPRequestHandler):
    """An API's HTTP face, as the stand-ins' handlers share it: each method's request goes to answer(),
    with its URL and JSON body; nothing is logged."""

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.answer(method, urlsplit(self.path), json.loads(self.rfile.read(length) or b"{}") if length else {})

    def answer(self, method: str, url: SplitResult, body: dict) -> None:
        raise NotImplementedError

    def log_message(self, *args):
        pass


def send_json(handler: BaseHTTPRequestHandler, status: int, answer: dict) -> None:
    data = json.dumps(answer).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json; charset=UTF-8")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def instance_name(node_id: str, worker: int) -> str:
    """The Compute Engine instance a TPU worker is, named as Google names them: t1v-n-<8 hex digits>-w-<worker>."""
    return f"t1v-n-{int(node_id) % 16 ** 8:08x}-w-{worker}"


def _timestamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds(duration) -> float:
    """A google.protobuf.Duration in JSON ("3600s", "1.5s"), or as a number of seconds."""
    if isinstance(duration, (int, float)):
        return float(duration)
    if isinstance(duration, dict):  # {"seconds": ..., "nanos": ...}
        return float(duration.get("seconds", 0)) + duration.get("nanos", 0) / 1e9
    if not re.fullmatch(r"-?\d+(\.\d+)?s", duration):
        raise ApiError("INVALID_ARGUMENT", f"Invalid duration {duration!r}")
    return float(duration[:-1])


def _epoch(timestamp: str | None, default: float) -> float:
    """A google.protobuf.Timestamp in JSON (RFC 3339) as seconds since the epoch; `default` if unset."""
    if not timestamp:
        return default
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", timestamp)
    if not match:
        raise ApiError("INVALID_ARGUMENT", f"Invalid timestamp {timestamp!r}")
    zone = "+00:00" if match[3] == "Z" else match[3]
    return datetime.fromisoformat(match[1] + zone).timestamp() + float(match[2] or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--hosts", nargs="*", default=[], metavar="INTERNAL,EXTERNAL")
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--stall", type=float, default=0.0,
                        help="seconds each request waits before it is answered; inf: never")
    args = parser.parse_args()
    endpoints = [LabEndpoint(*pair.split(","), host_index=i) for i, pair in enumerate(args.hosts)]
    stand_in = TpuStandIn(endpoints, args.delay)
    stand_in.stall_s = args.stall
    print(stand_in.serve(port=args.port), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
