"""Keys as users keep them: a passphrase-protected identity_file, loaded once into a real ssh-agent with
ssh-add, signs in through the agent; a key that cannot be used is one line saying why and what to do."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import podrun, stderr_lines_without_traceback, wait_until

PASSPHRASE = "correct horse"


@pytest.fixture
def protected_key(lab, tmp_path):
    """A passphrase-protected key that lab hosts 0-3 accept for root (as well as the lab's own key)."""
    key = tmp_path / "protected_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-C", "protected", "-f", str(key)], check=True)
    for index in range(4):
        lab.authorize(index, key.with_suffix(".pub").read_text())
    try:
        yield key
    finally:
        for index in range(4):
            lab.authorize(index)


@pytest.fixture
def agent(tmp_path, monkeypatch):
    """A real ssh-agent of the test's own, on SSH_AUTH_SOCK; `agent(key)` adds a key to it (its passphrase
    typed by SSH_ASKPASS, as a desktop's askpass would)."""
    socket = tmp_path / "agent.sock"
    process = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket)], stdout=subprocess.DEVNULL)
    wait_until(socket.exists, "ssh-agent's socket")
    monkeypatch.setenv("SSH_AUTH_SOCK", str(socket))
    askpass = tmp_path / "askpass"
    askpass.write_text(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
    askpass.chmod(0o700)

    def add(key: Path) -> None:
        subprocess.run(["ssh-add", str(key)], check=True, capture_output=True, stdin=subprocess.DEVNULL,
                       env={**os.environ, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force"})

    yield add
    process.kill()
    process.wait()


def spec_with_key(hosts_spec, lab, key: Path, through_bastion: bool) -> Path:
    spec = hosts_spec("run: hostname")
    jump = f"proxy_jump: root@{lab.hosts[3].ip}, " if through_bastion else ""
    spec.write_text(spec.read_text().replace(f"identity_file: {lab.client_key}", f"{jump}identity_file: {key}"))
    return spec


@pytest.mark.parametrize("through_bastion", [False, True])
def test_a_passphrase_protected_key_loaded_in_ssh_agent_signs_in(home, lab, hosts_spec, protected_key, agent,
                                                                 through_bastion):
    agent(protected_key)
    # no .pub beside it: the public half is read from the key file's own unencrypted header
    protected_key.with_suffix(".pub").unlink()
    spec = spec_with_key(hosts_spec, lab, protected_key, through_bastion)
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[w0] podrun-lab0", "[w1] podrun-lab1", "[w2] podrun-lab2"]


def test_a_protected_key_not_in_the_agent_is_one_line_saying_ssh_add(home, lab, hosts_spec, protected_key, agent):
    agent(lab.client_key)  # the agent holds another key, which the hosts would take: podrun offers only the spec's
    spec = spec_with_key(hosts_spec, lab, protected_key, through_bastion=False)
    result = podrun("exec", spec)
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        f"podrun: error: the SSH key {protected_key} is passphrase-protected and not loaded in ssh-agent: add it with "
        f"ssh-add {protected_key}")


def test_a_protected_key_without_an_agent_is_one_line_saying_how_to_start_one(home, lab, hosts_spec, protected_key,
                                                                              monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    spec = spec_with_key(hosts_spec, lab, protected_key, through_bastion=True)
    result = podrun("exec", spec)
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        f"podrun: error: the SSH key {protected_key} is passphrase-protected and no ssh-agent is running "
        f"(SSH_AUTH_SOCK is not set): start one and add the key to it, eval \"$(ssh-agent)\" && ssh-add {protected_key}")
