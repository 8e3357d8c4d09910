"""The ssh-agent a control tree's relays sign in with: the launcher's own key, served from inside the
launcher on a private socket, and forwarded to each relay worker with its connection (transport/tree.py).

It holds only the key podrun signs in with (the spec's identity_file, else ssh's default keys), not the
rest of the user's agent, and it ends with the launcher: nothing to leave behind. A passphrase-protected
key (one only the user's ssh-agent can use) is forwarded from that agent instead (SSH_AUTH_SOCK).

The protocol is ssh-agent's (draft-miller-ssh-agent): a relay's OpenSSH client asks for the identities
(11, answered with 12) and for signatures (13, answered with 14); anything else is refused (5).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from podrun.errors import PodrunError

if TYPE_CHECKING:
    import asyncssh
else:
    from podrun.transport.ssh_library import asyncssh

REQUEST_IDENTITIES, IDENTITIES_ANSWER, SIGN_REQUEST, SIGN_RESPONSE, FAILURE = 11, 12, 13, 14, 5
RSA_SHA2_256, RSA_SHA2_512 = 2, 4  # a sign request's flags: which signature an RSA key makes
DEFAULT_KEYS = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")  # OpenSSH's, in the order it tries them
MAX_MESSAGE = 256 * 1024


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


class KeyAgent:
    """An ssh-agent in the launcher's event loop, for the keys given."""

    def __init__(self, keys: list[asyncssh.SSHKey]):
        self.keys = {key.public_data: key for key in keys}
        self.directory = tempfile.mkdtemp(prefix="podrun-agent-")
        self.path = str(Path(self.directory) / "agent.sock")
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._serve, self.path)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self.server:
            self.server.close()
            await self.server.wait_closed()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self.directory)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = struct.unpack(">I", await reader.readexactly(4))[0]
                if not 0 < size <= MAX_MESSAGE:
                    return
                writer.write(_string(self.answer(await reader.readexactly(size))))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def answer(self, message: bytes) -> bytes:
        """The reply to one request (its type byte and body)."""
        kind, body = message[0], message[1:]
        if kind == REQUEST_IDENTITIES:
            listed = b"".join(_string(blob) + _string(b"podrun") for blob in self.keys)
            return bytes([IDENTITIES_ANSWER]) + struct.pack(">I", len(self.keys)) + listed
        if kind == SIGN_REQUEST:
            try:
                blob, rest = _take_string(body)
                data, rest = _take_string(rest)
                flags = struct.unpack(">I", rest[:4])[0] if len(rest) >= 4 else 0
            except (ValueError, struct.error):
                return bytes([FAILURE])
            key = self.keys.get(blob)
            if key is None:
                return bytes([FAILURE])
            algorithm = key.sig_algorithms[0]
            if b"ssh-rsa" in key.sig_algorithms:
                algorithm = b"rsa-sha2-512" if flags & RSA_SHA2_512 else b"rsa-sha2-256" if flags & RSA_SHA2_256 \
                    else b"ssh-rsa"
            return bytes([SIGN_RESPONSE]) + _string(key.sign(data, algorithm))
        return bytes([FAILURE])


def _take_string(data: bytes) -> tuple[bytes, bytes]:
    size = struct.unpack(">I", data[:4])[0]
    if len(data) < 4 + size:
        raise ValueError("short string")
    return data[4:4 + size], data[4 + size:]


def readable_keys(identity_file: str | None) -> list[asyncssh.SSHKey] | None:
    """The keys podrun signs in with, read here; None where one is passphrase-protected (the user's agent has it)."""
    paths = [identity_file] if identity_file else [path for path in DEFAULT_KEYS if os.path.exists(os.path.expanduser(path))]
    keys = []
    for path in paths:
        try:
            keys.append(asyncssh.read_private_key(os.path.expanduser(path)))
        except (ValueError, asyncssh.KeyImportError):
            return None  # a passphrase: only the user's ssh-agent can sign with it
        except OSError as error:
            raise PodrunError(f"cannot read the SSH key {path}: {error.strerror or error}") from None
    return keys


async def agent_for(identity_file: str | None) -> tuple[str, KeyAgent | None]:
    """The socket of the agent to forward to relays, and the KeyAgent to close after (None: the user's agent)."""
    keys = readable_keys(identity_file)
    if keys:
        agent = KeyAgent(keys)
        await agent.start()
        return agent.path, agent
    if os.environ.get("SSH_AUTH_SOCK"):
        return os.environ["SSH_AUTH_SOCK"], None
    raise PodrunError("the control tree's relays need the key podrun signs in with: name it in ssh.identity_file, "
                      "or load it into ssh-agent (SSH_AUTH_SOCK); PODRUN_CONTROL_TREE=off connects to every worker "
                      "from here")
