"""A stand-in for Google's Cloud TPU v2 REST API on 127.0.0.1, whose nodes' workers are lab hosts.

It speaks the API as Google documents it (https://cloud.google.com/tpu/docs/reference/rest/v2/
projects.locations.nodes) and as the real clients on these machines were seen to need (GUIDE
section 6): paths `/v2/projects/P/locations/Z/nodes[/ID]`, camelCase fields, enums as strings (the
Python client sends integers, both are accepted), `"apiVersion": "V2"`, long-running operations
named `projects/P/locations/Z/operations/ID` that finish after `operation_delay_s`, and errors as
google.rpc.Status bodies. A bearer token is required, as Google requires one.

Capacity is the lab: a node of k hosts takes the next k free lab hosts as its `networkEndpoints`
(internal `ipAddress`, `accessConfig.externalIp`); when too few are free, its create operation fails
with RESOURCE_EXHAUSTED, as a zone out of capacity does. Like the guest agent on a real TPU VM,
the `ssh-keys` metadata of a node is written to its hosts' authorized_keys (see `on_ssh_keys`).

An API that is slow or does not answer: with `stall_s` set, every request is read and then left
unanswered for that many seconds (math.inf: never, until shutdown), the connection held open.

Run alone for benchmarks:  python tests/tpu_stand_in.py --hosts 10.99.0.10,10.99.16.10 ...
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
METADATA_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
NODE_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
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
# google.rpc.Code numbers and the HTTP status each maps to
CODES = {"INVALID_ARGUMENT": (3, 400), "NOT_FOUND": (5, 404), "ALREADY_EXISTS": (6, 409),
         "PERMISSION_DENIED": (7, 403), "RESOURCE_EXHAUSTED": (8, 429), "UNAUTHENTICATED": (16, 401)}
# enum fields as the Python client sends them (integers), by their names in the v2 protos
ENUMS = {"state": ["STATE_UNSPECIFIED", "CREATING", "READY", "RESTARTING", "REIMAGING", "DELETING",
                   "REPAIRING", "STOPPED", "STOPPING", "STARTING", "PREEMPTED", "TERMINATED", "HIDING",
                   "HIDDEN", "UNHIDING", "UNKNOWN"],
         "health": ["HEALTH_UNSPECIFIED", "HEALTHY", "TIMEOUT", "UNHEALTHY_TENSORFLOW",
                    "UNHEALTHY_MAINTENANCE"],
         "apiVersion": ["API_VERSION_UNSPECIFIED", "V1_ALPHA1", "V1", "V2_ALPHA1", "V2"]}


class ApiError(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class LabEndpoint:
    internal_ip: str
    external_ip: str
    host_index: int  # the lab host it is
    host_key: str = ""  # its sshd's public key, "ssh-ed25519 AAAA...", as the guest agent publishes it


@dataclass
class Operation:
    name: str
    target: str
    verb: str
    done_at: float
    finish: Callable[[], dict | ApiError]  # runs once, when the operation is done: its response or error
    created: str = field(default_factory=lambda: _timestamp())
    outcome: dict | ApiError | None = None


class TpuStandIn:
    """The API's state; `serve()` puts it on a port. Tests read and set it directly."""

    def __init__(self, endpoints: list[LabEndpoint], operation_delay_s: float = 0.5,
                 on_ssh_keys: Callable[[list[LabEndpoint], str], None] | None = None):
        self.free = list(endpoints)
        self.operation_delay_s = operation_delay_s
        self.on_ssh_keys = on_ssh_keys or (lambda endpoints, keys: None)
        self.nodes: dict[str, dict] = {}  # by full name
        self.node_endpoints: dict[str, list[LabEndpoint]] = {}
        self.operations: dict[str, Operation] = {}
        self.exhausted_zones: set[str] = set()
        self.denied_projects: set[str] = set()  # projects where the API is not enabled
        self.quota_exhausted_projects: set[str] = set()
        self.requests: list[tuple[str, str]] = []  # (method, path) as received
        self.stall_s = 0.0  # seconds each request waits before it is answered; math.inf: never
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.ids = itertools.count(1)
        self.server: ThreadingHTTPServer | None = None

    @classmethod
    def on_lab(cls, lab, operation_delay_s: float) -> TpuStandIn:
        """Capacity: the hosts of a tests/lab.py Lab. Like a TPU VM's guest agent, the node's
        `ssh-keys` metadata ("user:key" lines) for root is installed on its hosts."""
        def install_root_keys(endpoints: list[LabEndpoint], ssh_keys: str) -> None:
            keys = "".join(line.partition(":")[2] + "\n" for line in ssh_keys.splitlines() if line.startswith("root:"))
            for endpoint in endpoints:
                lab.authorize(endpoint.host_index, keys)

        return cls([LabEndpoint(h.ip, h.external_ip, h.index, h.host_key()) for h in lab.hosts], operation_delay_s,
                   install_root_keys)

    # --- serving ---------------------------------------------------------------------------
    def serve(self, port: int = 0) -> str:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self._answer("GET")

            def do_POST(self):
                self._answer("POST")

            def do_PATCH(self):
                self._answer("PATCH")

            def do_DELETE(self):
                self._answer("DELETE")

            def _answer(self, method: str) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                if stand_in.stall():
                    return
                try:
                    if not self.headers.get("Authorization", "").startswith("Bearer "):
                        raise ApiError("UNAUTHENTICATED", "Request is missing required authentication credential.")
                    status, answer = 200, stand_in.handle(method, url.path, parse_qs(url.query), body)
                except ApiError as error:
                    code, status = CODES[error.status]
                    answer = {"error": {"code": status, "message": error.message, "status": error.status}}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

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

    # --- the API ---------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict, body: dict) -> dict:
        with self.lock:
            self.requests.append((method, path))
            if compute := re.fullmatch(r"/compute/v1/projects/([^/]+)", path):
                if method != "GET":
                    raise ApiError("NOT_FOUND", f"{method} {path} not found")
                return self._compute_project(compute[1])
            match = re.fullmatch(r"/v2/(projects/([^/]+)/locations/([^/]+))/(nodes|operations)(?:/([^/:]+))?(:\w+)?",
                                 path)
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
                return self._guest_attributes(name)
            raise ApiError("NOT_FOUND", f"{method} {path} not found")

    def _create(self, parent: str, zone: str, node_id: str, body: dict) -> dict:
        if not NODE_ID.match(node_id):
            raise ApiError("INVALID_ARGUMENT", f"Invalid node id {node_id!r}: it must match {NODE_ID.pattern}")
        name = f"{parent}/nodes/{node_id}"
        if name in self.nodes:
            raise ApiError("ALREADY_EXISTS", f"Resource '{name}' already exists")
        accelerator = body.get("acceleratorType")
        if accelerator not in ACCELERATOR_HOSTS:
            raise ApiError("INVALID_ARGUMENT", f"Accelerator type {accelerator!r} is not available in zone {zone}")
        if body.get("runtimeVersion") not in RUNTIME_VERSIONS:
            raise ApiError("INVALID_ARGUMENT", f"Runtime version {body.get('runtimeVersion')!r} is not available "
                                               f"in zone {zone}")
        if parent.split("/")[1] in self.quota_exhausted_projects:
            raise ApiError("RESOURCE_EXHAUSTED", f"Quota 'TPUV4sPodPerProjectPerZoneForTPUAPI' exhausted. "
                                                 f"Limit 0 in zone {zone}")
        node = {**body, "name": name, "state": "CREATING", "id": str(next(self.ids) + 4_000_000_000_000_000_000),
                "createTime": _timestamp(), "apiVersion": "V2", "health": "HEALTHY",
                "networkConfig": {"network": f"projects/{parent.split('/')[1]}/global/networks/default",
                                  "subnetwork": f"projects/{parent.split('/')[1]}/regions/{zone[:-2]}/subnetworks/default",
                                  "enableExternalIps": True, **body.get("networkConfig", {})},
                "cidrBlock": "10.130.0.0/20", "schedulingConfig": body.get("schedulingConfig", {}),
                "serviceAccount": {"email": "default", "scope": ["https://www.googleapis.com/auth/cloud-platform"]}}
        for key, names in ENUMS.items():
            if isinstance(node.get(key), int):
                node[key] = names[node[key]]
        self.nodes[name] = node
        hosts = ACCELERATOR_HOSTS[accelerator]

        def finish() -> dict | ApiError:
            if zone in self.exhausted_zones or len(self.free) < hosts:
                del self.nodes[name]
                return ApiError("RESOURCE_EXHAUSTED", f"There is no more capacity in the zone \"{zone}\"; you can "
                                                      f"try in another zone where Cloud TPU Nodes are offered "
                                                      f"(see https://cloud.google.com/tpu/docs/regions)")
            endpoints, self.free = self.free[:hosts], self.free[hosts:]
            self.node_endpoints[name] = endpoints
            node["networkEndpoints"] = [{"ipAddress": e.internal_ip, "port": 8470,
                                         "accessConfig": {"externalIp": e.external_ip}} for e in endpoints]
            node["state"] = "READY"
            self._apply_ssh_keys(name)
            return {"@type": NODE_TYPE, **node}

        return self._start_operation(parent, name, "create", finish)

    def _delete(self, parent: str, name: str, node: dict) -> dict:
        node["state"] = "DELETING"

        def finish() -> dict:
            del self.nodes[name]
            self.free = self.node_endpoints.pop(name, []) + self.free
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

    def _guest_attributes(self, name: str) -> dict:
        """What each worker's guest agent published; gcloud's `tpu-vm ssh` reads the `hostkeys`."""
        def items(endpoint: LabEndpoint) -> list[dict]:
            if not endpoint.host_key:
                return []
            key_type, key = endpoint.host_key.split()[:2]
            return [{"namespace": "hostkeys", "key": key_type, "value": key}]

        return {"guestAttributes": [{"queryPath": "", "workerId": str(worker), "queryValue": {"items": items(endpoint)}}
                                    for worker, endpoint in enumerate(self.node_endpoints.get(name, []))]}

    def _compute_project(self, project: str) -> dict:
        """Compute Engine's `projects.get` (compute/v1), which gcloud's `tpu-vm ssh` reads to see
        whether OS Login is enabled in the project's metadata: here it is not."""
        if project in self.denied_projects:
            raise ApiError("PERMISSION_DENIED", f"Compute Engine API has not been used in project {project} before "
                                                f"or it is disabled.")
        return {"kind": "compute#project", "id": "4815162342", "name": project,
                "creationTimestamp": "2026-01-05T09:00:00.000-08:00",
                "commonInstanceMetadata": {"kind": "compute#metadata", "fingerprint": "c3RhbmQtaW4=", "items": []},
                "defaultServiceAccount": "4815162342-compute@developer.gserviceaccount.com",
                "xpnProjectStatus": "UNSPECIFIED_XPN_PROJECT_STATUS", "defaultNetworkTier": "PREMIUM",
                "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}"}

    def _apply_ssh_keys(self, name: str) -> None:
        if name in self.node_endpoints:
            self.on_ssh_keys(self.node_endpoints[name], self.nodes[name].get("metadata", {}).get("ssh-keys", ""))

    # --- long-running operations --------------------------------------------------------------
    def _start_operation(self, parent: str, target: str, verb: str, finish) -> dict:
        operation = Operation(f"{parent}/operations/operation-{int(time.time() * 1000)}-{next(self.ids)}",
                              target, verb, time.monotonic() + self.operation_delay_s, finish)
        self.operations[operation.name] = operation
        return self._operation_json(operation)

    def _advance(self) -> None:
        for operation in self.operations.values():
            if operation.outcome is None and time.monotonic() >= operation.done_at:
                operation.outcome = operation.finish()

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


def _timestamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
    print(stand_in.serve(args.port), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
