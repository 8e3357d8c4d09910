"""The agent's watch of the VM's own notice (remote/vm_notice.py) against the metadata stand-in on
127.0.0.1: each value read, then waited on for its change, as the GCE metadata server serves them."""

from __future__ import annotations

import threading

import pytest
from metadata_stand_in import MetadataStandIn

from podrun.remote import vm_notice
from podrun.remote.agent_io import Poller


@pytest.fixture
def server():
    stand_in = MetadataStandIn()
    address = stand_in.serve("127.0.0.1")
    yield stand_in, address
    stand_in.shutdown()


def first_notice(notices: vm_notice.Notices, poller: Poller, timeout: float = 10) -> str | None:
    """Pump the watches as the agent's poll loop does, until one announces (or `timeout` passes)."""
    while notices.watches:
        ready = poller.poll(timeout)
        if not ready:
            return None
        for _, fd in ready:
            if reason := notices.ready(fd):
                return reason
    return None


@pytest.mark.parametrize("key, value, reason", [
    ("preempted", "TRUE", "the VM announced its preemption"),
    ("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE",
     "the VM announced a maintenance event (TERMINATE_ON_HOST_MAINTENANCE)"),
])
def test_a_change_of_either_value_is_the_notice(server, key, value, reason):
    stand_in, address = server
    notices, poller = vm_notice.Notices({"GCE_METADATA_HOST": address}), Poller()
    notices.attach(poller)
    threading.Thread(target=lambda: (wait_for_waiters(stand_in), stand_in.set(key, value)), daemon=True).start()
    assert first_notice(notices, poller) == reason


def test_a_value_that_says_so_already_is_the_notice_at_once(server):
    stand_in, address = server
    stand_in.set("preempted", "TRUE")
    notices, poller = vm_notice.Notices({"GCE_METADATA_HOST": address}), Poller()
    notices.attach(poller)
    assert first_notice(notices, poller) == "the VM announced its preemption"


def test_no_metadata_server_ends_the_watch_quietly():
    notices, poller = vm_notice.Notices({"GCE_METADATA_HOST": "127.0.0.1:9"}), Poller()  # nothing listens
    notices.attach(poller)
    assert notices.watches == {}


def test_a_chunked_answer_is_read_whole():
    assert vm_notice._unchunked(b"2\r\nTR\r\n2;ext=1\r\nUE\r\n0\r\n\r\n") == b"TRUE"


def wait_for_waiters(stand_in: MetadataStandIn) -> None:
    with stand_in.changed:
        stand_in.changed.wait_for(lambda: stand_in.waiting >= 2, 10)
