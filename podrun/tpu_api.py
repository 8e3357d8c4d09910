"""The Cloud TPU v2 API through Google's own client (google-cloud-tpu): the only module that imports it.

It costs ~0.3 s to import, so only the commands that talk to Google load this module. Requests go
over REST, as gcloud's do; the endpoint and the access token come from gcloud's settings
(CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU, CLOUDSDK_AUTH_ACCESS_TOKEN_FILE), otherwise Google's endpoint
and Application Default Credentials. Every error Google returns becomes one line saying what to do.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import google.auth
import requests
from google.api_core import exceptions
from google.api_core.operation import Operation
from google.auth.exceptions import DefaultCredentialsError, RefreshError
from google.cloud import tpu_v2
from google.oauth2.credentials import Credentials
from google.protobuf import field_mask_pb2

from podrun.errors import PodrunError
from podrun.gcloud_settings import ACCESS_TOKEN_FILE, TPU_ENDPOINT, Location, gcloud_property

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
OPERATION_POLL_S = 0.5
PROGRESS_EVERY_S = 1.0
HTTP_PREFIX = re.compile(r"^(?:GET|POST|PATCH|PUT|DELETE) \S+: ")  # the REST client's prefix to Google's message
API_DISABLED = re.compile(r"has not been used|is disabled|not enabled")


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

    @property
    def full_name(self) -> str:
        return f"{self.location.parent}/nodes/{self.name}"


class TpuApi:
    def __init__(self, location: Location):
        self.location = location
        self.endpoint = (gcloud_property(TPU_ENDPOINT) or "").rstrip("/").removesuffix("/v2") or None
        options = {"api_endpoint": self.endpoint} if self.endpoint else None
        self.client = tpu_v2.TpuClient(transport="rest", credentials=_credentials(), client_options=options)

    def get(self, name: str) -> TpuNode:
        with self._errors(f"reading TPU VM {name}", name):
            return self._node(self.client.get_node(name=self._full_name(name)))

    def list(self) -> list[TpuNode]:
        with self._errors("listing TPU VMs"):
            return [self._node(node) for node in self.client.list_nodes(parent=self.location.parent)]

    def create(self, name: str, accelerator_type: str, runtime_version: str, spot: bool,
               on_progress: Callable[[float], None] | None) -> TpuNode | None:
        """The new node once it is READY; None right after the request without on_progress (--no-wait)."""
        node = tpu_v2.Node(accelerator_type=accelerator_type, runtime_version=runtime_version,
                           scheduling_config=tpu_v2.SchedulingConfig(spot=spot))
        with self._errors(f"creating TPU VM {name}", name):
            operation = self.client.create_node(parent=self.location.parent, node_id=name, node=node)
            return self._node(_wait(operation, on_progress)) if on_progress else None

    def delete(self, name: str, on_progress: Callable[[float], None]) -> None:
        with self._errors(f"deleting TPU VM {name}", name):
            _wait(self.client.delete_node(name=self._full_name(name)), on_progress)

    def set_metadata(self, node: TpuNode, metadata: dict[str, str]) -> None:
        """Replace the node's metadata (as `gcloud compute tpus tpu-vm ssh` does to add a key) and wait."""
        with self._errors(f"updating the metadata of TPU VM {node.name}", node.name):
            operation = self.client.update_node(node=tpu_v2.Node(name=node.full_name, metadata=metadata),
                                                update_mask=field_mask_pb2.FieldMask(paths=["metadata"]))
            _wait(operation, lambda elapsed: None)

    def _full_name(self, name: str) -> str:
        return f"{self.location.parent}/nodes/{name}"

    def _node(self, node: tpu_v2.Node) -> TpuNode:
        return TpuNode(
            name=node.name.rsplit("/", 1)[-1], location=self.location, state=node.state.name,
            accelerator_type=node.accelerator_type, runtime_version=node.runtime_version, health=node.health.name,
            spot=node.scheduling_config.spot or node.scheduling_config.preemptible,
            workers=[WorkerAddress(e.ip_address, e.access_config.external_ip or None) for e in node.network_endpoints],
            metadata=dict(node.metadata))

    @contextlib.contextmanager
    def _errors(self, doing: str, name: str | None = None) -> Iterator[None]:
        """Google's errors, as one line each that says what to do."""
        where = f"{self.location.project}/{self.location.zone}"
        try:
            yield
        except exceptions.GoogleAPICallError as error:
            raise PodrunError(f"{doing}: {self._advice(error, name, where)}") from None
        except RefreshError as error:
            raise PodrunError(f"{doing}: cannot refresh the Google credentials ({error}); run "
                              f"`gcloud auth application-default login`") from None
        except requests.exceptions.RequestException as error:
            endpoint = self.endpoint or "tpu.googleapis.com"
            raise PodrunError(f"{doing}: cannot reach the Cloud TPU API at {endpoint} "
                              f"({type(error).__name__})") from None

    def _advice(self, error: exceptions.GoogleAPICallError, name: str | None, where: str) -> str:
        """What went wrong and what to do. Errors of calls arrive as HTTP classes (Conflict, ...), errors of
        failed operations as their gRPC subclasses (AlreadyExists, ...): the HTTP classes catch both."""
        message = HTTP_PREFIX.sub("", error.message or "")
        zone, project = self.location.zone, self.location.project
        if isinstance(error, exceptions.Conflict):
            return (f"a TPU VM named {name} already exists in {where}; pick another --name, "
                    f"or delete it with `podrun delete {name} --zone {zone}`")
        if isinstance(error, exceptions.NotFound):
            return f"no TPU VM named {name} in {where}; `podrun list --zone {zone}` shows the ones there"
        if isinstance(error, exceptions.TooManyRequests) and "quota" in message.lower():
            return (f"quota exceeded in {where} ({message}); ask for more quota in the console's "
                    f"IAM & Admin > Quotas, or use a smaller slice")
        if isinstance(error, exceptions.TooManyRequests):
            return f"no capacity in {zone} right now ({message}); try another zone, --spot, or again later"
        if isinstance(error, exceptions.Forbidden) and API_DISABLED.search(message):
            return (f"the Cloud TPU API is not enabled in project {project}; run "
                    f"`gcloud services enable tpu.googleapis.com --project {project}`")
        if isinstance(error, exceptions.Forbidden):
            return f"permission denied in {where} ({message}); your account needs a role such as roles/tpu.admin"
        if isinstance(error, exceptions.Unauthorized):
            return f"Google rejected the credentials ({message}); run `gcloud auth application-default login`"
        if isinstance(error, exceptions.BadRequest):
            return f"invalid request: {message}"
        return f"Cloud TPU API error {error.code}: {message}"


def _wait(operation: Operation, on_progress: Callable[[float], None]):
    """The operation's result once it is done, reporting the seconds waited now and then."""
    started = time.monotonic()
    reported = started
    while not operation.done():
        time.sleep(OPERATION_POLL_S)
        if time.monotonic() - reported >= PROGRESS_EVERY_S:
            reported = time.monotonic()
            on_progress(reported - started)
    return operation.result()


def _credentials():
    token_file = gcloud_property(ACCESS_TOKEN_FILE)
    if token_file:
        try:
            return Credentials(Path(token_file).expanduser().read_text().strip())
        except OSError as error:
            raise PodrunError(f"cannot read the access token file {token_file} (CLOUDSDK_AUTH_ACCESS_TOKEN_FILE): "
                              f"{error.strerror}") from None
    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except DefaultCredentialsError:
        raise PodrunError("no Google credentials found: run `gcloud auth application-default login` "
                          "(or point CLOUDSDK_AUTH_ACCESS_TOKEN_FILE at an access token)") from None
    return credentials
