"""Google's generated Cloud TPU client (google-cloud-tpu): the only module that imports it.

It costs ~0.15 s to import on top of `exec`'s own, so only the calls that change something or list
nodes (create, delete, update metadata, list) load it; reading one node is a plain REST GET in
tpu_api.py. Requests go over REST, as gcloud's do. Nodes come back as the API's JSON (camelCase
fields, enums by name), Google's errors as tpu_api.ApiCallError.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from google.api_core import exceptions
from google.api_core.operation import Operation
from google.cloud import tpu_v2
from google.protobuf import field_mask_pb2

from podrun.tpu_api import ApiCallError

OPERATION_POLL_S = 0.5
PROGRESS_EVERY_S = 1.0


class TpuClient:
    def __init__(self, credentials, endpoint: str | None):
        options = {"api_endpoint": endpoint} if endpoint else None
        self.client = tpu_v2.TpuClient(transport="rest", credentials=credentials, client_options=options)

    def list(self, parent: str) -> list[dict]:
        with _api_errors():
            return [_json(node) for node in self.client.list_nodes(parent=parent)]

    def create(self, parent: str, name: str, accelerator_type: str, runtime_version: str, spot: bool,
               on_progress: Callable[[float], None] | None) -> dict | None:
        """The new node once it is READY; None right after the request without on_progress (--no-wait)."""
        node = tpu_v2.Node(accelerator_type=accelerator_type, runtime_version=runtime_version,
                           scheduling_config=tpu_v2.SchedulingConfig(spot=spot))
        with _api_errors():
            operation = self.client.create_node(parent=parent, node_id=name, node=node)
            return _json(_wait(operation, on_progress)) if on_progress else None

    def delete(self, full_name: str, on_progress: Callable[[float], None]) -> None:
        with _api_errors():
            _wait(self.client.delete_node(name=full_name), on_progress)

    def set_metadata(self, full_name: str, metadata: dict[str, str]) -> None:
        with _api_errors():
            operation = self.client.update_node(node=tpu_v2.Node(name=full_name, metadata=metadata),
                                                update_mask=field_mask_pb2.FieldMask(paths=["metadata"]))
            _wait(operation, lambda elapsed: None)


@contextlib.contextmanager
def _api_errors() -> Iterator[None]:
    """Errors of calls arrive as HTTP classes (Conflict, ...), errors of failed operations as their gRPC
    subclasses (AlreadyExists, ...); `code` is the HTTP status for both."""
    try:
        yield
    except exceptions.GoogleAPICallError as error:
        raise ApiCallError(error.code, error.message or "") from None


def _json(node: tpu_v2.Node) -> dict:
    return tpu_v2.Node.to_dict(node, use_integers_for_enums=False, preserving_proto_field_name=False)


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
