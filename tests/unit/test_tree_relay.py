"""The control tree's relay (remote/tree_relay.py) as a process of its own, started as a worker starts it (its
bootstrap, its source on stdin) and fed frames as the launcher feeds it (transport/tree.py), under this
interpreter and the workers' system Python. Its work over SSH is tested on the lab's hosts
(tests/ssh/test_control_tree.py)."""

from __future__ import annotations

import marshal
import os
import shutil
import subprocess
import sys

import pytest

from podrun.remote import tree_frames
from podrun.transport.base import script_command, script_source

PYTHONS = list(dict.fromkeys([sys.executable, *filter(None, [shutil.which("python3", path="/usr/bin")])]))


def frames_of(data: bytes) -> list[tuple[int, int, bytes]]:
    found, start = [], 0
    while start < len(data):
        kind, ident, size = tree_frames.HEADER.unpack_from(data, start)
        start += tree_frames.HEADER.size
        found.append((kind, ident, data[start:start + size]))
        start += size
    return found


@pytest.mark.parametrize("python", PYTHONS)
def test_a_relay_without_a_forwarded_agent_refuses_each_connection_in_one_frame_and_ends_with_its_input(python, tmp_path):
    environment = {key: value for key, value in os.environ.items() if key != "SSH_AUTH_SOCK"}
    request = marshal.dumps({"argv": ["--", "10.0.0.2"], "known": "", "check": "no"}, 4)
    opens = tree_frames.frame(tree_frames.OPEN, 7, request) + tree_frames.frame(tree_frames.OPEN, 9, request)
    ran = subprocess.run(script_command(python, "tree_relay"), shell=True, cwd=tmp_path, env=environment,
                         input=script_source("tree_relay") + opens, capture_output=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    refusal = b"the relay's sshd did not forward podrun's ssh-agent (AllowAgentForwarding no there?)"
    assert sorted(frames_of(ran.stdout)) == [(tree_frames.FAILED, 7, refusal), (tree_frames.FAILED, 9, refusal)]


def test_frames_split_what_they_carry_into_chunks_and_keep_it_whole():
    data = os.urandom(3 * tree_frames.CHUNK + 5)
    parts = frames_of(tree_frames.frames(tree_frames.INPUT, 4, data))
    assert [len(payload) for _, _, payload in parts] == [tree_frames.CHUNK] * 3 + [5]
    assert b"".join(payload for _, _, payload in parts) == data
