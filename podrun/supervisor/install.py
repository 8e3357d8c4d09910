"""podrun on the supervisor host: the configured one, or `podrun` on its login PATH, of this version."""

from __future__ import annotations

import asyncio
import shlex

from podrun import __version__
from podrun.errors import PodrunError
from podrun.transport.base import Transport


async def podrun_on_host(transport: Transport, host: str, configured: str | None) -> str:
    command = configured or "podrun"
    channel = await transport.start(f"sh -lc {shlex.quote(f'{shlex.quote(command)} --version')}")
    channel.stdin.write_eof()
    output, _, code = await asyncio.gather(channel.stdout.read(), channel.stderr.read(), channel.wait())
    found = output.decode(errors="replace").strip()
    if code != 0 or found != f"podrun {__version__}":
        raise PodrunError(f"supervisor {host}: supervisor.podrun: {command} is {found or 'missing'}, "
                          f"expected podrun {__version__}")
    return command
