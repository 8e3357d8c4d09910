"""The rendezvous doctor's interface half (remote/interfaces.py, launch/preflight.py): where a worker's
hostname resolves to loopback, gloo and NCCL would advertise it, so podrun sets GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME to the interface that reaches MASTER_ADDR, unless the job chose one itself.

The lab's hosts map their own names to 127.0.0.1 (tests/lab.py), as many cloud images do."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from podrun.plan import LOOPBACK_CHECK
from podrun.remote.interfaces import route_interface

from helpers import REPO, podrun

SHOW_VARIABLES = 'echo "$0 gloo=$GLOO_SOCKET_IFNAME nccl=$NCCL_SOCKET_IFNAME"'


def shown(stdout: str, step: str) -> dict[int, str]:
    """What each worker's `step` printed of SHOW_VARIABLES."""
    return {int(worker): rest for worker, rest in re.findall(rf"^\[w(\d+)\] +{step} (.*)$", stdout, re.MULTILINE)}


@pytest.mark.slow
def test_hostnames_resolving_to_loopback_get_the_interface_to_master_addr_in_setup_and_run(home, lab, hosts_spec):
    spec = hosts_spec(f"setup: sh -c '{SHOW_VARIABLES}' setup\nrun: sh -c '{SHOW_VARIABLES}' run")
    result = podrun("exec", spec, "--no-collapse")
    assert result.returncode == 0, result.stderr
    for step in ("setup", "run"):
        assert shown(result.stdout, step) == {index: "gloo=eth0 nccl=eth0" for index in range(3)}
    ips = ", ".join(host.ip for host in lab.hosts[:3])
    assert (f"podrun: set GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME to eth0 on workers 0, 1, 2 ({ips}): the "
            f"interface of the route to MASTER_ADDR {lab.hosts[0].ip}, as the host name resolves to 127.0.0.1 there, "
            f"which gloo and NCCL would advertise to the other workers. To choose otherwise, set either variable in "
            f"the spec's env or with --env (then podrun sets neither)\n") in result.stderr


@pytest.mark.slow
def test_a_host_whose_name_resolves_to_its_address_is_left_alone(home, lab, hosts_spec):
    with lab.names_resolving_to_addresses([2]):
        result = podrun("exec", hosts_spec(f"run: sh -c '{SHOW_VARIABLES}' run"), "--no-collapse")
    assert result.returncode == 0, result.stderr
    assert shown(result.stdout, "run") == {0: "gloo=eth0 nccl=eth0", 1: "gloo=eth0 nccl=eth0", 2: "gloo= nccl="}
    assert f"on workers 0, 1 ({lab.hosts[0].ip}, {lab.hosts[1].ip})" in result.stderr


@pytest.mark.slow
def test_a_job_that_sets_either_variable_chooses_for_itself(home, lab, hosts_spec):
    result = podrun("exec", hosts_spec(f"run: sh -c '{SHOW_VARIABLES}' run\n"
                                       f"env: {{NCCL_SOCKET_IFNAME: '=eth0', PATH: /usr/bin:/bin}}"), "--no-collapse")
    assert result.returncode == 0, result.stderr
    assert shown(result.stdout, "run") == {index: "gloo= nccl==eth0" for index in range(3)}
    assert "SOCKET_IFNAME to" not in result.stderr


def test_local_workers_reach_each_other_on_loopback_and_get_nothing(home):
    result = podrun("exec", "--local", "2", "--no-collapse", "--", "sh", "-c", SHOW_VARIABLES, "run")
    assert result.returncode == 0, result.stderr
    assert shown(result.stdout, "run") == {0: "gloo= nccl=", 1: "gloo= nccl="}
    assert "SOCKET_IFNAME to" not in result.stderr


def test_dry_run_says_that_the_interface_is_chosen_at_start_unless_the_job_names_one(home, job_file):
    spec = job_file("target: {hosts: [10.1.0.7, 10.1.0.8]}\nrun: 'true'\n")
    note = LOOPBACK_CHECK + "\n"  # the shell's version of the agent's check (test_readme_promises.py runs it)
    plan = podrun("exec", spec, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.count(note) == 2
    mine = podrun("exec", spec, "--dry-run", "--env", "GLOO_SOCKET_IFNAME=eth1")
    assert note not in mine.stdout and mine.stdout.count("export GLOO_SOCKET_IFNAME=eth1\n") == 2


ROUTES = """\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
ens4\t00000000\t0100800A\t0003\t0\t0\t100\t00000000\t0\t0\t0
ens4\t0100800A\t00000000\t0005\t0\t0\t100\tFFFFFFFF\t0\t0\t0
eth1\t0000630A\t00000000\t0001\t0\t0\t0\t00F0FFFF\t0\t0\t0
slow\t0000630A\t00000000\t0001\t0\t0\t50\t00F0FFFF\t0\t0\t0
down\t0000630A\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0
"""


@pytest.mark.parametrize("address, interface", [
    ("10.99.0.12", "eth1"),  # the most specific route that is up, of the lowest metric
    ("10.128.0.5", "ens4"),  # a /32 address (GCE): the default route's
    ("10.128.0.1", "ens4"),
    ("fe80::1", ""),  # IPv6: not looked up
    ("not-an-ip", ""),
])
def test_the_interface_is_the_most_specific_route_up(tmp_path, address, interface):
    table = tmp_path / "route"
    table.write_text(ROUTES)
    assert route_interface(address, str(table)) == interface


def test_the_probe_resolves_the_host_name_without_loading_pythons_idna_codec():
    """A str host name goes through the idna codec, whose import (re, enum, stringprep) was 80% of the
    probe on every worker: 10 ms of a 12 ms probe on the lab. The probe runs as the agent runs: -I -S."""
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import interfaces; "
             "report = interfaces.check('127.0.0.1', {}); "
             "print(report['resolves_to'] != '' and 'encodings.idna' not in sys.modules and 're' not in sys.modules)")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(REPO / "podrun" / "remote")],
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "True", result.stdout + result.stderr
