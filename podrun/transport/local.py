"""A local worker's transport: a process tree on this machine, in its own session, rooted in the
worker's own directory."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from typing import cast

from podrun import file_limit, paths
from podrun.transport import local_spawner
from podrun.transport.base import CACHE_DIR, Channel, Transport, loop_gate

# Processes spawned at once. A spawn (fork and exec) holds the event loop: 1,024 workers' starts, all
# ready at once, ran as one turn of the loop, 12-15 s on a loaded 2-core machine, during which no
# heartbeat went out, and agents that heard nothing for 20 s gave up (docs/benchmarks.md, Pod scale).
# Through this gate each turn spawns a few, and the loop's timers and pipes are served in between.
SPAWNS_AT_ONCE = 4
FORKED_SCRIPTS = ("agent", "relay_node")  # the worker-side scripts the fork server starts (start_script)
# which of the variables a local worker inherits --dry-run shows: those that pick its python and torchrun
INHERITED_SHOWN = ("PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")


class LocalTransport(Transport):
    """A local CPU worker: a process tree on this machine, rooted in its own directory. `compiled`: the
    directory of compiled worker-side scripts that all local workers share (targets/local.py)."""

    def __init__(self, root: str, compiled: str | None = None):
        self.root = str(root)
        self.compiled = compiled
        self.python = sys.executable

    async def connect(self) -> None:
        paths.make_private_dir(self.root)
        if self.compiled is not None:
            share_compiled(self.root, self.compiled)

    def path_here(self, relative: str) -> str:
        return os.path.join(self.root, relative)

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

    async def start_script(self, name: str, command: str) -> Channel:
        # the scripts every worker runs for every step go to the fork server; a verb's helpers (stop, logs,
        # stacks: one per worker per command) keep an interpreter of their own, and their name on its command line
        return await self.start(command, fork=name in FORKED_SCRIPTS)

    async def start(self, command: str, fork: bool = True) -> Channel:
        """`command` through /bin/sh, or (with `fork`, where it is a script_command) forked by the fork server."""
        script = local_spawner.script_in(command, self.python) if fork else None
        if script is not None and (server := local_spawner.server_for(self.python)) is not None:
            async with loop_gate("local forks", local_spawner.FORKS_IN_FLIGHT):  # a request each: the loop goes on
                return await server.spawn(self.root, *script)
        async with loop_gate("local spawns", SPAWNS_AT_ONCE):
            process = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", file_limit.local_command(command), cwd=self.root,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)  # like a remote host: the terminal's Ctrl-C reaches podrun only
        return cast(Channel, process)  # all three pipes were asked for: none of its streams is None


def share_compiled(root: str, compiled: str) -> None:
    """Make the worker's cache of compiled worker-side scripts (`.podrun/cache`, transport/base.py's
    BOOTSTRAP) a link to `compiled`, which every local worker shares. Each worker kept its own: on a fresh
    PODRUN_HOME every worker compiled the agent (139 KB) and the relay's receiver anew, 30-60 ms of CPU
    each, on the same cores (docs/benchmarks.md, Pod scale to 1,024 workers). An entry is keyed by its
    source's hash and written whole (a rename), so sharing one is as safe as each worker's own; a cache
    left by an older podrun is removed (it only costs a compile)."""
    link = os.path.join(root, ".podrun", "cache")
    if os.path.islink(link):
        return
    paths.make_private_dir(compiled)
    paths.make_private_dir(os.path.dirname(link))
    if os.path.isdir(link):
        shutil.rmtree(link, ignore_errors=True)
    try:
        os.symlink(compiled, link)
    except FileExistsError:  # another launch on the same workers made it first
        pass


def from_endpoint(endpoint: dict) -> LocalTransport:
    """A recorded worker, reached again (`podrun logs`, `stop`...): its scripts need no shared cache."""
    return LocalTransport(endpoint["root"])
