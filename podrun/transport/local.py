"""A local worker's transport: a process tree on this machine, in its own session, rooted in the
worker's own directory."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import cast

from podrun import file_limit, paths
from podrun.transport.base import CACHE_DIR, Channel, Transport, loop_gate

# Processes spawned at once. A spawn (fork and exec) holds the event loop: 1,024 workers' starts, all
# ready at once, ran as one turn of the loop, 12-15 s on a loaded 2-core machine, during which no
# heartbeat went out, and agents that heard nothing for 20 s gave up (docs/benchmarks.md, Pod scale).
# Through this gate each turn spawns a few, and the loop's timers and pipes are served in between.
SPAWNS_AT_ONCE = 4
# which of the variables a local worker inherits --dry-run shows: those that pick its python and torchrun
INHERITED_SHOWN = ("PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")


class LocalTransport(Transport):
    """A local CPU worker: a process tree on this machine, rooted in its own directory."""

    def __init__(self, root: str):
        self.root = str(root)
        self.python = sys.executable

    async def connect(self) -> None:
        paths.make_private_dir(self.root)

    def endpoint(self) -> dict:
        return {"kind": "local", "root": self.root}

    def interactive(self, command: str | None, terminal: bool) -> tuple[list[str], str | None]:
        paths.make_private_dir(self.root)
        shell = os.environ.get("SHELL") or "/bin/sh"
        return ([shell, "-c", command] if command else [shell, "-i"] if terminal else [shell]), self.root

    def starting_environment(self) -> str:
        shown = [f"{key}={os.environ[key]}" for key in INHERITED_SHOWN if key in os.environ]
        others = len(os.environ) - len(shown)
        return f"podrun's own environment, inherited: {' '.join(shown)} and {others} more variables"

    def may_have(self, entry: str) -> bool:
        try:
            return any(found.startswith(entry + "-") for found in os.listdir(os.path.join(self.root, CACHE_DIR)))
        except OSError:
            return False

    async def start(self, command: str) -> Channel:
        async with loop_gate("local spawns", SPAWNS_AT_ONCE):
            process = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", file_limit.local_command(command), cwd=self.root,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)  # like a remote host: the terminal's Ctrl-C reaches podrun only
        return cast(Channel, process)  # all three pipes were asked for: none of its streams is None


def from_endpoint(endpoint: dict) -> LocalTransport:
    return LocalTransport(endpoint["root"])
