"""Jump hosts: the hops to an SSH host, and one connection per hop per launcher, shared by every host
behind it.

The hops come from the spec's ssh.proxy_jump, else from ~/.ssh/config's ProxyJump for the host, as
OpenSSH reads them (`ssh -J` on the command line wins over the file; the first jump host's own
ProxyJump in the file is followed too). Each hop is connected to as a host of its own (transport/ssh.py:
its host key follows a worker's rules), through the hops before it. 1,000 workers behind one bastion
open one connection to it, not 1,000: the first worker to connect opens it, the others wait for that
one and open their channels on it (direct-tcpip, as `ssh -W` does), and the last to close closes it.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import weakref
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Protocol

USER_CONFIG = "~/.ssh/config"


def config_proxy_jump(host: str, port: int | None, user: str | None) -> str | None:
    """~/.ssh/config's ProxyJump for the host (as asyncssh and OpenSSH match Host and Match blocks), or None."""
    from podrun.transport.ssh_library import asyncssh

    path = Path(USER_CONFIG).expanduser()
    if not os.access(path, os.R_OK):
        return None
    config = asyncssh.config.SSHClientConfig.load(None, [path], False, False, False, getpass.getuser(),
                                                  user or (), host, port or ())
    value = config.get("ProxyJump")
    return value if isinstance(value, str) else None


def hops_of(proxy_jump: str) -> list[tuple[str | None, str, int | None]]:
    """(user, host, port) of each jump host, the first reached first; a malformed value from ~/.ssh/config
    is one line naming the file."""
    from podrun.spec.fields import parse_jumps  # loads pydantic: a handover connects before it (supervisor/early.py)

    try:
        return parse_jumps(proxy_jump)
    except ValueError as error:
        from podrun.errors import UsageError

        raise UsageError(f"{USER_CONFIG}: ProxyJump: {error}") from None


class HopTransport(Protocol):
    """What a hop is here: transport/ssh.py's SshTransport, to a jump host."""

    connection: Any  # asyncssh's SSHClientConnection once connected, else None

    @property
    def label(self) -> str: ...  # host[:port], for the errors of the hosts behind it

    async def connect(self) -> None: ...

    async def close(self) -> None: ...


class Hop:
    """A hop's connection, and how many transports go through it."""

    def __init__(self, key: Hashable, transport: HopTransport):
        self.key, self.transport = key, transport
        self.users = 0
        self.opened: asyncio.Future[None] = asyncio.ensure_future(transport.connect())
        # an opening nobody waits for any more (every worker failed or was cancelled) keeps its error to itself
        self.opened.add_done_callback(lambda future: future.cancelled() or future.exception())

    @property
    def usable(self) -> bool:
        """False once its opening failed, or its connection was lost since: a new user opens it again."""
        if not self.opened.done():
            return True
        if self.opened.cancelled() or self.opened.exception() is not None:
            return False
        connection = self.transport.connection
        return connection is not None and not connection.is_closed()


_open: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Hop]] = weakref.WeakKeyDictionary()


async def open_hop(key: Hashable, make: Callable[[], HopTransport]) -> Hop:
    """The hop known by `key`, connected: opened by the first caller (`make` builds its transport), shared by
    the others; each caller gives it back with close_hop()."""
    hops = _open.setdefault(asyncio.get_running_loop(), {})
    hop = hops.get(key)
    if hop is None or not hop.usable:
        hop = hops[key] = Hop(key, make())
    hop.users += 1
    try:
        await asyncio.shield(hop.opened)
    except BaseException:
        await close_hop(hop)
        raise
    return hop


async def close_hop(hop: Hop) -> None:
    """One user fewer; the last one closes the hop's connection (or stops its opening)."""
    hop.users -= 1
    if hop.users > 0:
        return
    hops = _open.get(asyncio.get_running_loop(), {})
    if hops.get(hop.key) is hop:
        del hops[hop.key]
    if not hop.opened.done():
        hop.opened.cancel()
    elif not hop.opened.cancelled() and hop.opened.exception() is None:
        await hop.transport.close()
