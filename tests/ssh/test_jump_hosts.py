"""Hosts behind a jump host (a bastion): ssh.proxy_jump and ~/.ssh/config's ProxyJump, with the launcher's
own packets to the workers dropped (nft), so that the bastion is the only way there."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import (
    REPO,
    Background,
    create,
    dropped_from_launcher,
    job_id_in,
    new_ssh_connections,
    podrun,
    processes_of_job,
    ps_on_every_host,
    stderr_lines_without_traceback,
)
from lab import NETWORK

BASTION = 3  # the lab host that plays the bastion; the workers are hosts 0, 1 and 2
RANK_LINE = re.compile(r"^\[w(\d) r\d+\] rank (\d) world_size (\d) ")


def worker_ips(lab) -> list[str]:
    return [host.ip for host in lab.hosts[:3]]


def through_bastion(spec: Path, lab, user: str = "root") -> Path:
    spec.write_text(spec.read_text().replace("ssh: {", f"ssh: {{proxy_jump: '{user}@{lab.hosts[BASTION].ip}', ", 1))
    return spec


def other_key(lab) -> str:
    """A host key that is not the bastion's: "ssh-ed25519 AAAA..."."""
    return " ".join(lab.hosts[0].host_key().split()[:2])


@contextlib.contextmanager
def user_ssh_config(tmp_path: Path, monkeypatch, text: str):
    """A home of the test's own, whose ~/.ssh/config says `text` (podrun reads it as OpenSSH does)."""
    home = tmp_path / "user-home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(text)
    monkeypatch.setenv("HOME", str(home))
    yield home


@pytest.mark.slow
def test_torchrun_ddp_runs_through_a_bastion_never_seen_before_and_a_changed_bastion_key_is_refused(home, lab, tmp_path):
    spec = yaml.safe_load((REPO / "configs" / "ssh-hosts.yaml").read_text())
    spec["target"]["hosts"] = [host.ip for host in lab.hosts[:3]]  # the example's are lab site 0's
    spec["ssh"].update(identity_file=str(lab.client_key), proxy_jump=f"root@{lab.hosts[BASTION].ip}")
    spec["workdir"] = str(REPO / "examples" / "ddp")
    spec["env"]["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    path = tmp_path / "ddp-through-bastion.yaml"
    path.write_text(yaml.safe_dump(spec))
    bastion = lab.hosts[BASTION]
    with dropped_from_launcher(worker_ips(lab)), new_ssh_connections(lab, BASTION) as bastion_connections:
        result = podrun("exec", path, timeout=300)
        assert result.returncode == 0, result.stderr + result.stdout
        ranks = [RANK_LINE.match(line).groups() for line in result.stdout.splitlines() if RANK_LINE.match(line)]
        assert sorted(int(rank) for _, rank, _ in ranks) == list(range(6)), result.stdout
        assert bastion_connections() == 1  # three workers, one connection to their bastion
        known_hosts = home / "known_hosts"
        recorded = known_hosts.read_text().splitlines()
        assert f"{bastion.ip} {' '.join(bastion.host_key().split()[:2])}" in recorded  # trusted on first use
        assert {line.split()[0] for line in recorded} == {bastion.ip, *worker_ips(lab)}

        again = podrun("exec", path, timeout=300)  # checked, now that it is known: nothing new recorded
        assert again.returncode == 0, again.stderr
        assert known_hosts.read_text().splitlines() == recorded

        known_hosts.write_text("".join(f"{line}\n" for line in recorded if not line.startswith(f"{bastion.ip} "))
                               + f"{bastion.ip} {other_key(lab)}\n")
        refused = podrun("exec", path, timeout=60)
    assert refused.returncode == 1
    assert stderr_lines_without_traceback(refused.stderr)[-1] == (
        f"podrun: error: {bastion.ip} (jump host for {lab.hosts[0].ip}): host key changed since podrun first "
        f"connected (recorded in {known_hosts}); if the host was rebuilt, remove its line there")
    assert processes_of_job(job_id_in(result.stderr)) == []


@pytest.mark.parametrize("fault", ["bastion unreachable", "bastion does not resolve", "bastion refuses the key",
                                   "bastion key changed"])
def test_a_bastion_that_fails_is_one_line_naming_it_and_nothing_starts_anywhere(home, lab, hosts_spec, fault):
    spec = through_bastion(hosts_spec("run: echo started; sleep 300"), lab,
                           user="nobody" if fault == "bastion refuses the key" else "root")
    bastion, first = lab.hosts[BASTION].ip, lab.hosts[0].ip
    if fault == "bastion unreachable":
        bastion = str(ipaddress.ip_network(NETWORK)[9])  # in the lab's network, where no host answers
        spec.write_text(spec.read_text().replace(lab.hosts[BASTION].ip, bastion))
    if fault == "bastion does not resolve":
        bastion = "bastion.invalid"
        spec.write_text(spec.read_text().replace(lab.hosts[BASTION].ip, bastion))
    if fault == "bastion key changed":
        home.mkdir(parents=True, exist_ok=True)
        (home / "known_hosts").write_text(f"{bastion} {other_key(lab)}\n")
    expected = {
        "bastion unreachable": f"podrun: error: {bastion} (jump host for {first}): cannot connect: ",
        "bastion does not resolve": f"podrun: error: {bastion} (jump host for {first}): cannot connect: the name does "
                                    f"not resolve (",
        "bastion refuses the key": f"podrun: error: {bastion} (jump host for {first}): key refused for user nobody "
                                   f"(identity file: {lab.client_key})",
        "bastion key changed": f"podrun: error: {bastion} (jump host for {first}): host key changed since podrun "
                               f"first connected (recorded in {home / 'known_hosts'}); if the host was rebuilt, "
                               f"remove its line there",
    }[fault]
    jobs_before = [sorted((host.home / ".podrun" / "jobs").glob("*")) for host in lab.hosts]
    with dropped_from_launcher(worker_ips(lab)):
        started = time.monotonic()
        result = podrun("exec", spec, timeout=60)
        took_s = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    lines = stderr_lines_without_traceback(result.stderr)
    assert lines[-1].startswith(expected), lines
    assert len([line for line in lines if "jump host" in line]) == 1, lines  # said once, not once per worker
    assert took_s < 20
    assert "started" not in result.stdout
    assert [sorted((host.home / ".podrun" / "jobs").glob("*")) for host in lab.hosts] == jobs_before
    assert ps_on_every_host(lab, job_id_in(result.stderr)) == []


def test_a_malformed_proxy_jump_is_one_line_naming_the_field(home, tmp_path):
    for value, expected in (
            ("root@@bastion", "expected user@bastion[:port], several joined by commas (the first is reached first), "
                              "or none, got 'root@@bastion'"),
            ("bastion:70000", "expected user@bastion[:port], several joined by commas (the first is reached first), "
                              "or none, got 'bastion:70000'")):
        spec = tmp_path / "job.yaml"
        spec.write_text(f"target: {{hosts: [10.99.0.10]}}\nssh: {{proxy_jump: '{value}'}}\nrun: hostname\n")
        result = podrun("exec", spec)
        assert result.returncode == 2
        assert stderr_lines_without_traceback(result.stderr) == [f"podrun: error: {spec}: ssh.proxy_jump: {expected}"]
    spec.write_text("target: {hosts: [10.99.0.10]}\nssh: {proxy_jump: bastion, proxy_command: 'nc %h %p'}\nrun: hostname\n")
    result = podrun("validate", spec)
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr) == [
        f"podrun: error: {spec}: ssh: expected proxy_jump or proxy_command, not both: proxy_jump is OpenSSH's "
        f"ProxyCommand \"ssh -W %h:%p bastion\" with podrun's host-key rules for the bastion"]


@pytest.mark.parametrize("check_host_keys", [True, False])
def test_a_proxy_jump_in_ssh_config_follows_podruns_host_key_rules(home, lab, hosts_spec, tmp_path, monkeypatch,
                                                                   check_host_keys):
    bastion = lab.hosts[BASTION]
    config = f"Host {' '.join(worker_ips(lab))}\n  ProxyJump root@{bastion.ip}\n"
    spec = hosts_spec("run: hostname")
    if not check_host_keys:
        spec.write_text(spec.read_text().replace("ssh: {", "ssh: {check_host_keys: false, "))
    with user_ssh_config(tmp_path, monkeypatch, config) as user_home, dropped_from_launcher(worker_ips(lab)):
        result = podrun("exec", spec)
        assert result.returncode == 0, result.stderr
        assert sorted(result.stdout.splitlines()) == ["[w0] podrun-lab0", "[w1] podrun-lab1", "[w2] podrun-lab2"]
        if not check_host_keys:
            assert not (home / "known_hosts").exists()
            return
        assert f"{bastion.ip} {' '.join(bastion.host_key().split()[:2])}\n" in (home / "known_hosts").read_text()
        shell = podrun("ssh", spec, "--worker", "2", "--", "hostname")  # OpenSSH, with podrun's rules for the jump
        assert (shell.returncode, shell.stdout) == (0, "podrun-lab2\n"), shell.stderr
        # the user's own known_hosts are read as OpenSSH reads them: a key there that differs is refused
        (home / "known_hosts").unlink()
        (user_home / ".ssh" / "known_hosts").write_text(f"{bastion.ip} {other_key(lab)}\n")
        refused = podrun("exec", spec)
    assert refused.returncode == 1
    known = user_home / ".ssh" / "known_hosts"
    assert stderr_lines_without_traceback(refused.stderr)[-1] == (
        f"podrun: error: {bastion.ip} (jump host for {lab.hosts[0].ip}): host key differs from the one recorded for "
        f"it in {known} line 1; if the host was rebuilt, remove that record (ssh-keygen -R {bastion.ip} -f {known})")


def test_workers_behind_one_bastion_share_one_connection_opened_once_and_closed_by_the_last(home, lab):
    from podrun.spec.model import SshOptions
    from podrun.transport.ssh import host_transport

    ssh = SshOptions(user="root", identity_file=str(lab.client_key), proxy_jump=f"root@{lab.hosts[BASTION].ip}")
    # each worker three times over: nine connections at once, behind one bastion
    transports = [host_transport(ssh, None, ip, None) for ip in worker_ips(lab) * 3]

    async def connect_then_close_one_by_one():
        await asyncio.gather(*(transport.connect() for transport in transports))
        (hop,) = {id(transport.hop): transport.hop for transport in transports}.values()
        assert hop.users == len(transports)
        bastion_connection = hop.transport.connection
        for transport in transports[:-1]:
            await transport.close()
            assert not bastion_connection.is_closed()
        await transports[-1].close()
        assert bastion_connection.is_closed() and hop.users == 0

    with dropped_from_launcher(worker_ips(lab)), new_ssh_connections(lab, BASTION) as bastion_connections:
        asyncio.run(connect_then_close_one_by_one())
        assert bastion_connections() == 1


def test_a_detached_job_behind_a_bastion_is_followed_inspected_copied_to_and_stopped_the_same_way(home, lab, hosts_spec,
                                                                                              tmp_path):
    spec = through_bastion(hosts_spec('run: echo "up on $PODRUN_WORKER"; exec sleep 600'), lab)
    with dropped_from_launcher(worker_ips(lab)):
        started = podrun("exec", spec, "--detach")
        assert started.returncode == 0, started.stderr
        job_id = job_id_in(started.stderr)
        follower = Background("logs", job_id, "-f")
        follower.wait_for(r"up on 2$")
        stacks = podrun("stacks", job_id, "--all")
        assert stacks.returncode == 0, stacks.stderr
        assert f"── worker 2 ({lab.hosts[2].ip}) ──" in stacks.stdout and "sleep 600" in stacks.stdout
        (tmp_path / "notes.txt").write_text("through the bastion\n")
        copied = podrun("cp", spec, tmp_path / "notes.txt", ":jump-notes.txt")
        assert copied.returncode == 0, copied.stderr
        assert [(host.home / "jump-notes.txt").read_text() for host in lab.hosts[:3]] == ["through the bastion\n"] * 3
        stopped = podrun("stop", job_id)
        assert stopped.returncode == 0, stopped.stderr
        assert follower.finish() == 143
        assert ps_on_every_host(lab, job_id) == []
        shell = podrun("ssh", spec, "--worker", "1", "--", "hostname; exit 7")
        assert (shell.returncode, shell.stdout) == (7, "podrun-lab1\n"), shell.stderr
        bastion = lab.hosts[BASTION].ip
        recorded = (home / "known_hosts").read_text().splitlines()
        (home / "known_hosts").write_text("".join(f"{line}\n" for line in recorded if not line.startswith(f"{bastion} "))
                                          + f"{bastion} {other_key(lab)}\n")
        refused = podrun("ssh", spec, "--worker", "1", "--", "hostname")
    # OpenSSH's jump, run with podrun's known-hosts options, refuses the changed bastion itself
    assert refused.returncode == 255 and refused.stdout == ""
    assert f"Host key for {bastion} has changed" in refused.stderr or "Host key verification failed" in refused.stderr


def test_a_tpu_with_internal_ips_only_is_reached_through_a_bastion_in_its_vpc(home, tpu_api_on_lab, lab, job_file):
    key = Path(os.environ["HOME"]) / ".ssh" / "google_compute_engine"  # gcloud's key, which the bastion takes too
    key.parent.mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    lab.authorize(BASTION, key.with_suffix(".pub").read_text())  # the fixture gives every host its keys back
    create("inside", "v4-16", "--internal-ips")  # before the drop: the stand-in waits for its sshds from here
    spec = job_file(f"target: {{tpu: {{name: inside, internal_ip: true}}}}\n"
                    f"ssh: {{user: root, proxy_jump: 'root@{lab.hosts[BASTION].ip}'}}\n"
                    f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}\n"
                    f"run: echo from $(hostname)\ndelete_after: always\n")
    others = [host for host in lab.hosts if host.index != BASTION]
    with dropped_from_launcher([host.ip for host in others] + [host.external_ip for host in others]):
        result = podrun("exec", spec, timeout=180)
    assert result.returncode == 0, result.stderr
    assert sorted(line.split(" from ")[0] for line in result.stdout.splitlines()) == ["[w0]", "[w1]"], result.stdout
    assert processes_of_job(job_id_in(result.stderr)) == []


def test_a_slurm_login_node_is_reached_through_a_bastion(home, slurm_lab, job_file):
    bastion = slurm_lab.nodes[-1]  # a compute node, which the login node's network reaches, plays the bastion
    spec = job_file(f"target: {{slurm: {{login: {slurm_lab.login_address}, nodes: 2}}}}\n"
                    f"ssh: {{identity_file: {slurm_lab.client_key}, proxy_jump: 'root@{bastion.ip}'}}\n"
                    f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}\nrun: hostname\n")
    slurm_lab.cancel_all()
    try:
        with dropped_from_launcher([slurm_lab.login.ip]):
            result = podrun("exec", spec, timeout=120)
    finally:
        slurm_lab.cancel_all()
        slurm_lab.wait_until_idle()
    assert result.returncode == 0, result.stderr
    assert sorted(line.split()[0] for line in result.stdout.splitlines()) == ["[w0]", "[w1]"], result.stdout
    assert f"{bastion.ip} ssh-ed25519 " in (home / "known_hosts").read_text()


@pytest.mark.parametrize("where", ["spec", "~/.ssh/config"])
def test_a_proxy_command_carries_the_connection_from_the_spec_or_ssh_config(home, lab, hosts_spec, tmp_path, monkeypatch,
                                                                            where):
    bastion = lab.hosts[BASTION].ip
    # OpenSSH's own client as the proxy, as a user writes it; %h and %p are the worker's
    command = (f"ssh -i {lab.client_key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes "
               f"-W %h:%p root@{bastion}")
    spec = hosts_spec("run: hostname")
    if where == "spec":
        spec.write_text(spec.read_text().replace("ssh: {", f"ssh: {{proxy_command: '{command}', ", 1))
        config = ""
    else:
        config = f"Host {' '.join(worker_ips(lab))}\n  ProxyCommand {command}\n"
    with user_ssh_config(tmp_path, monkeypatch, config), dropped_from_launcher(worker_ips(lab)):
        result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[w0] podrun-lab0", "[w1] podrun-lab1", "[w2] podrun-lab2"]
    # the workers' keys, reached through the proxy, are trusted on first use as any worker's
    assert {line.split()[0] for line in (home / "known_hosts").read_text().splitlines()} == set(worker_ips(lab))


def test_a_supervisor_host_behind_the_bastion_reaches_the_workers_through_it_too(home, lab, hosts_spec, supervisor):
    bastion = lab.hosts[2]  # host 3 is the supervisor (conftest.SUPERVISOR_HOST), hosts 0 and 1 the workers
    spec = hosts_spec(supervisor.spec + 'run: echo "hello from worker $PODRUN_WORKER on $(hostname)"\n', hosts=(0, 1))
    spec.write_text(spec.read_text().replace("ssh: {", f"ssh: {{proxy_jump: 'root@{bastion.ip}', ", 1))
    cut_off = [lab.hosts[0].ip, lab.hosts[1].ip, supervisor.ip]
    with dropped_from_launcher(cut_off), new_ssh_connections(lab, 2) as bastion_connections:
        result = podrun("exec", spec, timeout=180)
        assert result.returncode == 0, result.stderr
        # the laptop's to the supervisor; the supervisor's launch to its workers (one for both); and its
        # follower's, a process of its own that outlives the launch (launch/kept.py): one for both too
        assert bastion_connections() == 3
    for worker in range(2):
        assert f"[w{worker}] hello from worker {worker} on podrun-lab{worker}" in result.stdout
    assert supervisor.record(job_id_in(result.stderr))["state"] == "succeeded"
    # the supervisor trusted the bastion on first use into its own podrun's file
    assert f"{bastion.ip} ssh-ed25519 " in (supervisor.home / ".podrun" / "known_hosts").read_text()


def test_a_malformed_proxy_jump_in_ssh_config_is_one_line_naming_the_file(home, tmp_path, monkeypatch, job_file):
    spec = job_file("target: {hosts: [10.99.0.10, 10.99.0.11]}\nrun: hostname\n")
    with user_ssh_config(tmp_path, monkeypatch, "Host 10.99.0.*\n  ProxyJump root@@bastion\n"):
        result = podrun("exec", spec)
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        "podrun: error: ~/.ssh/config: ProxyJump: expected user@bastion[:port], several joined by commas (the first "
        "is reached first), or none, got 'root@@bastion'")


def test_a_proxy_jump_pattern_that_matches_the_bastion_too_is_a_loop_said_at_once(home, tmp_path, monkeypatch, job_file):
    spec = job_file("target: {hosts: [10.99.0.11, 10.99.0.12]}\nrun: hostname\n")
    with user_ssh_config(tmp_path, monkeypatch, "Host 10.99.0.*\n  ProxyJump root@10.99.0.10\n"):
        result = podrun("exec", spec, timeout=60)  # it hung: the bastion waited for its own connection
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        "podrun: error: 10.99.0.10 (jump host for 10.99.0.11): jumphost loop via 10.99.0.10: its ProxyJump in "
        "~/.ssh/config leads back to it; give it `ProxyJump none` in a Host block of its own, before the pattern")
