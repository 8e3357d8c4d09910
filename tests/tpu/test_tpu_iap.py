"""TPU VMs without external IPs (issue 37, parts 3 and 4): reached through IAP (`target.tpu.iap`,
`--tunnel-through-iap`) or a bastion (`ssh.proxy_command`), with every packet from this machine to the
workers' addresses dropped (nft), so that only the named way in can work; a create refused external IPs
by the organization policy is one line with the ways on, and leaves nothing in the API.

IAP is the `gcloud` stand-in (tests/gcloud_iap_stand_in.py) first on PATH: it checks its arguments as
the real gcloud does, resolves the instance through the TPU API stand-in's Compute Engine endpoint,
and connects from a network namespace of its own, as IAP connects from Google's range. Run under
`flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from podrun.cloud.no_external_ips import EXTERNAL_IP_CONSTRAINT

from helpers import (
    REPO,
    ZONE,
    Background,
    create,
    gcloud,
    job_id_in,
    left_in_api,
    packets_dropped,
    podrun,
    processes_of_job,
    stderr_lines_without_traceback,
)
from lab import BRIDGE, NAMESPACE_PREFIX, NETWORK, VETH_PREFIX, add_namespace, remove_namespace

PATH = f"{Path(sys.executable).parent}:/usr/bin:/bin"
PROJECT = "podrun-test"
IAP_NAMESPACE = f"{NAMESPACE_PREFIX}iap"  # IAP's forwarders (35.235.240.0/20 at Google), on the lab's bridge
IAP_ADDRESS = str(ipaddress.ip_network(NETWORK)[15 * 256 + 250])  # 10.99.15.250 in site 0
BASTION = 3  # the lab host that plays a bastion inside the VPC (a v4-16 takes hosts 0 and 1)


def spec_on(job_file, tpu: str, run: str, ssh: str = "user: root") -> Path:
    return job_file(f"target: {{tpu: {{{tpu}}}}}\nssh: {{{ssh}}}\nenv: {{PATH: '{PATH}'}}\nrun: {run}\n")


class Iap:
    """The `gcloud` stand-in on PATH, its calls, and IAP's namespace."""

    def __init__(self, log: Path):
        self.log = log

    def tunnels(self) -> list[list[str]]:
        """The arguments of every `gcloud compute start-iap-tunnel` run so far."""
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def iap(lab, tmp_path, monkeypatch):
    real = shutil.which("gcloud") or "/nonexistent/gcloud"
    bin_dir = tmp_path / "iap-bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "gcloud"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {REPO / "tests" / "gcloud_iap_stand_in.py"} "$@"\n')
    wrapper.chmod(0o755)
    add_namespace(IAP_NAMESPACE, f"{VETH_PREFIX}iap", BRIDGE, [f"{IAP_ADDRESS}/20"])
    for name, value in {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PODRUN_TEST_REAL_GCLOUD": real,
                        "PODRUN_TEST_IAP_NETNS": f"/run/netns/{IAP_NAMESPACE}",
                        "PODRUN_TEST_IAP_LOG": str(tmp_path / "iap.log")}.items():
        monkeypatch.setenv(name, value)
    yield Iap(tmp_path / "iap.log")
    remove_namespace(IAP_NAMESPACE)


@contextlib.contextmanager
def direct_packets_dropped(hosts):
    """Every packet from this machine to the hosts' addresses (internal and external) dropped until the
    block ends: only a way in through another machine reaches them (packets_dropped skips without nft)."""
    addresses = ", ".join(address for host in hosts for address in (host.ip, host.external_ip))
    with packets_dropped(f"ip daddr {{ {addresses} }}", table="podrun_lab_no_direct_route"):
        yield


def node_json(tpu_api, name: str) -> dict:
    return tpu_api.nodes[f"projects/{PROJECT}/locations/{ZONE}/nodes/{name}"]


def instance_names(tpu_api, name: str) -> list[str]:
    from tpu_stand_in import instance_name

    return [instance_name(node_json(tpu_api, name)["id"], worker) for worker in (0, 1)]


def test_the_flag_goes_with_a_tpu_target_only_in_one_line(home, job_file):
    on_hosts = job_file("target: {hosts: [10.99.0.10]}\nrun: echo hi\n")
    with_spec = podrun("exec", on_hosts, "--tunnel-through-iap", "--dry-run")
    assert with_spec.returncode == 2
    assert stderr_lines_without_traceback(with_spec.stderr) == [
        f"podrun: error: --tunnel-through-iap: goes with a tpu target, and {on_hosts} names a hosts target"]
    adhoc = podrun("ssh", "--hosts", "10.99.0.10", "--tunnel-through-iap")
    assert adhoc.returncode == 2
    assert stderr_lines_without_traceback(adhoc.stderr) == ["podrun: error: --tunnel-through-iap: goes with --tpu"]


def test_a_tpu_with_internal_ips_only_runs_through_iap_on_every_worker_and_so_do_ssh_cp_logs_stacks_stop(
        home, tpu_api, lab, job_file, iap, tmp_path):
    create("inside", "v4-16", "--internal-ips")
    spec = spec_on(job_file, "name: inside, iap: true", "echo from $(hostname) as worker $PODRUN_WORKER")
    with direct_packets_dropped(lab.hosts[:2]):
        unreachable = subprocess.run(["ssh", *lab.ssh_args(0)[1:-1], "-o", "ConnectTimeout=2",
                                      f"root@{lab.hosts[0].ip}", "true"], capture_output=True, timeout=30)
        assert unreachable.returncode == 255  # the direct way is closed indeed

        result = podrun("exec", spec, "--no-collapse")
        assert result.returncode == 0, result.stderr
        assert "[w0] from podrun-lab0 as worker 0" in result.stdout
        assert "[w1] from podrun-lab1 as worker 1" in result.stdout
        assert "no external IPs" not in result.stderr
        tunnels = iap.tunnels()
        assert sorted(tunnels) == [["compute", "start-iap-tunnel", instance, "22", "--listen-on-stdin",
                                    f"--project={PROJECT}", f"--zone={ZONE}", "--verbosity=warning"]
                                   for instance in instance_names(tpu_api, "inside")]

        # an ad-hoc target with the flag: `podrun ssh` (OpenSSH's own ProxyCommand) and `podrun cp`
        adhoc = ["--tpu", "inside", "--tunnel-through-iap", "--user", "root"]
        shell = podrun("ssh", *adhoc, "--worker", "1", "--", "hostname")
        assert (shell.returncode, shell.stdout) == (0, "podrun-lab1\n"), shell.stderr
        (tmp_path / "notes.txt").write_text("through the tunnel\n")
        copied = podrun("cp", *adhoc, tmp_path / "notes.txt", ":notes.txt")
        assert copied.returncode == 0, copied.stderr
        assert [(lab.hosts[i].home / "notes.txt").read_text() for i in (0, 1)] == ["through the tunnel\n"] * 2

        # a spec without iap, with the flag; then logs -f and stop of the detached job go through the tunnel too
        plain = spec_on(job_file, "name: inside, internal_ip: true", "echo started on $PODRUN_WORKER; exec sleep 600")
        detached = podrun("exec", plain, "--tunnel-through-iap", "--detach")
        assert detached.returncode == 0, detached.stderr
        job_id = job_id_in(detached.stderr)
        before = len(iap.tunnels())
        follower = Background("logs", job_id, "--follow")
        follower.wait_for(r"started on 1")
        stacks = podrun("stacks", job_id, "--all")
        assert stacks.returncode == 0, stacks.stderr
        assert "sleep" in stacks.stdout
        stopped = podrun("stop", job_id)
        assert stopped.returncode == 0, stopped.stderr
        assert follower.finish() == 143, follower.text
        assert processes_of_job(job_id) == []
        assert len(iap.tunnels()) >= before + 6  # the follower's, stacks' and stop's connections to both workers


def test_iap_without_gcloud_on_path_is_one_line(home, tpu_api, lab, job_file):
    create("inside", "v4-16", "--internal-ips")
    without_gcloud = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    result = podrun("exec", spec_on(job_file, "name: inside, iap: true", "echo ok"), env=without_gcloud)
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr) == [
        "podrun: error: target.tpu.iap (--tunnel-through-iap): an IAP tunnel is opened by the gcloud CLI (`gcloud compute "
        "start-iap-tunnel`), which is not on PATH; install the Google Cloud CLI "
        "(https://cloud.google.com/sdk/docs/install) and `gcloud auth login`"]


def test_without_a_way_in_podrun_tries_the_internal_ips_and_a_failure_names_the_ways_on(home, tpu_api, lab, job_file):
    create("inside", "v4-16", "--internal-ips")
    spec = spec_on(job_file, "name: inside", "echo ok")
    with direct_packets_dropped(lab.hosts[:2]):
        result = podrun("exec", spec)
    assert result.returncode == 1
    lines = stderr_lines_without_traceback(result.stderr)
    ways = ("through IAP (target.tpu.iap: true, or --tunnel-through-iap) or a bastion (ssh.proxy_jump or "
            "ssh.proxy_command), or run podrun on a host inside the VPC (a supervisor host there, or over a VPN)")
    assert lines[0] == (f"podrun: TPU VM inside has no external IPs: connecting to internal IPs {lab.hosts[0].ip}, "
                        f"{lab.hosts[1].ip}, which only a machine in its VPC network (or on a VPN to it) reaches; from "
                        f"there, set target.tpu.internal_ip: true; from elsewhere, go {ways}")
    assert lines[-3] == "podrun: error: 2 of 2 workers failed to connect:"
    assert lines[-2:] == [f"  {host.ip}: no answer within 10s (host down or unreachable?); {host.ip} is an internal IP of "
                         f"a TPU VM, which only its VPC network reaches: from elsewhere, go {ways}"
                         for host in lab.hosts[:2]]


def test_a_tpu_with_internal_ips_only_runs_through_a_bastion_named_by_proxy_command(home, tpu_api, lab, job_file):
    create("inside", "v4-16", "--internal-ips")
    bastion = lab.hosts[BASTION]
    jump = (f"ssh -W %h:%p -i {lab.client_key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
            f"-o LogLevel=ERROR root@{bastion.ip}")
    spec = spec_on(job_file, "name: inside", "echo from $(hostname) as worker $PODRUN_WORKER",
                   ssh=f'user: root, proxy_command: "{jump}"')
    with direct_packets_dropped(lab.hosts[:2]):
        result = podrun("exec", spec, "--no-collapse")
    assert result.returncode == 0, result.stderr
    assert "[w0] from podrun-lab0 as worker 0" in result.stdout
    assert "[w1] from podrun-lab1 as worker 1" in result.stdout
    assert "no external IPs" not in result.stderr


# --- the organization policy: constraints/compute.vmExternalIpAccess

def refusal(what: str) -> str:
    return (f"podrun: error: {what}: the organization policy {EXTERNAL_IP_CONSTRAINT} of project {PROJECT} allows no VM an "
            f"external IP; create it with internal IPs only (`podrun create ... --internal-ips`, or "
            f"target.tpu.internal_ip: true) and reach its workers through IAP (target.tpu.iap: true, or "
            f"--tunnel-through-iap) or a bastion (ssh.proxy_jump or ssh.proxy_command), or run podrun on a host "
            f"inside the VPC (a supervisor host there, or over a VPN); podrun left nothing of it in the API")


@pytest.mark.parametrize("how", ["direct", "queued"])
def test_a_create_with_external_ips_under_the_policy_is_one_line_and_leaves_nothing(home, tpu_api, lab, how):
    tpu_api.external_ips_denied_projects.add(PROJECT)
    flags = ["--queued"] if how == "queued" else []
    refused = podrun("create", "v4-16", "--name", "outside", *flags)
    assert refused.returncode == 1
    said = [line for line in stderr_lines_without_traceback(refused.stderr)
            if not line.startswith(("podrun: creating ", "podrun: waiting for"))]
    what = "queued resource outside FAILED" if how == "queued" else "creating TPU VM outside"
    assert said == [refusal(what)]
    assert left_in_api(tpu_api) == ([], [])

    inside = podrun("create", "v4-16", "--name", "inside", "--internal-ips", *flags)
    assert inside.returncode == 0, inside.stderr


def test_exec_creating_its_tpu_under_the_policy_is_the_same_line_and_then_runs_through_iap(
        home, tpu_api, lab, job_file, iap):
    tpu_api.external_ips_denied_projects.add(PROJECT)
    refused = podrun("exec", spec_on(job_file, "name: pod, accelerator_type: v4-16", "echo ok"))
    assert refused.returncode == 1
    assert refusal("creating TPU VM pod") in stderr_lines_without_traceback(refused.stderr)
    assert left_in_api(tpu_api) == ([], [])

    spec = spec_on(job_file, "name: pod, accelerator_type: v4-16, internal_ip: true, iap: true",
                   "echo hello from $PODRUN_WORKER")
    created = podrun("exec", spec, "--no-collapse")  # the lab checks a new VM's sshd from here: no drop yet
    assert created.returncode == 0, created.stderr
    assert "[w1] hello from 1" in created.stdout and len(iap.tunnels()) == 2
    with direct_packets_dropped(lab.hosts[:2]):
        again = podrun("exec", spec, "--no-collapse")
    assert again.returncode == 0, again.stderr
    assert "[w1] hello from 1" in again.stdout and len(iap.tunnels()) == 4


@pytest.mark.gcloud
def test_the_real_gcloud_is_refused_external_ips_under_the_policy_as_google_refuses_them(home, tpu_api, lab):
    tpu_api.external_ips_denied_projects.add(PROJECT)
    made = gcloud("create", "outside", "--accelerator-type=v4-16", "--version=tpu-ubuntu2204-base")
    assert made.returncode == 1
    assert f"Constraint {EXTERNAL_IP_CONSTRAINT} violated for project" in made.stderr, made.stderr
    listed = gcloud("list")
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    inside = gcloud("create", "inside", "--accelerator-type=v4-16", "--version=tpu-ubuntu2204-base", "--internal-ips")
    assert inside.returncode == 0, inside.stderr
    assert [node["name"].rsplit("/", 1)[1] for node in json.loads(gcloud("list").stdout)] == ["inside"]


@pytest.mark.gcloud
def test_the_real_gcloud_takes_the_tunnel_podrun_records_and_the_stand_in_refuses_what_it_refuses(
        home, tpu_api, lab, iap, job_file):
    create("inside", "v4-16", "--internal-ips")
    ran = podrun("exec", spec_on(job_file, "name: inside, iap: true", "echo ok"))
    assert ran.returncode == 0, ran.stderr
    recorded = iap.tunnels()[0]
    real = os.environ["PODRUN_TEST_REAL_GCLOUD"]
    # the real gcloud parses every word and goes on to connect (to a closed port here: nothing leaves 127.0.0.1)
    parsed = subprocess.run([real, *recorded, "--iap-tunnel-url-override=ws://127.0.0.1:9"], capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert "Error while connecting" in parsed.stderr and "unrecognized" not in parsed.stderr, parsed.stderr
    stand_in = [sys.executable, str(REPO / "tests" / "gcloud_iap_stand_in.py")]
    for words, error in ((["--bogus"], "unrecognized arguments: --bogus"),):
        for gcloud_cli in ([real], stand_in):
            answer = subprocess.run([*gcloud_cli, *recorded, *words], capture_output=True, text=True, timeout=60,
                                    stdin=subprocess.DEVNULL)
            assert answer.returncode == 2 and error in answer.stderr, (gcloud_cli, answer.stderr)
    instance = recorded[2]
    for words, error in (([instance, "2222", "--listen-on-stdin", f"--project={PROJECT}", f"--zone={ZONE}"],
                          "failed to connect to backend"),
                         ([instance, "22", f"--project={PROJECT}", f"--zone={ZONE}"], "--listen-on-stdin"),
                         ([instance, "22", "--listen-on-stdin", f"--project={PROJECT}"], "Specify the [--zone] flag"),
                         ([instance, "22", "--listen-on-stdin", f"--zone={ZONE}"], "[project]"),
                         (["t1v-n-00000000-w-0", "22", "--listen-on-stdin", f"--project={PROJECT}", f"--zone={ZONE}"],
                          "Failed to lookup instance")):
        answer = subprocess.run([*stand_in, "compute", "start-iap-tunnel", *words], capture_output=True, text=True,
                                timeout=60, stdin=subprocess.DEVNULL)
        assert answer.returncode == 1 and error in answer.stderr, (words, answer.stderr)
