"""The agent started from the workers' cache on real SSH hosts (transport/base.py, BOOTSTRAP): what each
host received, counted on its side of the lab's bridge."""

from __future__ import annotations

import shutil

from podrun.transport.base import script_source

from helpers import device_sent_bytes, podrun
from lab import VETH_PREFIX


def received(hosts) -> list[int]:
    """Bytes the lab's bridge has sent to each of `hosts` so far: all the launcher sent it, handshake included."""
    return [device_sent_bytes(f"{VETH_PREFIX}{index}") for index in hosts]


def exec_received(lab, hosts, spec) -> list[int]:
    before = received(hosts)
    result = podrun("exec", spec, "--no-collapse")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [f"[w{worker}] ran {worker}" for worker in range(len(hosts))]
    return [after - earlier for after, earlier in zip(received(hosts), before)]


def test_a_second_exec_sends_no_agent_source_and_a_host_without_the_cache_gets_it(home, lab, hosts_spec):
    hosts = (0, 1)
    spec = hosts_spec("run: echo ran $PODRUN_WORKER", hosts=hosts)
    exec_received(lab, hosts, spec)  # the code shipped, the host keys trusted
    for index in hosts:
        shutil.rmtree(lab.hosts[index].home / ".podrun" / "cache")
    agent_source = len(script_source("agent"))

    cold = exec_received(lab, hosts, spec)
    assert all(sent > agent_source for sent in cold), cold
    assert all(list((lab.hosts[index].home / ".podrun" / "cache").glob("agent-*.v2")) for index in hosts)
    warm = exec_received(lab, hosts, spec)
    # everything else (handshake, step, heartbeats) is the same, and far less than the source
    assert all(sent < min(agent_source / 2, cold_sent - agent_source) for sent, cold_sent in zip(warm, cold)), (
        warm, cold)
