"""Code shipping through the relay tree: the launcher sends the code once, the workers pass it on
over their own network, and a worker the tree cannot reach still gets it, directly."""

from __future__ import annotations

import hashlib
import re

from helpers import BLOB_BYTES, bridge_sent_bytes, code_dirs, podrun, tree_listing, workdir_with_blob


def test_the_launcher_sends_the_code_once_and_every_worker_gets_an_identical_tree(home, lab, hosts_spec, monkeypatch):
    monkeypatch.setenv("PODRUN_RELAY_FANOUT", "1")  # a chain: w0 -> w1 -> w2 -> w3, relayed three deep
    spec = hosts_spec("run: ./tool.sh && sha256sum weights.bin", hosts=(0, 1, 2, 3))
    code = workdir_with_blob(spec)
    sent_before = bridge_sent_bytes()
    result = podrun("exec", "--no-collapse", spec)
    sent = bridge_sent_bytes() - sent_before
    assert result.returncode == 0, result.stderr
    assert "shipped code (4 files) to 4 workers" in result.stderr
    assert "not reached through the relay" not in result.stderr
    blob_hash = hashlib.sha256((code / "weights.bin").read_bytes()).hexdigest()
    for index in range(4):
        assert f"[w{index}] {blob_hash}  weights.bin" in result.stdout
    expected = tree_listing(code)
    for code_dir in code_dirs(lab, range(4), spec):
        assert tree_listing(code_dir) == expected
    # one copy of the blob leaves this machine, not four (plus SSH framing, agents, the check)
    assert BLOB_BYTES < sent < 1.5 * BLOB_BYTES, sent


def block_traffic_between_hosts(lab, to_index: int) -> None:
    """The other hosts lose their route to host `to_index`; this machine (the launcher) keeps it."""
    for host in lab.hosts:
        if host.index != to_index:
            lab.run(host.index, f"ip route add unreachable {lab.hosts[to_index].ip}/32")


def unblock_traffic_between_hosts(lab, to_index: int) -> None:
    for host in lab.hosts:
        if host.index != to_index:
            lab.run(host.index, f"ip route del unreachable {lab.hosts[to_index].ip}/32")


def test_a_worker_the_relay_cannot_reach_is_named_and_sent_the_code_directly(home, lab, hosts_spec):
    spec = hosts_spec("run: sha256sum weights.bin", hosts=(0, 1, 2, 3))
    code = workdir_with_blob(spec)
    block_traffic_between_hosts(lab, 2)
    try:
        result = podrun("exec", spec)
    finally:
        unblock_traffic_between_hosts(lab, 2)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "not reached through the relay" in line]
    assert len(notes) == 1, result.stderr
    assert re.fullmatch(
        rf"podrun: worker 2 \({lab.hosts[2].ip}\) was not reached through the relay \(the worker relaying the "
        rf"code to this one never connected; worker 0: cannot reach "
        rf"{lab.hosts[2].ip}:\d+ to relay to it: \[Errno 113\] No route to host\); sending it the code directly",
        notes[0]), notes[0]
    expected = tree_listing(code)
    for code_dir in code_dirs(lab, range(4), spec):
        assert tree_listing(code_dir) == expected


def test_a_relay_worker_that_fails_is_named_and_the_workers_behind_it_still_get_the_code(home, lab, hosts_spec,
                                                                                          monkeypatch):
    monkeypatch.setenv("PODRUN_RELAY_FANOUT", "1")  # w1 relays to w2, which relays to w3
    spec = hosts_spec("run: sha256sum weights.bin", hosts=(0, 1, 2, 3))
    code = workdir_with_blob(spec)
    blocker = lab.hosts[1].home / "podrun"
    backup = lab.hosts[1].home / "podrun.saved"
    if blocker.exists():
        blocker.rename(backup)
    blocker.write_text("not a directory: host 1 cannot unpack anything")
    try:
        result = podrun("exec", spec)
    finally:
        blocker.unlink()
        if backup.exists():
            backup.rename(blocker)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    relay_notes = [line for line in lines if "not reached through the relay" in line]
    assert [note.split(" was ")[0] for note in relay_notes] == [
        f"podrun: worker {i} ({lab.hosts[i].ip})" for i in (1, 2, 3)]
    assert "(receiving the code failed: Not a directory; worker 0: relaying to" in relay_notes[0]
    assert lines[-1] == (f"podrun: error: worker 1 ({lab.hosts[1].ip}): shipping code failed: "
                         f"receiving the code failed: Not a directory")
    expected = tree_listing(code)
    for code_dir in code_dirs(lab, (2, 3), spec):  # behind the failed relay, sent directly
        assert tree_listing(code_dir) == expected
    assert result.stdout == ""  # run started nowhere
