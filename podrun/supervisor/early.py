"""What the laptop remembers of each supervisor host it handed a job to (`remembered`: the podrun that
answered there, and how the laptop reached the host), and a handover begun with it before this podrun
has parsed its arguments and loaded the spec (both import pydantic): the supervisor's podrun starts (a
Python start and podrun's imports, ~0.15 s there) while this one does that (~0.15 s here).

The host comes from exec's --supervisor or the spec file's `supervisor.host`, read as plain YAML. The
connection and `podrun _supervise` are started, and the version wanted sent (greeting.py); nothing
else goes over it before the spec is checked. The handover takes it only if the checked spec hands
the job to the same host's same podrun, reached the same way (the same endpoint); else it is closed,
as it is when the spec is refused or anything fails here, and the handover goes as without it.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import TYPE_CHECKING

from podrun import jobstore, paths
from podrun.errors import PodrunError
from podrun.supervisor import greeting

if TYPE_CHECKING:  # loaded once a handover begins: a spec run here needs no SSH
    import asyncio

    from podrun.transport.base import Channel, Transport

REMEMBERED = "supervisor-podruns.json"  # in PODRUN_HOME: {"HOST CONFIGURED": what remembered() gives}


class Begun:
    """The connection to a supervisor host, with `podrun _supervise` started there and told the version wanted."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: Transport, route: tuple, podrun: str,
                 channel: Channel):
        self.loop = loop  # the connection's: the handover runs on it
        self.route = route  # (host, supervisor.podrun, endpoint) as remembered
        self.transport, self.podrun, self.channel = transport, podrun, channel
        self.taken = False  # by the handover, which closes it; else it is closed unused

    def serves(self, host: str, configured: str | None, endpoint: dict) -> bool:
        """Whether the checked spec hands its job to this host's podrun, reached this way."""
        return self.route == (host, configured, endpoint)

    def close(self) -> None:
        self.taken = True
        _close(self.loop, self.transport)


def begin(words: list[str]) -> Begun | None:
    """The handover begun to the host that exec's words (up to `--`) name, if this laptop knows its podrun."""
    host, configured = _named(words)
    known = remembered(host, configured) if host else None
    if host is None or known is None:
        return None
    import asyncio

    from podrun.transport import transport_for
    from podrun.transport.base import ChannelLost

    loop = asyncio.new_event_loop()
    transport = transport_for(known["endpoint"])
    try:
        channel = loop.run_until_complete(start(transport, known["podrun"], connect=True))
    except (PodrunError, ChannelLost, OSError):  # the handover says why, when it connects anew
        _close(loop, transport)
        return None
    return Begun(loop, transport, (host, configured, known["endpoint"]), known["podrun"], channel)


async def start(transport: Transport, podrun: str, connect: bool = False) -> Channel:
    """`podrun _supervise` started (the connection made first, if `connect`), told the version wanted."""
    from podrun.transport import past_login

    if connect:
        await transport.connect()
    from podrun.supervisor import warm

    channel = await transport.start(past_login.begun(warm.command(podrun, ["_supervise"])))
    channel.stdin.write(greeting.wanted_line())
    return channel


def _close(loop: asyncio.AbstractEventLoop, transport: Transport) -> None:
    from podrun.transport.base import ChannelLost

    with contextlib.suppress(PodrunError, ChannelLost, OSError):
        loop.run_until_complete(transport.close())
    loop.close()


def _named(words: list[str]) -> tuple[str | None, str | None]:
    """The supervisor host and supervisor.podrun that exec's words name (--supervisor, and the first word
    that is a file: the spec's supervisor:, read as plain YAML), before argparse and the spec load see them."""
    flag_host, spec_path = None, None
    for number, word in enumerate(words):
        if word == "--supervisor" and number + 1 < len(words):
            flag_host = words[number + 1]
        elif word.startswith("--supervisor="):
            flag_host = word.partition("=")[2]
        elif spec_path is None and not word.startswith("-") and os.path.isfile(word):
            spec_path = word
    supervisor: object = None
    if spec_path is not None:
        try:
            import yaml

            with open(spec_path) as file:
                fields = yaml.safe_load(file)
            supervisor = fields.get("supervisor") if isinstance(fields, dict) else None
        except (OSError, ValueError, RecursionError, yaml.YAMLError):  # load_spec says what is wrong with it
            pass
    host = flag_host or (supervisor.get("host") if isinstance(supervisor, dict) else None)
    configured = supervisor.get("podrun") if isinstance(supervisor, dict) else None
    return (host if isinstance(host, str) else None), (configured if isinstance(configured, str) else None)


def remembered(host: str, configured: str | None) -> dict | None:
    """What this laptop last found on `host` for `configured` (supervisor.podrun): {podrun: the path there of
    one of its version, endpoint: how it reached the host (Transport.endpoint())}; None if nothing."""
    known = _remembered().get(_key(host, configured))
    if isinstance(known, dict) and isinstance(known.get("podrun"), str) and isinstance(known.get("endpoint"), dict):
        return known
    return None


def remember(host: str, configured: str | None, podrun: str, endpoint: dict) -> None:
    known = _remembered()
    known[_key(host, configured)] = {"podrun": podrun, "endpoint": endpoint}
    paths.make_private_dir(paths.podrun_home())
    jobstore.write_json(os.path.join(paths.podrun_home(), REMEMBERED), known)


def _remembered() -> dict:
    try:
        with open(os.path.join(paths.podrun_home(), REMEMBERED)) as file:
            known = json.load(file)
    except (OSError, ValueError):  # none yet, or unreadable: it is found again
        return {}
    return known if isinstance(known, dict) else {}


def _key(host: str, configured: str | None) -> str:
    return f"{host} {configured or ''}"
