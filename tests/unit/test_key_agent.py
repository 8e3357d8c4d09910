"""The launcher's own ssh-agent for a control tree's relays (transport/key_agent.py), asked by asyncssh's agent
client as a relay's OpenSSH would ask it: its identities, and signatures that the keys' public halves verify."""

from __future__ import annotations

import asyncio
import subprocess

import asyncssh
import pytest

from podrun.transport import key_agent


@pytest.mark.parametrize("algorithm", ["ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256"])
def test_the_agent_lists_its_key_and_signs_what_the_public_key_verifies(algorithm):
    key = asyncssh.generate_private_key(algorithm)

    async def ask():
        agent = key_agent.KeyAgent([key])
        await agent.start()
        try:
            client = await asyncssh.connect_agent(agent.path)
            (listed,) = await client.get_keys()
            assert listed.public_data == key.public_data
            signature = await listed.sign_async(b"session id and request")  # asyncssh picks the algorithm (rsa-sha2-256/512)
            client.close()
            await client.wait_closed()
            return signature
        finally:
            await agent.close()

    signature = asyncio.run(ask())
    assert key.convert_to_public().verify(b"session id and request", signature)


def test_a_request_for_a_key_it_lacks_or_a_message_it_does_not_know_is_refused():
    agent = key_agent.KeyAgent([asyncssh.generate_private_key("ssh-ed25519")])
    other = asyncssh.generate_private_key("ssh-ed25519").public_data
    sign_other = bytes([key_agent.SIGN_REQUEST]) + key_agent._string(other) + key_agent._string(b"data") + b"\0\0\0\0"
    assert agent.answer(sign_other) == bytes([key_agent.FAILURE])
    assert agent.answer(bytes([17])) == bytes([key_agent.FAILURE])  # add an identity: not here
    assert agent.answer(bytes([key_agent.SIGN_REQUEST]) + b"\0\0\0\xff") == bytes([key_agent.FAILURE])  # truncated


def test_a_passphrase_protected_key_is_left_to_the_users_agent(tmp_path, monkeypatch):
    path = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(path)], check=True)
    assert key_agent.readable_keys(str(path)) is None
    monkeypatch.setenv("SSH_AUTH_SOCK", "/run/user-agent.sock")
    assert asyncio.run(key_agent.agent_for(str(path))) == ("/run/user-agent.sock", None)
    monkeypatch.delenv("SSH_AUTH_SOCK")
    with pytest.raises(key_agent.PodrunError, match="the control tree's relays need the key podrun signs in with"):
        asyncio.run(key_agent.agent_for(str(path)))
