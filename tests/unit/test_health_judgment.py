"""Preflight's judgment of what the workers reported (launch/health.py): which worker fails, and the one line
that names it. What the workers report is real in tests/local/test_preflight_health.py and
tests/ssh/test_preflight_hosts.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from podrun.errors import WorkersUnhealthy
from podrun.launch import health

GB = 2 ** 30  # as podrun shows sizes (output.size_text)
MB = 2 ** 20


def plans(count: int) -> list:
    return [SimpleNamespace(worker=SimpleNamespace(index=i, address=f"10.0.0.{i + 1}")) for i in range(count)]


def ring(count: int, rate, shifts=(1, 2)) -> list[dict]:
    """Each rank's report: the rate from each source, rate(source, rank)."""
    return [{"allreduce_s": 0.01, "received": {str((rank - shift) % count): rate((rank - shift) % count, rank)
                                               for shift in (shifts if count > 2 else (1,))}}
            for rank in range(count)]


def test_a_worker_slow_on_every_link_it_sends_on_is_named_and_not_its_receivers():
    reports = ring(4, lambda source, rank: 2 * MB if source == 2 else 1000 * MB)
    with pytest.raises(WorkersUnhealthy) as raised:
        health._judged_links(plans(4), reports, 16)
    assert raised.value.workers == [2]
    assert str(raised.value) == ("preflight: worker 2 (10.0.0.3) sent at 2.0 MB/s on the network, far below the "
                                 "median link's 1000.0 MB/s; nothing of the job ran")


def test_a_worker_slow_on_every_link_it_receives_on_is_named():
    with pytest.raises(WorkersUnhealthy) as raised:
        health._judged_links(plans(3), ring(3, lambda source, rank: MB if rank == 1 else 1000 * MB), 16)
    assert raised.value.workers == [1] and "worker 1 (10.0.0.2) received at 1.0 MB/s" in str(raised.value)


def test_one_slow_link_among_many_names_no_worker():
    one_slow = ring(4, lambda source, rank: MB / 2 if (source, rank) == (0, 1) else 1000 * MB)
    said = health._judged_links(plans(4), one_slow, 16)
    assert said == "; all-reduce of 16 MiB in 0.010s, each worker receiving at 512.0 KB/s to 1000.0 MB/s"


def test_two_workers_name_both_ends_of_their_slow_link():
    with pytest.raises(WorkersUnhealthy) as raised:
        health._judged_links(plans(2), ring(2, lambda source, rank: MB if source == 1 else 1000 * MB), 16)
    assert raised.value.workers == [0, 1]
    assert "worker 0 (10.0.0.1) received at" in str(raised.value) and "worker 1 (10.0.0.2) sent at" in str(raised.value)


def facts(python="3.11.7", free=100 * GB, **frameworks) -> dict:
    return {"python": python, "frameworks": frameworks, "free_bytes": free}


def test_the_versions_of_most_workers_are_right_and_the_others_named():
    failing: dict = {}
    health._versions(plans(3), [facts(torch="2.13.0"), facts(torch="2.13.0"), facts("3.10.12")], failing)
    assert failing == {2: ["has Python 3.10.12 (the others 3.11.7) and no torch (which the others have) in the job's "
                           "python3"]}


def test_with_two_workers_apart_worker_0s_versions_are_right():
    failing: dict = {}
    health._versions(plans(2), [facts(jax="0.10.2"), facts(jax="0.9.0")], failing)
    assert failing == {1: ["has jax 0.9.0 (the others 0.10.2) in the job's python3"]}


def test_a_worker_short_of_disk_is_named_with_what_it_has():
    failing: dict = {}
    health._disk(plans(2), [facts(), facts(free=3 * GB)], 10, failing)
    assert failing == {1: ["has 3.0 GB free where the job runs, below preflight.min_free_gb (10)"]}


def test_missing_gpus_and_busy_ones_are_named_against_what_promised_them():
    promised = {"kind": "GPU", "count": 8, "why": "torchrun.nproc_per_node"}
    found = [{**facts(), "devices": 8, "busy": []}, {**facts(), "devices": 4, "busy": []},
             {**facts(), "devices": 8, "busy": ["4242, python"]},
             {**facts(), "devices": None, "busy": [], "devices_error": "nvidia-smi: No such file or directory"}]
    failing: dict = {}
    health._devices(plans(4), found, promised, failing)
    assert failing == {1: ["has 4 of the 8 GPUs torchrun.nproc_per_node promises"],
                       2: ["has its GPUs in use (4242, python)"],
                       3: ["shows no GPUs (nvidia-smi: No such file or directory), of the 8 torchrun.nproc_per_node "
                           "promises"]}
