"""Close the laptop (issue 28): a lab host plays the supervisor host, with its own gcloud credentials, and
reaches the TPU API stand-in on the lab's network; the laptop (this process) hands jobs over to it and
never runs them. Run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import os
import subprocess

from conftest import LAPTOP_TOKEN, SUPERVISOR_HOST, SUPERVISOR_TOKEN, podrun

# --- the lab itself: what the tests below stand on

def test_the_supervisor_host_reaches_the_api_on_the_labs_network_with_its_own_token(lab, tpu_api_on_lab, supervisor):
    from lab import BRIDGE_IP

    url = os.environ["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"]
    on_laptop = podrun("list")
    assert on_laptop.returncode == 0, on_laptop.stderr
    assert tpu_api_on_lab.callers() == {(BRIDGE_IP, LAPTOP_TOKEN)}
    sent = len(tpu_api_on_lab.received)
    # what the laptop would send it: the project, zone and endpoint; the token is the host's own
    command = (f"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU={url} CLOUDSDK_CORE_PROJECT=podrun-test "
               f"CLOUDSDK_COMPUTE_ZONE=us-central2-b {supervisor.podrun} list")
    there = subprocess.run([*lab.ssh_args(SUPERVISOR_HOST), command], capture_output=True, text=True, timeout=60)
    assert there.returncode == 0, there.stderr
    assert tpu_api_on_lab.callers(since=sent) == {(supervisor.ip, SUPERVISOR_TOKEN)}


def test_the_stand_in_on_the_labs_network_never_hands_out_the_supervisor_host(lab, tpu_api_on_lab, supervisor):
    # four lab hosts, one of them the supervisor's: a v4-32 (4 hosts) does not fit
    result = podrun("create", "v4-32", "--name", "big")
    assert result.returncode != 0 and "no more capacity" in result.stderr, result.stderr
    assert podrun("create", "v4-16", "--name", "life").returncode == 0
    assert SUPERVISOR_HOST not in [e.host_index for e in tpu_api_on_lab.node_endpoints_of("life")]
