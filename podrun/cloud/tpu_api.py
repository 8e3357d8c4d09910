"""The Cloud TPU v2 API (TpuApi): nodes and queued resources, their operations waited for, and Google's
errors as one line each. The only module that imports Google's client (google-cloud-tpu); what the
API answers is plain data (tpu_resources.py), the credentials are google_credentials.py's.

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
import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import urllib3
from google.auth.transport.urllib3 import AuthorizedHttp

from podrun.cloud import no_external_ips
from podrun.cloud.api_errors import ApiCallError, ApiTimeout, ApiUnreachable, client_errors, error_of
from podrun.cloud.google_credentials import GoogleCredentials
from podrun.cloud.settings import (
    ACCESS_TOKEN_FILE,
    API_TIMEOUT,
    TPU_ENDPOINT,
    WAIT_TIMEOUT,
    Location,
    gcloud_property,
    seconds,
)
from podrun.cloud.tpu_resources import (
    Pending,
    Published,
    QueuedResource,
    TpuNode,
    node_from_json,
    queued_from_json,
)
from podrun.errors import NoCapacity, PodrunError, WaitTimedOut

if TYPE_CHECKING:
    from podrun.cloud.request import TpuRequest

GOOGLE_ENDPOINT = "https://tpu.googleapis.com"
OPERATION_POLL_S = 0.5
HTTP_PREFIX = re.compile(r"^(?:GET|POST|PATCH|PUT|DELETE) \S+: ")  # the REST client's prefix to Google's message
API_DISABLED = re.compile(r"has not been used|is disabled|not enabled")


class TpuApi:
    def __init__(self, location: Location):
        self.location = location
        self.endpoint = (gcloud_property(TPU_ENDPOINT) or "").rstrip("/").removesuffix("/v2") or None
        self.timeout_s = seconds(API_TIMEOUT)
        self.wait_timeout_s = seconds(WAIT_TIMEOUT)
        self.auth = GoogleCredentials(gcloud_property(ACCESS_TOKEN_FILE))
        self.client = None  # Google's generated client, made on first use

    def get(self, name: str) -> TpuNode:
        with self._errors(f"reading TPU VM {name}", name):
            return node_from_json(self._read(f"nodes/{name}"), self.location)

    def find(self, name: str) -> TpuNode | None:
        """The node, or None if there is none of that name."""
        with self._errors(f"reading TPU VM {name}", name):
            return _unless_missing(lambda: node_from_json(self._read(f"nodes/{name}"), self.location))

    def get_queued(self, name: str) -> QueuedResource | None:
        """The queued resource of that name, or None."""
        with self._errors(f"reading queued resource {name}", name, kind="queued resource"):
            return _unless_missing(lambda: queued_from_json(self._read(f"queuedResources/{name}"), self.location))

    def nodes_page(self) -> list[TpuNode]:
        """The zone's nodes with one GET (their first page, as the REST path of `get` reads them: Google's
        client is not loaded), for a check that must cost little (owners.warn_of_orphans)."""
        with self._errors("listing TPU VMs"):
            return [node_from_json(node, self.location) for node in self._request("GET", "nodes").get("nodes", [])]

    def list_queued(self) -> list[QueuedResource]:
        with self._errors("listing queued resources"), client_errors():
            found = self._google_client().list_queued_resources(parent=self.location.parent, timeout=self.timeout_s)
            return [queued_from_json(_json(resource), self.location) for resource in found]

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
        with self._errors(doing, request.name, kind="queued resource"), client_errors():
            operation = self._google_client().create_queued_resource(
                parent=self.location.parent, queued_resource_id=request.name, queued_resource=resource,
                timeout=self.timeout_s)
        return Pending(operation.operation.name, doing, request.name)

    def delete_queued(self, name: str) -> Pending:
        """Delete the queued resource with its nodes (force: whatever its state)."""
        from google.cloud import tpu_v2

        doing = f"deleting queued resource {name} with its TPU VM"
        with self._errors(doing, name, kind="queued resource"), client_errors():
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
        with self._errors("listing TPU VMs"), client_errors():
            nodes = self._google_client().list_nodes(parent=self.location.parent, timeout=self.timeout_s)
            return [node_from_json(_json(node), self.location) for node in nodes]

    def create(self, request: TpuRequest) -> Pending:
        """The request's one node, directly (no queued resource)."""
        from google.cloud import tpu_v2

        node = _node_to_create(request)
        node.scheduling_config = tpu_v2.SchedulingConfig(spot=request.spot)
        doing = f"creating TPU VM {request.name}"
        with self._errors(doing, request.name), client_errors():
            operation = self._google_client().create_node(parent=self.location.parent, node_id=request.name, node=node,
                                                          timeout=self.timeout_s)
        return Pending(operation.operation.name, doing, request.name)

    def delete(self, name: str) -> Pending:
        doing = f"deleting TPU VM {name}"
        with self._errors(doing, name), client_errors():
            operation = self._google_client().delete_node(name=self._full_name(name), timeout=self.timeout_s)
        return Pending(operation.operation.name, doing, name)

    def set_metadata(self, node: TpuNode, metadata: dict[str, str]) -> None:
        """Replace the node's metadata (as `gcloud compute tpus tpu-vm ssh` does to add a key) and wait."""
        from google.cloud import tpu_v2
        from google.protobuf import field_mask_pb2

        doing = f"updating the metadata of TPU VM {node.name}"
        with self._errors(doing, node.name), client_errors():
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

        with self._errors(pending.doing, pending.node), client_errors():
            operation = self._google_client().get_operation({"name": pending.operation}, timeout=self.timeout_s)
            if operation.HasField("error"):
                failure = exceptions.from_grpc_status(operation.error.code, operation.error.message)
                raise ApiCallError(failure.code, failure.message)
        return operation.done

    def _read(self, path: str) -> dict:
        """The JSON of `nodes/NAME` or `queuedResources/NAME` in this location, with one GET."""
        return self._request("GET", path)

    @property
    def base_url(self) -> str:
        """The API's URL before `/v2/...`: the endpoint override's (https:// unless it names a scheme), else Google's."""
        base = self.endpoint or GOOGLE_ENDPOINT
        return base if "://" in base else "https://" + base

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        """One request to `path` in this location (a JSON body with it): the answer's JSON."""
        return self.call(method, f"{self.base_url}/v2/{self.location.parent}/{path}", body)

    def call(self, method: str, url: str, body: dict | None = None) -> dict:
        """One request to a Google API's `url` with these credentials (a JSON body with it), through
        google.auth's urllib3 transport: the answer's JSON; ApiCallError, ApiUnreachable or ApiTimeout."""
        data = None if body is None else json.dumps(body)
        try:
            response = AuthorizedHttp(self.auth.credentials).request(
                method, url, body=data, headers={"Content-Type": "application/json"} if data else None,
                timeout=self.timeout_s, retries=False)
        except urllib3.exceptions.HTTPError as error:
            # a refused connection is a NewConnectionError, which urllib3 derives from its TimeoutError
            timed_out = (isinstance(error, urllib3.exceptions.TimeoutError)
                         and not isinstance(error, urllib3.exceptions.NewConnectionError))
            raise (ApiTimeout() if timed_out else ApiUnreachable(type(error).__name__)) from None
        if response.status >= 400:
            raise error_of(response)
        return json.loads(response.data)

    def _full_name(self, name: str) -> str:
        return f"{self.location.parent}/nodes/{name}"

    def _google_client(self):
        if self.client is None:
            from google.cloud import tpu_v2

            options = {"api_endpoint": self.endpoint} if self.endpoint else None
            self.client = tpu_v2.TpuClient(transport="rest", credentials=self.auth.credentials, client_options=options)
        return self.client

    @contextlib.contextmanager
    def _errors(self, doing: str, name: str | None = None, kind: str = "TPU VM") -> Iterator[None]:
        """Google's errors, as one line each that says what to do; `kind`: what `name` names."""
        try:
            with self.auth.errors(doing):
                yield
        except ApiCallError as error:
            if no_external_ips.refuses_external_ips(error.message):
                raise no_external_ips.external_ips_refused(doing, self.location.project) from None
            if error.code == 429 and "quota" not in error.message.lower():
                raise NoCapacity(f"{doing}: {self._advice(error, name, kind)}",
                                 HTTP_PREFIX.sub("", error.message)) from None
            raise PodrunError(f"{doing}: {self._advice(error, name, kind)}") from None
        except ApiUnreachable as error:
            raise PodrunError(f"{doing}: cannot reach the Cloud TPU API at {self.endpoint or GOOGLE_ENDPOINT} "
                              f"({error})") from None
        except ApiTimeout:
            override = " or CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU" if self.endpoint else ""
            raise PodrunError(f"no answer from the Cloud TPU API ({self.endpoint or GOOGLE_ENDPOINT}) after "
                              f"{self.timeout_s:g}s while {doing} in {self.location.project}/{self.location.zone}; "
                              f"check your network{override} (PODRUN_API_TIMEOUT sets the seconds to wait)") from None

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
            return self.auth.rejected(message)
        if error.code == 400:
            return f"invalid request: {message}"
        return f"Cloud TPU API error {error.code}: {message}"



def _node_to_create(request: TpuRequest):
    """The Node a create asks for, directly or in a queued resource's node spec (whose node's labels
    are the queued resource's: it has none of its own): external IPs asked for as gcloud asks for them
    (the API's default is none)."""
    from google.cloud import tpu_v2

    return tpu_v2.Node(accelerator_type=request.accelerator_type, runtime_version=request.runtime_version,
                       metadata=request.metadata, labels=request.labels,
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

