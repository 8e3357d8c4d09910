"""The control tree on real lab hosts: with PODRUN_CONTROL_TREE=2 and a fanout of 2, worker 0 is the relay
of workers 1 and 2, and worker 3 a relay with none behind it (launch/control_tree.py). The fault matrix
(test_fault_matrix.py) runs once more through the same tree."""

from __future__ import annotations

import json
import re

import pytest

from helpers import Background, job_id_in, podrun, ps_on_every_host, stderr_lines_without_traceback, wait_until
from lab import BRIDGE_IP

HOSTS = (0, 1, 2, 3)
HEARTBEAT_TIMEOUT_S = 20


@pytest.fixture(autouse=True)
def tree(monkeypatch):
    monkeypatch.setenv("PODRUN_CONTROL_TREE", "2")
    monkeypatch.setenv("PODRUN_CONTROL_TREE_FANOUT", "2")


def test_workers_behind_a_relay_are_reached_from_it_and_run_as_any_other(home, lab, hosts_spec):
    result = podrun("exec", "--no-collapse", hosts_spec('run: echo "from ${SSH_CONNECTION%% *} as $PODRUN_WORKER"',
                                                        hosts=HOSTS))
    assert result.returncode == 0, result.stderr
    # the SSH connection a worker's command came in on: the launcher's (the lab's bridge) or its relay's
    reached_from = dict(re.findall(r"^\[w(\d)\] from (\S+) as \1$", result.stdout, re.M))
    assert reached_from == {"0": BRIDGE_IP, "1": lab.hosts[0].ip, "2": lab.hosts[0].ip, "3": BRIDGE_IP}
    assert "podrun: reaching the workers (through 2 relay workers: 0, 3; PODRUN_CONTROL_TREE)" in result.stderr
    job_id = job_id_in(result.stderr)
    for index in HOSTS:
        assert (home / "jobs" / job_id / f"w{index}.log").read_text() == f"from {reached_from[str(index)]} as {index}\n"
    # host keys first seen from a relay are kept in podrun's file, as the launcher's own first contacts are
    known = (home / "known_hosts").read_text()
    assert all(f"{lab.hosts[index].ip} ssh-ed25519 " in known for index in HOSTS)


def test_a_relay_lost_is_a_lost_worker_for_each_worker_behind_it_named(home, lab, hosts_spec):
    job = Background("exec", "--no-collapse", hosts_spec('run: echo "up $PODRUN_WORKER"; exec sleep 300', hosts=HOSTS))
    for index in HOSTS:
        job.wait_for(rf"^\[w{index}\] up {index}$")
    job_id = job_id_in(job.text)
    lab.run(0, "pkill -KILL -f tree_relay")
    assert job.finish(timeout=60) == 255
    relay = f"its relay, worker 0 ({lab.hosts[0].ip}), was lost"
    for index in (1, 2):
        assert f"worker {index} ({lab.hosts[index].ip}) lost its connection ({relay}: the relay process ended)" in job.text
    wait_until(lambda: ps_on_every_host(lab, job_id) == [], "every worker to stop", timeout=HEARTBEAT_TIMEOUT_S + 10)


def test_a_changed_host_key_behind_a_relay_is_refused_naming_the_host(home, lab, hosts_spec):
    spec = hosts_spec("run: 'true'", hosts=HOSTS)
    assert podrun("exec", spec).returncode == 0  # every host key is now on record
    lab.renew_host_key(2)
    result = podrun("exec", spec)
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        f"podrun: error: {lab.hosts[2].ip}: cannot connect through relay worker 0 ({lab.hosts[0].ip}): "
        f"Host key verification failed.")
    assert not (lab.hosts[2].home / ".podrun" / "jobs" / job_id_in(result.stderr)).exists()


def test_a_bad_tree_setting_is_one_line_before_anything_starts(home, lab, hosts_spec, monkeypatch):
    monkeypatch.setenv("PODRUN_CONTROL_TREE_FANOUT", "many")
    result = podrun("exec", hosts_spec("run: 'true'", hosts=HOSTS))
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr) == [
        "podrun: error: PODRUN_CONTROL_TREE_FANOUT='many': expected how many workers each relay worker connects to, "
        "1 to 1024 (default 32)"]
    assert json.loads(podrun("jobs", "--json").stdout) == []


def test_a_relay_whose_sshd_forwards_no_agent_says_so_for_each_worker_behind_it(home, lab, hosts_spec):
    lab.set_sshd_extra("AllowAgentForwarding no\n")
    try:
        result = podrun("exec", hosts_spec("run: 'true'", hosts=HOSTS))
    finally:
        lab.set_sshd_extra("")
    assert result.returncode == 1
    assert (f"{lab.hosts[1].ip}: cannot connect through relay worker 0 ({lab.hosts[0].ip}): the relay's sshd did "
            f"not forward podrun's ssh-agent (AllowAgentForwarding no there?)") in result.stderr


def test_dry_run_names_the_relays_and_below_the_count_there_are_none(home, lab, hosts_spec, monkeypatch):
    spec = hosts_spec("run: 'true'", hosts=HOSTS)
    shown = podrun("exec", "--dry-run", spec)
    assert shown.returncode == 0, shown.stderr
    ips = ", ".join(lab.hosts[index].ip for index in HOSTS)
    assert f"# target: 4 SSH hosts: {ips} (through 2 relay workers: 0, 3; PODRUN_CONTROL_TREE)\n" in shown.stdout
    monkeypatch.setenv("PODRUN_CONTROL_TREE", "5")
    assert "relay" not in podrun("exec", "--dry-run", spec).stdout
