"""A TPU podrun makes is reachable, and a TPU made again too (issue 25, part 4): every create asks
for external IPs unless the spec or the flag says internal, a node without them is named before
podrun connects, and TPU workers are known by gcloud's host key alias with the keys their guest
attributes publish, so that a VM made again (new keys, maybe the old addresses) is a new host. Against
the Cloud TPU stand-in, whose nodes get external IPs only when asked and whose new VMs get new host
keys, as on Google; run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from podrun.cloud.settings import Location
from podrun.cloud.tpu_resources import TpuNode, WorkerAddress
from podrun.targets.tpu import host_key_alias

from helpers import REPO, ZONE, create, gcloud, job_id_in, podrun, processes_of_job

PATH = f"{Path(sys.executable).parent}:/usr/bin:/bin"


def spec_on(job_file, tpu: str, run: str, **top: str) -> Path:
    lines = [f"target: {{tpu: {{{tpu}}}}}", "ssh: {user: root}", f"env: {{PATH: '{PATH}'}}", f"run: {run}",
             *(f"{key}: {value}" for key, value in top.items())]
    return job_file("\n".join(lines) + "\n")


def asks_for_external_ips(node: dict) -> bool:
    return node.get("networkConfig", {}).get("enableExternalIps", False)


def node_json(tpu_api, name: str) -> dict:
    return tpu_api.nodes[f"projects/podrun-test/locations/{ZONE}/nodes/{name}"]


def known_hosts(home: Path) -> list[list[str]]:
    path = home / "known_hosts"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_gclouds_alias_names_the_node_by_its_id_and_worker_and_the_end_of_its_published_key():
    node = TpuNode("pod", Location("p", ZONE), "READY", "v4-16", "r", "HEALTHY", False,
                   [WorkerAddress("10.0.0.2", None)] * 2, id="4000000000000000007")
    published = ("ecdsa-sha2-nistp256 AAAAE2VjZHNh", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIabcdef")
    assert host_key_alias(node, 1, published) == "tpu.4000000000000000007-1-abcdef"
    assert host_key_alias(node, 0, ()) == "tpu.4000000000000000007-0"


def test_every_create_asks_for_external_ips_unless_the_spec_or_the_flag_says_internal(home, tpu_api, lab, job_file):
    inside = spec_on(job_file, "name: life, accelerator_type: v4-16, spot: true, internal_ip: true",
                     "echo from $(hostname)", delete_after="always")
    result = podrun("exec", inside)
    assert result.returncode == 0, result.stderr
    assert "internal IPs only" in result.stderr and "no external IPs" not in result.stderr
    assert "[w1] from podrun-lab1" in result.stdout

    creates = [subprocess.Popen([sys.executable, "-m", "podrun", "create", *args, "--no-wait"], cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for args in (["v4-16", "--name", "life", "--spot", "--internal-ips"], ["v4-8", "--name", "direct"],
                            ["v4-8", "--name", "queued", "--queued"], ["v4-8", "--name", "ms", "--slices", "2"])]
    for process in creates:
        assert process.wait(timeout=60) == 0, process.stderr.read()

    nodes = tpu_api.node_requests()
    (_, from_spec), (_, from_flags) = [(name, node) for name, node in nodes if name == "life"]
    assert not asks_for_external_ips(from_spec)
    assert "ssh-keys" in from_spec.pop("metadata")  # exec adds the user's key
    # whose they are differs (cloud/labels.py): the job's, to delete after it; `podrun create`'s, kept
    assert (from_spec.pop("labels")["podrun-job"], from_flags.pop("labels")["podrun-job"]) == (job_id_in(result.stderr),
                                                                                                "create")
    assert from_spec == from_flags
    assert sorted(name for name, node in nodes if asks_for_external_ips(node)) == ["direct", "ms", "queued"]
    assert [node["networkConfig"] for name, node in nodes if name == "direct"] == [{"enableExternalIps": True}]


@pytest.mark.gcloud
def test_a_node_without_external_ips_is_named_in_one_line_before_podrun_connects(home, tpu_api, lab, job_file):
    created = create("inside", "v4-16", "--internal-ips")
    assert "(v4-16: 2 workers, runtime tpu-ubuntu2204-base, internal IPs only)" in created.stderr
    assert f"worker 1     internal {lab.hosts[1].ip}  external -" in created.stdout
    described = gcloud("describe", "inside")
    assert described.returncode == 0, described.stderr
    node = json.loads(described.stdout)
    assert [endpoint.get("accessConfig") for endpoint in node["networkEndpoints"]] == [None, None]
    assert "enableExternalIps" not in node["networkConfig"]

    result = podrun("exec", spec_on(job_file, "name: inside", "echo reached"), "--no-collapse")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("] reached") == 2
    lines = result.stderr.splitlines()
    named = [index for index, line in enumerate(lines) if "no external IPs" in line]
    assert lines[named[0]] == (
        f"podrun: TPU VM inside has no external IPs: connecting to internal IPs {lab.hosts[0].ip}, {lab.hosts[1].ip}, "
        f"which only a machine in its VPC network (or on a VPN to it) reaches; from there, set target.tpu.internal_ip: "
        f"true; from elsewhere, go through IAP (target.tpu.iap: true, or --tunnel-through-iap) or a bastion "
        f"(ssh.proxy_jump or ssh.proxy_command), or run podrun on a host inside the VPC (a supervisor host there, or "
        f"over a VPN)")
    assert len(named) == 1 and named[0] < next(i for i, line in enumerate(lines) if "──" in line)

    from_inside = podrun("exec", spec_on(job_file, "name: inside, internal_ip: true", "echo inside"))
    assert from_inside.returncode == 0 and "no external IPs" not in from_inside.stderr


def test_a_tpu_deleted_and_made_again_under_its_name_is_a_new_host_to_exec_ssh_cp_and_a_detached_job(
        home, tpu_api, lab, job_file, tmp_path):
    create("pod", "v4-16")
    spec = spec_on(job_file, "name: pod", "echo hello from $PODRUN_WORKER")
    assert podrun("exec", spec).returncode == 0
    assert known_hosts(home) == []  # the published keys were trusted as they are: nothing to trust on first use
    old_keys = [lab.hosts[i].host_key().split()[:2] for i in (0, 1)]
    # as podrun trusted keys before it knew TPU workers by alias: by address, now an old VM's
    (home / "known_hosts").write_text("".join(f"{lab.hosts[i].external_ip} {' '.join(old_keys[i])}\n" for i in (0, 1)))

    assert podrun("delete", "pod", "--yes").returncode == 0
    create("pod", "v4-16")  # the same hosts, new VMs: new host keys and a new id
    assert [lab.hosts[i].host_key().split()[:2] for i in (0, 1)] != old_keys
    again = podrun("exec", spec)
    assert again.returncode == 0, again.stderr
    assert "[w1] hello from 1" in again.stdout and "host key" not in again.stderr

    shell = podrun("ssh", spec, "--worker", "1", "--", "hostname")
    assert (shell.returncode, shell.stdout, shell.stderr) == (0, "podrun-lab1\n", "")
    (tmp_path / "notes.txt").write_text("copied\n")
    copied = podrun("cp", spec, tmp_path / "notes.txt", ":notes.txt")
    assert copied.returncode == 0, copied.stderr
    assert (lab.hosts[0].home / "notes.txt").read_text() == "copied\n"

    node_id = node_json(tpu_api, "pod")["id"]
    published = [lab.hosts[i].host_key().split()[:2] for i in (0, 1)]
    # `podrun ssh` wrote what OpenSSH checks: worker 1's published key under gcloud's alias for it
    assert known_hosts(home)[2:] == [[f"tpu.{node_id}-1-{published[1][1][-6:]}", *published[1]]]

    detached = podrun("exec", spec_on(job_file, "name: pod", "sleep 1; echo done on $PODRUN_WORKER"), "--detach")
    assert detached.returncode == 0, detached.stderr
    job_id = job_id_in(detached.stderr)
    followed = podrun("logs", job_id, "--follow")
    assert followed.returncode == 0, followed.stderr
    assert "done on 1" in followed.stdout and "host key" not in followed.stderr
    assert processes_of_job(job_id) == []


def test_where_no_host_keys_are_published_they_are_trusted_on_first_use_under_the_alias(home, tpu_api, lab, job_file):
    tpu_api.publishes_host_keys = False  # guest agents that published nothing yet
    create("pod", "v4-16")
    spec = spec_on(job_file, "name: pod", "echo hello")
    assert podrun("exec", spec).returncode == 0
    node_id = node_json(tpu_api, "pod")["id"]
    assert sorted(known_hosts(home)) == [[f"tpu.{node_id}-{i}", *lab.hosts[i].host_key().split()[:2]] for i in (0, 1)]
    again = podrun("exec", spec)
    assert again.returncode == 0, again.stderr
    assert len(known_hosts(home)) == 2
