"""The Cloud TPU stand-in's queued resources (tests/tpu_stand_in.py), read and driven by the real gcloud
CLI and the real google-cloud-tpu client: the state machine, spot preemption, force delete, withheld
capacity and `validUntilDuration`. Run under `flock /tmp/podrun-lab.lock`: they use the lab."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import time

import pytest

ZONE = "us-central2-b"
PARENT = f"projects/podrun-test/locations/{ZONE}"


def gcloud(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["gcloud", "compute", "tpus", *args, f"--zone={ZONE}", "--format=json", "--quiet"],
                          capture_output=True, text=True, timeout=120)


def gcloud_json(*args: str):
    result = gcloud(*args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def wait_until(condition, timeout: float = 30, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(interval)
    return value


def sshd_answers(ip: str) -> bool:
    try:
        with socket.create_connection((ip, 22), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def client(tpu_api):
    from google.cloud import tpu_v2
    from google.oauth2.credentials import Credentials

    host, port = tpu_api.server.server_address[:2]
    return tpu_v2.TpuClient(transport="rest", credentials=Credentials(token="stand-in-token"),
                            client_options={"api_endpoint": f"http://{host}:{port}"})


@pytest.mark.gcloud
def test_gcloud_spot_queued_resource_goes_active_is_preempted_and_force_deleted(tpu_api, lab):
    created = gcloud_json("queued-resources", "create", "qr-spot", "--node-id=spot-node", "--accelerator-type=v4-16",
                          "--runtime-version=tpu-ubuntu2204-base", "--spot", "--valid-until-duration=1h")
    assert created["name"] == f"{PARENT}/queuedResources/qr-spot"
    body = tpu_api.queued[created["name"]].resource  # as gcloud sent it
    assert body["tpu"]["nodeSpec"] == [{"parent": PARENT, "nodeId": "spot-node", "node": body["tpu"]["nodeSpec"][0]["node"]}]
    assert body["spot"] == {} and body["queueingPolicy"] == {"validUntilDuration": "3600s"}

    seen = set()

    def active():
        state = gcloud_json("queued-resources", "describe", "qr-spot")["state"]
        seen.add(state["state"])
        return state["state"] == "ACTIVE"

    wait_until(active)
    assert {"WAITING_FOR_RESOURCES", "ACTIVE"} <= seen
    listed = gcloud_json("queued-resources", "list")
    assert [(q["name"], q["state"]["state"]) for q in listed] == [(created["name"], "ACTIVE")]
    node = gcloud_json("tpu-vm", "describe", "spot-node")
    assert node["state"] == "READY" and node["queuedResource"] == created["name"]
    assert node["schedulingConfig"] == {"spot": True}
    ips = [endpoint["ipAddress"] for endpoint in node["networkEndpoints"]]
    assert ips == [lab.hosts[0].ip, lab.hosts[1].ip] and all(sshd_answers(ip) for ip in ips)

    # Google's lag, long enough here for gcloud to start and read the node first on a loaded machine (1 s
    # was not, under parallel test workers)
    tpu_api.preemption_lag_s = 5.0
    tpu_api.preempt("spot-node")
    assert not any(sshd_answers(ip) for ip in ips)  # the VMs vanished at once, while the API lags:
    assert gcloud_json("tpu-vm", "describe", "spot-node")["state"] == "READY"
    wait_until(lambda: gcloud_json("tpu-vm", "describe", "spot-node")["state"] == "PREEMPTED")
    assert gcloud_json("queued-resources", "describe", "qr-spot")["state"] == {
        "state": "SUSPENDED", "suspendedData": {}, "stateInitiator": "SERVICE"}
    assert not any(sshd_answers(ip) for ip in ips)  # the VMs vanished

    refused = gcloud("queued-resources", "delete", "qr-spot")
    assert refused.returncode != 0 and "force" in refused.stderr, refused.stderr
    assert gcloud_json("queued-resources", "describe", "qr-spot")["state"]["state"] == "SUSPENDED"

    deleted = gcloud("queued-resources", "delete", "qr-spot", "--force")
    assert deleted.returncode == 0, deleted.stderr
    assert gcloud_json("queued-resources", "list") == [] and gcloud_json("tpu-vm", "list") == []
    assert all(sshd_answers(ip) for ip in ips)  # the hosts are capacity again
    assert len(tpu_api.free) == len(lab.hosts)


def test_python_client_multislice_waits_while_capacity_is_withheld(tpu_api, client, lab):
    from google.cloud import tpu_v2

    tpu_api.withhold_capacity(math.inf)
    queued = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
            parent=PARENT, node=tpu_v2.Node(accelerator_type="v4-16", runtime_version="tpu-ubuntu2204-base"),
            multislice_params=tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(node_count=2,
                                                                                   node_id_prefix="slice"))]),
        spot=tpu_v2.QueuedResource.Spot())
    result = client.create_queued_resource(parent=PARENT, queued_resource_id="qr-multi",
                                           queued_resource=queued).result(timeout=30)
    name = f"{PARENT}/queuedResources/qr-multi"
    assert result.name == name
    State = tpu_v2.QueuedResourceState.State
    wait_until(lambda: client.get_queued_resource(name=name).state.state == State.WAITING_FOR_RESOURCES)
    time.sleep(5 * tpu_api.operation_delay_s)
    assert client.get_queued_resource(name=name).state.state == State.WAITING_FOR_RESOURCES
    assert not list(client.list_nodes(parent=PARENT))
    tpu_api.withhold_capacity(0)
    wait_until(lambda: client.get_queued_resource(name=name).state.state == State.ACTIVE)
    assert [q.name for q in client.list_queued_resources(parent=PARENT)] == [name]
    nodes = sorted(client.list_nodes(parent=PARENT), key=lambda node: node.name)
    assert [node.name.rsplit("/", 1)[1] for node in nodes] == ["slice-0", "slice-1"]
    assert all(node.state == tpu_v2.Node.State.READY and node.multislice_node for node in nodes)
    assert sorted(e.ip_address for node in nodes for e in node.network_endpoints) == sorted(h.ip for h in lab.hosts)

    tpu_api.preempt("slice-1")
    wait_until(lambda: client.get_node(name=f"{PARENT}/nodes/slice-1").state == tpu_v2.Node.State.PREEMPTED)
    state = client.get_queued_resource(name=name).state
    assert state.state == State.SUSPENDED and state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE
    from google.api_core import exceptions

    # FAILED_PRECONDITION is HTTP 400, which google-api-core raises as BadRequest
    with pytest.raises(exceptions.BadRequest, match="force=true") as refused:
        client.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=name)).result(timeout=30)
    assert refused.value.response.json()["error"]["status"] == "FAILED_PRECONDITION"
    client.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=name, force=True)).result(timeout=30)
    assert not list(client.list_queued_resources(parent=PARENT)) and not list(client.list_nodes(parent=PARENT))
    assert all(sshd_answers(host.ip) for host in lab.hosts)


def test_valid_until_duration_passing_while_waiting_fails_the_request(tpu_api, client):
    from google.cloud import tpu_v2
    from google.protobuf import duration_pb2

    tpu_api.withhold_capacity(math.inf)
    queued = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
            parent=PARENT, node_id="late", node=tpu_v2.Node(accelerator_type="v4-8",
                                                             runtime_version="tpu-ubuntu2204-base"))]),
        guaranteed=tpu_v2.QueuedResource.Guaranteed(),
        queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(valid_until_duration=duration_pb2.Duration(seconds=1)))
    client.create_queued_resource(parent=PARENT, queued_resource_id="qr-late", queued_resource=queued).result(timeout=30)
    name = f"{PARENT}/queuedResources/qr-late"
    State = tpu_v2.QueuedResourceState.State
    assert client.get_queued_resource(name=name).state.state in (State.ACCEPTED, State.WAITING_FOR_RESOURCES)
    failed = wait_until(lambda: (q := client.get_queued_resource(name=name)).state.state == State.FAILED and q)
    assert failed.state.failed_data.error.code == 8 and not list(client.list_nodes(parent=PARENT))
    client.delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(name=name)).result(timeout=30)
    assert not list(client.list_queued_resources(parent=PARENT))


@pytest.mark.gcloud
def test_a_request_larger_than_the_free_hosts_waits_instead_of_failing(tpu_api):
    result = gcloud("queued-resources", "create", "qr-big", "--node-id=big", "--accelerator-type=v4-64",
                    "--runtime-version=tpu-ubuntu2204-base")
    assert result.returncode == 0, result.stderr
    time.sleep(4 * tpu_api.operation_delay_s)
    assert gcloud_json("queued-resources", "describe", "qr-big")["state"]["state"] == "WAITING_FOR_RESOURCES"
    deleted = gcloud("queued-resources", "delete", "qr-big")  # waiting, no nodes: no force needed
    assert deleted.returncode == 0, deleted.stderr
    assert gcloud_json("queued-resources", "list") == []
