"""The key podrun signs in with, as OpenSSH chooses it: the spec's identity_file when it can be read,
else the key of ssh-agent's (SSH_AUTH_SOCK) whose public half is the file's, as users keep a
passphrase-protected key: loaded once into their agent with `ssh-add`. A key that cannot be used is
one line that says why and what to do. Each identity file is looked at once per launcher, however many
hosts it signs in to. ensure_key_pair gives a key's public line for a TPU VM, the pair made first where
gcloud would make one.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import struct
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from podrun.errors import PodrunError

if TYPE_CHECKING:
    import asyncssh
else:
    from podrun.transport.ssh_library import asyncssh

OPENSSH_PRIVATE_KEY = re.compile(rb"-----BEGIN OPENSSH PRIVATE KEY-----(.*?)-----END OPENSSH PRIVATE KEY-----", re.S)
OPENSSH_KEY_MAGIC = b"openssh-key-v1\0"

_chosen: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Future[dict]]] = \
    weakref.WeakKeyDictionary()


async def auth_options(identity_file: str | None) -> dict:
    """asyncssh.connect()'s options that sign in with `identity_file` (none: ssh's defaults, and the agent)."""
    if identity_file is None:
        return {}
    chosen = _chosen.setdefault(asyncio.get_running_loop(), {})
    if identity_file not in chosen:
        chosen[identity_file] = asyncio.ensure_future(_choose(os.path.expanduser(identity_file)))
    return await asyncio.shield(chosen[identity_file])


async def _choose(path: str) -> dict:
    try:
        asyncssh.read_private_key(path)
        return {"client_keys": [path]}  # the path, not the key read: asyncssh then finds a certificate beside it too
    except FileNotFoundError:
        raise PodrunError(f"ssh.identity_file {path} does not exist") from None
    except OSError as error:
        raise PodrunError(f"cannot read the SSH key {path}: {error.strerror or error}") from None
    except (ValueError, asyncssh.KeyImportError) as error:
        if not str(error).startswith("Passphrase"):
            raise PodrunError(f"cannot read the SSH key {path}: {error}") from None
    public = public_half(path)
    socket = os.environ.get("SSH_AUTH_SOCK", "")
    if not socket:
        raise PodrunError(f"the SSH key {path} is passphrase-protected and no ssh-agent is running (SSH_AUTH_SOCK is "
                          f"not set): start one and add the key to it, eval \"$(ssh-agent)\" && ssh-add {path}")
    if public is None:
        raise PodrunError(f"the SSH key {path} is passphrase-protected and podrun cannot tell which of ssh-agent's "
                          f"keys is its: write its public half next to it, ssh-keygen -y -f {path} > {path}.pub")
    try:
        agent = await asyncssh.connect_agent(socket)
        try:
            loaded = [key.public_data for key in await agent.get_keys()]
        finally:
            agent.close()
            await agent.wait_closed()
    except (OSError, asyncssh.Error, ValueError) as error:
        raise PodrunError(f"the SSH key {path} is passphrase-protected and ssh-agent at {socket} (SSH_AUTH_SOCK) "
                          f"does not answer ({error}): start one and add the key, eval \"$(ssh-agent)\" && "
                          f"ssh-add {path}") from None
    if public.public_data not in loaded:
        raise PodrunError(f"the SSH key {path} is passphrase-protected and not loaded in ssh-agent: add it with "
                          f"ssh-add {path}")
    # the file is passed, and skipped for its passphrase: asyncssh then offers the agent's key of that public half only
    return {"client_keys": [path], "ignore_encrypted": True, "agent_path": socket,
            "agent_identities": [public.public_data]}


def public_half(path: str) -> asyncssh.SSHKey | None:
    """The public key of the private key at `path`, without its passphrase: from `path`.pub, else from the
    unencrypted header of OpenSSH's own key format; None where neither has it (an encrypted PEM key)."""
    try:
        return asyncssh.read_public_key(f"{path}.pub")
    except (OSError, ValueError, asyncssh.KeyImportError):
        pass
    try:
        with open(path, "rb") as handle:
            found = OPENSSH_PRIVATE_KEY.search(handle.read())
        if not found:
            return None
        data = base64.b64decode(b"".join(found[1].split()))
        if not data.startswith(OPENSSH_KEY_MAGIC):
            return None
        offset = len(OPENSSH_KEY_MAGIC)
        for _ in range(3):  # cipher name, KDF name, KDF options
            offset += 4 + struct.unpack(">I", data[offset:offset + 4])[0]
        offset += 4  # the number of keys
        size = struct.unpack(">I", data[offset:offset + 4])[0]
        return asyncssh.public_key.decode_ssh_public_key(data[offset + 4:offset + 4 + size])
    except (OSError, ValueError, struct.error, asyncssh.KeyImportError):
        return None


def ensure_key_pair(path: Path, comment: str, create: bool) -> str:
    """The public key of the private key at `path` as an authorized_keys line; with `create`, an
    ed25519 key pair is made there first if there is none (as gcloud makes google_compute_engine)."""
    if not path.exists():
        if not create:
            raise PodrunError(f"ssh.identity_file {path} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = asyncssh.generate_private_key("ssh-ed25519", comment=comment)
        # created 0600, never readable by others for a moment (asyncssh's writer makes it 0644 first)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as error:
            raise PodrunError(f"cannot create the SSH key {path}: {error.strerror or error}") from None
        with os.fdopen(descriptor, "wb") as private:
            private.write(key.export_private_key())
        key.write_public_key(str(path) + ".pub")
    try:
        key = asyncssh.read_private_key(str(path))
    except (OSError, ValueError, asyncssh.KeyImportError) as error:
        public = public_half(str(path))  # passphrase-protected: its public half says the same
        if public is None:
            raise PodrunError(f"cannot read the SSH key {path}: {error}") from None
        key = public
    key_type, blob = key.export_public_key().decode().split()[:2]
    return f"{key_type} {blob} {comment}"

