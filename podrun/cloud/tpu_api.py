"""The Cloud TPU v2 API: nodes, credentials, and Google's errors as one line each. The only module
that imports Google's client (google-cloud-tpu).

Reading one node, which every `exec` on a TPU VM does, is a single REST GET through google.auth's
urllib3 transport. Everything else (create, delete, metadata updates, list) goes through Google's
generated client over REST, as gcloud's requests do; with the requests library it runs on, it costs
~0.15 s more CPU to import, so it is imported only by those calls.
The endpoint and the access token come from gcloud's settings (CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU,
CLOUDSDK_AUTH_ACCESS_TOKEN_FILE), otherwise Google's endpoint and Application Default Credentials.

Every request carries a timeout (PODRUN_API_TIMEOUT, 30 s): the generated client's default is none,
and an API that accepts the connection and never answers would hang podrun for good. Long-running
operations are polled here, one request at a time with that timeout, up to PODRUN_WAIT_TIMEOUT; the
client's own polling has a fixed 10 s timeout per request and no deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import google.auth
import urllib3
from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError
from google.auth.transport.urllib3 import AuthorizedHttp
from google.oauth2.credentials import Credentials

from podrun.cloud import no_external_ips
from podrun.cloud.settings import (
    ACCESS_TOKEN_FILE,
    API_TIMEOUT,
    TPU_ENDPOINT,
    WAIT_TIMEOUT,
    Location,
    gcloud_property,
    seconds,
)
from podrun.errors import PodrunError, WaitTimedOut

if TYPE_CHECKING:
    from podrun.cloud.request import TpuRequest

GOOGLE_ENDPOINT = "https://tpu.googleapis.com"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
OPERATION_POLL_S = 0.5
METADATA_HOST = "metadata.google.internal"
METADATA_EMAIL = "/computeMetadata/v1/instance/service-accounts/default/email"
METADATA_TIMEOUT_S = 3.0
HTTP_PREFIX = re.compile(r"^(?:GET|POST|PATCH|PUT|DELETE) \S+: ")  # the REST client's prefix to Google's message
API_DISABLED = re.compile(r"has not been used|is disabled|not enabled")


class ApiCallError(Exception):
    """An error Google returned for a call: its HTTP status and message."""

    def __init__(self, code: int | None, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class ApiUnreachable(Exception):
    """The API could not be reached: the connection failed (the error's type name)."""


class ApiTimeout(Exception):
    """The API did not answer a request within the timeout."""


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


@dataclass(frozen=True)
class Pending:
    """A long-running operation at Google: its name, what it does (`creating TPU VM x`), on which node."""

    operation: str
    doing: str
    node: str


class TpuApi:
    def __init__(self, location: Location):
        self.location = location
        self.endpoint = (gcloud_property(TPU_ENDPOINT) or "").rstrip("/").removesuffix("/v2") or None
        self.timeout_s = seconds(API_TIMEOUT)
        self.wait_timeout_s = seconds(WAIT_TIMEOUT)
        self.token_file = gcloud_property(ACCESS_TOKEN_FILE)  # None: Application Default Credentials
        self.credentials = _credentials(self.token_file)
        self.client = None  # Google's generated client, made on first use

    def service_account(self) -> str | None:
        """The service account of the credentials in use: a key file's, or on GCE the VM's, from the
        metadata server (asked only there, or where GCE_METADATA_HOST names one, as Google's libraries do)."""
        from google.auth import compute_engine  # it loads requests: ~20 ms that only this question pays

        email = getattr(self.credentials, "service_account_email", None)
        if email and email != "default":
            return email
        host = os.environ.get("GCE_METADATA_HOST")
        if not host and not isinstance(self.credentials, compute_engine.Credentials):
            return None
        try:
            answer = urllib3.request("GET", f"http://{host or METADATA_HOST}{METADATA_EMAIL}",
                                     headers={"Metadata-Flavor": "Google"}, timeout=METADATA_TIMEOUT_S, retries=False)
        except urllib3.exceptions.HTTPError:
            return None
        return (answer.data.decode().strip() or None) if answer.status == 200 else None

    def get(self, name: str) -> TpuNode:
        with self._errors(f"reading TPU VM {name}", name):
            return self._node(self._read(f"nodes/{name}"))

    def find(self, name: str) -> TpuNode | None:
        """The node, or None if there is none of that name."""
        with self._errors(f"reading TPU VM {name}", name):
            return _unless_missing(lambda: self._node(self._read(f"nodes/{name}")))

    def get_queued(self, name: str) -> QueuedResource | None:
        """The queued resource of that name, or None."""
        with self._errors(f"reading queued resource {name}", name, kind="queued resource"):
            return _unless_missing(lambda: self._queued(self._read(f"queuedResources/{name}")))

    def list_queued(self) -> list[QueuedResource]:
        with self._errors("listing queued resources"), _client_errors():
            found = self._google_client().list_queued_resources(parent=self.location.parent, timeout=self.timeout_s)
            return [self._queued(_json(resource)) for resource in found]

    def create_queued(self, request: TpuRequest) -> Pending:
        """A queued resource named as the request for its node of that name, or for its slices
        NAME-0 .. NAME-(N-1) (multisliceParams)."""
        from google.cloud import tpu_v2
        from google.protobuf import duration_pb2

        node_spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=self.location.parent, node=_node_to_create(request))
        if request.slices > 1:
            node_spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
                node_count=request.slices, node_id_prefix=request.name)
        else:
            node_spec.node_id = request.name
        resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[node_spec]))
        if request.spot:
            resource.spot = tpu_v2.QueuedResource.Spot()
        if request.reservation:
            resource.reservation_name = (request.reservation if "/" in request.reservation
                                         else f"{self.location.parent}/reservations/{request.reservation}")
        if request.valid_for_s:
            resource.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(
                valid_until_duration=duration_pb2.Duration(seconds=int(request.valid_for_s)))
        doing = f"requesting queued resource {request.name}"
        with self._errors(doing, request.name, kind="queued resource"), _client_errors():
            operation = self._google_client().create_queued_resource(
                parent=self.location.parent, queued_resource_id=request.name, queued_resource=resource,
                timeout=self.timeout_s)
        return Pending(operation.operation.name, doing, request.name)

    def delete_queued(self, name: str) -> Pending:
        """Delete the queued resource with its nodes (force: whatever its state)."""
        from google.cloud import tpu_v2

        doing = f"deleting queued resource {name} with its TPU VM"
        with self._errors(doing, name, kind="queued resource"), _client_errors():
            operation = self._google_client().delete_queued_resource(
                request=tpu_v2.DeleteQueuedResourceRequest(name=f"{self.location.parent}/queuedResources/{name}",
                                                           force=True), timeout=self.timeout_s)
        return Pending(operation.operation.name, doing, name)

    def guest_attributes(self, name: str) -> list[Published]:
        """What each worker's guest agent published, in worker order (guest attributes): its SSH host
        keys ("ssh-ed25519 AAAA...", namespace `hostkeys`) and its VM's instance name (key `hostname`,
        which gcloud's `tpu-vm ssh --tunnel-through-iap` reads in any namespace); nothing for a worker,
        or for all when Google refuses to say (as gcloud's `tpu-vm ssh`, podrun then goes on without them)."""
        with self._errors(f"reading the guest attributes of TPU VM {name}", name):
            try:
                # gcloud's body: workerIds [""] (every worker)
                answer = self._request("POST", f"nodes/{name}:getGuestAttributes", {"workerIds": [""]})
            except ApiCallError:
                return []
        workers: list[Published] = []
        for position, worker in enumerate(answer.get("guestAttributes", [])):
            index = int(worker.get("workerId") or position)
            workers += [Published()] * (index + 1 - len(workers))
            items = worker.get("queryValue", {}).get("items", [])
            keys = tuple(f"{item['key']} {item['value']}" for item in items if item.get("namespace") == "hostkeys"
                         and item.get("key", "").startswith(("ssh-", "ecdsa-")))
            workers[index] = Published(keys, next((item.get("value") for item in items if item.get("key") == "hostname"),
                                                  None))
        return workers

    def state(self, name: str) -> str:
        """The node's state, or `gone` once it no longer exists."""
        with self._errors(f"reading TPU VM {name}", name):
            try:
                return self._read(f"nodes/{name}").get("state", "STATE_UNSPECIFIED")
            except ApiCallError as error:
                if error.code != 404:
                    raise
                return "gone"

    def list(self) -> list[TpuNode]:
        with self._errors("listing TPU VMs"), _client_errors():
            nodes = self._google_client().list_nodes(parent=self.location.parent, timeout=self.timeout_s)
            return [self._node(_json(node)) for node in nodes]

    def create(self, request: TpuRequest) -> Pending:
        """The request's one node, directly (no queued resource)."""
        from google.cloud import tpu_v2

        node = _node_to_create(request)
        node.scheduling_config = tpu_v2.SchedulingConfig(spot=request.spot)
        doing = f"creating TPU VM {request.name}"
        with self._errors(doing, request.name), _client_errors():
            operation = self._google_client().create_node(parent=self.location.parent, node_id=request.name, node=node,
                                                          timeout=self.timeout_s)
        return Pending(operation.operation.name, doing, request.name)

    def delete(self, name: str) -> Pending:
        doing = f"deleting TPU VM {name}"
        with self._errors(doing, name), _client_errors():
            operation = self._google_client().delete_node(name=self._full_name(name), timeout=self.timeout_s)
        return Pending(operation.operation.name, doing, name)

    def set_metadata(self, node: TpuNode, metadata: dict[str, str]) -> None:
        """Replace the node's metadata (as `gcloud compute tpus tpu-vm ssh` does to add a key) and wait."""
        from google.cloud import tpu_v2
        from google.protobuf import field_mask_pb2

        doing = f"updating the metadata of TPU VM {node.name}"
        with self._errors(doing, node.name), _client_errors():
            operation = self._google_client().update_node(node=tpu_v2.Node(name=node.full_name, metadata=metadata),
                                                          update_mask=field_mask_pb2.FieldMask(paths=["metadata"]),
                                                          timeout=self.timeout_s)
        self.wait(Pending(operation.operation.name, doing, node.name), lambda elapsed: None)

    def wait(self, pending: Pending, on_poll: Callable[[float], None]) -> None:
        """Poll the operation until it is done, calling on_poll with the seconds waited after each poll
        that finds it running; its error, or running past the wait timeout, as a PodrunError."""
        started = time.monotonic()
        while not self._done(pending):
            elapsed = time.monotonic() - started
            if elapsed >= self.wait_timeout_s:
                raise WaitTimedOut(
                    f"{pending.doing}: still not done after {self.wait_timeout_s:g}s; it goes on at Google: "
                    f"`podrun describe {pending.node} {self.location.flags}` shows its "
                    f"state (PODRUN_WAIT_TIMEOUT sets how many seconds podrun waits)")
            on_poll(elapsed)
            time.sleep(OPERATION_POLL_S)

    def _done(self, pending: Pending) -> bool:
        """Whether the operation is done (one request); if it failed, its error. An operation's error
        carries a google.rpc.Code, which api_core maps to the HTTP status Google's calls answer with."""
        from google.api_core import exceptions

        with self._errors(pending.doing, pending.node), _client_errors():
            operation = self._google_client().get_operation({"name": pending.operation}, timeout=self.timeout_s)
            if operation.HasField("error"):
                failure = exceptions.from_grpc_status(operation.error.code, operation.error.message)
                raise ApiCallError(failure.code, failure.message)
        return operation.done

    def _read(self, path: str) -> dict:
        """The JSON of `nodes/NAME` or `queuedResources/NAME` in this location, with one GET."""
        return self._request("GET", path)

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        """One request to `path` in this location (a JSON body with it): the answer's JSON."""
        base = self.endpoint or GOOGLE_ENDPOINT
        return self.call(method, f"{base if '://' in base else 'https://' + base}/v2/{self.location.parent}/{path}", body)

    def call(self, method: str, url: str, body: dict | None = None) -> dict:
        """One request to a Google API's `url` with these credentials (a JSON body with it), through
        google.auth's urllib3 transport: the answer's JSON; ApiCallError, ApiUnreachable or ApiTimeout."""
        data = None if body is None else json.dumps(body)
        try:
            response = AuthorizedHttp(self.credentials).request(
                method, url, body=data, headers={"Content-Type": "application/json"} if data else None,
                timeout=self.timeout_s, retries=False)
        except urllib3.exceptions.HTTPError as error:
            # a refused connection is a NewConnectionError, which urllib3 derives from its TimeoutError
            timed_out = (isinstance(error, urllib3.exceptions.TimeoutError)
                         and not isinstance(error, urllib3.exceptions.NewConnectionError))
            raise (ApiTimeout() if timed_out else ApiUnreachable(type(error).__name__)) from None
        if response.status >= 400:
            raise _error_of(response)
        return json.loads(response.data)

    def _full_name(self, name: str) -> str:
        return f"{self.location.parent}/nodes/{name}"

    def _google_client(self):
        if self.client is None:
            from google.cloud import tpu_v2

            options = {"api_endpoint": self.endpoint} if self.endpoint else None
            self.client = tpu_v2.TpuClient(transport="rest", credentials=self.credentials, client_options=options)
        return self.client

    def _node(self, node: dict) -> TpuNode:
        """A node as the API's JSON has it: camelCase fields, enums by name, defaults left out."""
        scheduling = node.get("schedulingConfig", {})
        return TpuNode(
            name=node["name"].rsplit("/", 1)[-1], location=self.location,
            state=node.get("state", "STATE_UNSPECIFIED"), accelerator_type=node.get("acceleratorType", ""),
            runtime_version=node.get("runtimeVersion", ""), health=node.get("health", "HEALTH_UNSPECIFIED"),
            spot=bool(scheduling.get("spot") or scheduling.get("preemptible")),
            workers=[WorkerAddress(endpoint.get("ipAddress", ""),
                                   endpoint.get("accessConfig", {}).get("externalIp") or None)
                     for endpoint in node.get("networkEndpoints", [])],
            metadata=dict(node.get("metadata", {})),
            queued_resource=node["queuedResource"].rsplit("/", 1)[-1] if node.get("queuedResource") else None,
            id=node.get("id", ""))

    def _queued(self, resource: dict) -> QueuedResource:
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
            name=resource["name"].rsplit("/", 1)[-1], location=self.location,
            state=state.get("state", "STATE_UNSPECIFIED"), initiator=state.get("stateInitiator", ""),
            error=(data.get("error") or {}).get("message"), node_names=names,
            accelerator_type=node.get("acceleratorType", ""), runtime_version=node.get("runtimeVersion", ""),
            spot="spot" in resource, reservation=resource.get("reservationName", "").rsplit("/", 1)[-1] or None,
            valid_until=(resource.get("queueingPolicy") or {}).get("validUntilDuration"))

    @contextlib.contextmanager
    def _errors(self, doing: str, name: str | None = None, kind: str = "TPU VM") -> Iterator[None]:
        """Google's errors, as one line each that says what to do; `kind`: what `name` names."""
        try:
            with self.credential_errors(doing):
                yield
        except ApiCallError as error:
            if no_external_ips.refuses_external_ips(error.message):
                raise no_external_ips.external_ips_refused(doing, self.location.project) from None
            raise PodrunError(f"{doing}: {self._advice(error, name, kind)}") from None
        except ApiUnreachable as error:
            raise PodrunError(f"{doing}: cannot reach the Cloud TPU API at {self.endpoint or GOOGLE_ENDPOINT} "
                              f"({error})") from None
        except ApiTimeout:
            override = " or CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU" if self.endpoint else ""
            raise PodrunError(f"no answer from the Cloud TPU API ({self.endpoint or GOOGLE_ENDPOINT}) after "
                              f"{self.timeout_s:g}s while {doing} in {self.location.project}/{self.location.zone}; "
                              f"check your network{override} (PODRUN_API_TIMEOUT sets the seconds to wait)") from None

    @contextlib.contextmanager
    def credential_errors(self, doing: str) -> Iterator[None]:
        """The credentials' own failures, whatever API was called, as one line each that says what to do."""
        try:
            yield
        except RefreshError as error:
            # a bare access token cannot be refreshed: google.auth tries when Google answers 401
            if self.token_file:
                raise PodrunError(f"{doing}: {self._token_rejected()}") from None
            raise PodrunError(f"{doing}: cannot refresh the Google credentials ({error}); run "
                              f"`gcloud auth application-default login`") from None
        except TransportError as error:  # refreshing the credentials, before the API is asked anything
            raise PodrunError(f"{doing}: cannot reach Google to refresh the credentials "
                              f"({type(error.__cause__ or error).__name__}); check the network") from None

    def credentials_rejected(self, message: str) -> str:
        """What to do when Google answered 401 (`message`) to these credentials."""
        if self.token_file:
            return self._token_rejected()
        return f"Google rejected the credentials ({message}); run `gcloud auth application-default login`"

    def _token_rejected(self) -> str:
        return (f"Google rejected the access token in {self.token_file} (CLOUDSDK_AUTH_ACCESS_TOKEN_FILE): it has "
                f"expired or is not valid; put a new one there, e.g. `gcloud auth print-access-token > "
                f"{self.token_file}`, or unset CLOUDSDK_AUTH_ACCESS_TOKEN_FILE to use Application Default "
                f"Credentials")

    def _advice(self, error: ApiCallError, name: str | None, kind: str) -> str:
        """What went wrong and what to do, by the HTTP status Google answered with."""
        message = HTTP_PREFIX.sub("", error.message)
        zone, project = self.location.zone, self.location.project
        where = f"{project}/{zone}"
        if error.code == 409:
            return (f"a {kind} named {name} already exists in {where}; pick another --name, "
                    f"or delete it with `podrun delete {name} {self.location.flags}`")
        if error.code == 404:
            return f"no {kind} named {name} in {where}; `podrun list {self.location.flags}` shows the ones there"
        if error.code == 429 and "quota" in message.lower():
            return (f"quota exceeded in {where} ({message}); ask for more quota in the console's "
                    f"IAM & Admin > Quotas, or use a smaller slice")
        if error.code == 429:
            return (f"no capacity in {zone} right now ({message}); ask through a queued request, which waits "
                    f"for capacity (`podrun create ... --queued`, or target.tpu.queued: true in a spec), or try "
                    f"another zone, --spot, or again later")
        if error.code == 403 and API_DISABLED.search(message):
            return (f"the Cloud TPU API is not enabled in project {project}; run "
                    f"`gcloud services enable tpu.googleapis.com --project {project}`")
        if error.code == 403:
            return f"permission denied in {where} ({message}); your account needs a role such as roles/tpu.admin"
        if error.code == 401:
            return self.credentials_rejected(message)
        if error.code == 400:
            return f"invalid request: {message}"
        return f"Cloud TPU API error {error.code}: {message}"


@contextlib.contextmanager
def _client_errors() -> Iterator[None]:
    """The client's errors as ApiCallError, ApiUnreachable or ApiTimeout. Errors of calls arrive as
    HTTP classes (Conflict, ...): `code` is the HTTP status. The client's REST transport is requests."""
    import requests
    from google.api_core import exceptions

    try:
        yield
    except exceptions.GoogleAPICallError as error:
        raise ApiCallError(error.code, error.message or "") from None
    except requests.exceptions.Timeout:
        raise ApiTimeout() from None
    except requests.exceptions.RequestException as error:
        raise ApiUnreachable(type(error).__name__) from None


def _node_to_create(request: TpuRequest):
    """The Node a create asks for, directly or in a queued resource's node spec: external IPs asked
    for as gcloud asks for them (the API's default is none)."""
    from google.cloud import tpu_v2

    return tpu_v2.Node(accelerator_type=request.accelerator_type, runtime_version=request.runtime_version,
                       metadata=request.metadata,
                       network_config=tpu_v2.NetworkConfig(enable_external_ips=request.external_ips))


def _unless_missing(read):
    """read(), or None when Google answers 404."""
    try:
        return read()
    except ApiCallError as error:
        if error.code != 404:
            raise
        return None


def _json(node) -> dict:
    """A node (or queued resource) from the client as the API's JSON has it."""
    return type(node).to_dict(node, use_integers_for_enums=False, preserving_proto_field_name=False)


def _error_of(response: urllib3.BaseHTTPResponse) -> ApiCallError:
    """The google.rpc.Status body Google answers errors with: {"error": {"code", "message", "status"}}."""
    try:
        message = json.loads(response.data)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.data.decode(errors="replace").strip()[:200] or response.reason
    return ApiCallError(response.status, message)


def _credentials(token_file: str | None):
    if token_file:
        try:
            return Credentials(Path(os.path.expanduser(token_file)).read_text().strip())
        except OSError as error:
            raise PodrunError(f"cannot read the access token file {token_file} (CLOUDSDK_AUTH_ACCESS_TOKEN_FILE): "
                              f"{error.strerror}") from None
    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except DefaultCredentialsError:
        raise PodrunError("no Google credentials found: run `gcloud auth application-default login` "
                          "(or point CLOUDSDK_AUTH_ACCESS_TOKEN_FILE at an access token)") from None
    return credentials
