"""A TPU VM deleting itself with its own credentials (remote/self_delete.py): the access token from the GCE
metadata stand-in, the DELETE to the Cloud TPU stand-in, both real HTTP servers on 127.0.0.1, and what
TpuCapacity.give_back() would delete named by capacity.self_delete_config, as the launcher gives it to a worker."""

from __future__ import annotations

import socket

import pytest
from metadata_stand_in import VM_TOKEN, MetadataStandIn

from podrun.cloud import capacity
from podrun.cloud.request import TpuRequest
from podrun.cloud.settings import Location
from podrun.remote import self_delete

from helpers import LAPTOP_TOKEN, wait_until
from tpu_stand_in import LabEndpoint, TpuStandIn

PARENT = "projects/podrun-test/locations/us-central2-b"


@pytest.fixture
def google(tmp_path, monkeypatch):
    """The TPU stand-in (capacity: addresses no test connects to) with the user's gcloud settings pointing at
    it, and the VMs' metadata server: (stand-in, podrun's TpuApi there, the metadata stand-in, its HOST:PORT)."""
    from podrun.cloud.tpu_api import TpuApi

    stand_in = TpuStandIn([LabEndpoint(f"10.254.0.{i}", f"10.254.1.{i}", i) for i in range(4)], operation_delay_s=0.05)
    url = stand_in.serve()
    (tmp_path / "token").write_text(LAPTOP_TOKEN + "\n")
    for name, value in {"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": f"{url}/", "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
                        "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(tmp_path / "token"), "NO_GCE_CHECK": "True"}.items():
        monkeypatch.setenv(name, value)
    metadata = MetadataStandIn()
    yield stand_in, TpuApi(Location("podrun-test", "us-central2-b")), metadata, metadata.serve("127.0.0.1")
    metadata.shutdown()
    stand_in.shutdown()


def made(api, name: str, queued: bool = False) -> dict:
    """A TPU VM made through podrun's own create, and the config a launcher gives its worker 0 to delete it."""
    capacity.obtain(api, TpuRequest(name, "v4-8", "tpu-ubuntu2204-base", queued=queued))
    return capacity.self_delete_config(api, [name])


def deletes(stand_in) -> list[tuple[str, dict, str]]:
    """Each DELETE the stand-in received: its path, query and bearer token."""
    with stand_in.lock:
        tokens = [r.token for r in stand_in.received if r.method == "DELETE"]
        queries = [(path, query) for method, path, query, _ in stand_in.bodies if method == "DELETE"]
    return [(path, query, token) for (path, query), token in zip(queries, tokens)]


def test_a_node_is_deleted_with_the_vms_token(google):
    stand_in, api, metadata, host = google
    config = made(api, "solo")
    assert config == {"api": stand_in_url(stand_in), "names": [f"{PARENT}/nodes/solo"], "metadata_host": None}

    line, outcome = self_delete.attempt({**config, "metadata_host": host})
    assert line == "deleting TPU VM solo in podrun-test/us-central2-b: the Cloud TPU API accepted the request"
    assert outcome == "done"
    wait_until(lambda: api.state("solo") == "gone", "the node to be deleted")
    assert deletes(stand_in) == [(f"/v2/{PARENT}/nodes/solo", {}, VM_TOKEN)]
    assert metadata.tokens_given == 1
    again = self_delete.delete({**config, "metadata_host": host})
    assert again == "TPU VM solo in podrun-test/us-central2-b is gone already"


def test_a_queued_resource_is_deleted_with_force_and_its_node_with_it(google):
    stand_in, api, _, host = google
    config = made(api, "asked", queued=True)
    assert config["names"] == [f"{PARENT}/queuedResources/asked"]

    line = self_delete.delete({**config, "metadata_host": host})
    assert line == "deleting queued resource asked in podrun-test/us-central2-b: the Cloud TPU API accepted the request"
    wait_until(lambda: api.get_queued("asked") is None and api.state("asked") == "gone", "the request and its node gone")
    assert deletes(stand_in) == [(f"/v2/{PARENT}/queuedResources/asked", {"force": ["true"]}, VM_TOKEN)]


def test_a_service_account_without_the_permission_leaves_the_node_and_says_which_role(google, monkeypatch):
    stand_in, api, _, host = google
    config = made(api, "kept")
    stand_in.deny(VM_TOKEN, "tpu.nodes.delete")
    monkeypatch.setenv("GCE_METADATA_HOST", host)  # as on a VM: the metadata server from the environment

    line = self_delete.delete(config)
    assert line == (f"cannot delete TPU VM kept in podrun-test/us-central2-b: PERMISSION_DENIED: the VM's service "
                    f"account may not delete TPUs (it needs roles/tpu.admin, Cloud TPU Admin): Permission "
                    f"'tpu.nodes.delete' denied on resource '//tpu.googleapis.com/{PARENT}/nodes/kept' (or it may not "
                    f"exist).")
    assert self_delete.denied(line) and self_delete.attempt(config) == (line, "denied")
    assert api.state("kept") == "READY"
    assert api.delete("kept")  # the user's own account may


def test_no_metadata_server_is_one_line_and_nothing_is_asked(google):
    stand_in, api, _, _ = google
    config = made(api, "alone")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    line, outcome = self_delete.attempt({**config, "metadata_host": f"127.0.0.1:{port}"})
    assert outcome == "failed"
    assert line.startswith(f"cannot delete TPU VM alone in podrun-test/us-central2-b: no access token: the metadata "
                           f"server at 127.0.0.1:{port} cannot be reached ("), line
    assert "\n" not in line and deletes(stand_in) == []
    unreachable_api = {**config, "api": f"http://127.0.0.1:{port}/"}
    metadata_host = google[3]
    assert self_delete.delete({**unreachable_api, "metadata_host": metadata_host}).startswith(
        f"cannot delete TPU VM alone in podrun-test/us-central2-b: the Cloud TPU API at http://127.0.0.1:{port} cannot "
        f"be reached (")


def test_a_request_without_the_metadata_flavor_header_is_refused_as_google_refuses_it(google):
    import urllib.error
    import urllib.request

    host = google[3]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://{host}{self_delete.TOKEN_PATH}", timeout=10)
    assert refused.value.code == 403


def stand_in_url(stand_in) -> str:
    host, port = stand_in.server.server_address[:2]
    return f"http://{host}:{port}"
