"""A Slurm node's transport: a worker's command runs as a job step on its node,
`srun --jobid=J --nodelist=NODE -N1 -n1 --overlap ... sh -c COMMAND`, started on the cluster's login
node through ONE SSH connection shared by every worker (a login node's sshd drops connections when
many open at once: MaxStartups), or as a process on this machine when there is no `login` (podrun
runs on the login node). The agents of a step are the exception: every worker's is a task of ONE
srun (slurm_step.py), and falls back to a step of its own where its node cannot reach the login node.

Either way the launcher talks to each worker's agent on a channel of its own, as on an SSH host, and
each worker's exit code is its own. The launcher never signals srun (a second SIGINT or SIGTERM to srun
within a second cancels the step): it stops a step with the agent's "stop" line, and when it closes
the channel, the agent reads end of input and stops its job (as over SSH).

LoginShell runs Slurm's own commands (salloc, squeue, scontrol, scancel) there too, for the target, over
the same SSH connection: one login per job.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import queue
import shlex
import subprocess
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from podrun.errors import PodrunError
from podrun.transport.base import Channel, SessionRefused, Transport, loop_gate, script_command
from podrun.transport.local import SPAWNS_AT_ONCE
from podrun.transport.loop_bridge import BridgedChannel, on_loop
from podrun.transport.slurm_step import Steps, srun_argv

CONTROL_TIMEOUT_S = 60  # one Slurm command on the login node (slurmctld answers in milliseconds)


def srun_command(job_id: str, node: str, command: str) -> str:
    """The shell line, run on the login node (or here), that runs `command` on `node` as a job step."""
    return shlex.join([*srun_argv(job_id, [node]), "/bin/sh", "-c", command])


class LoginLink:
    """The connection to the login node that every worker's channels (steps) go through: the login shell's
    one SSH connection, its channels used from the launch's loop (loop_bridge.py), or processes here when
    there is no `login`. `closes_shell`: a recorded job's link (from_endpoint), whose last close ends the
    connection; the target's stays open for its release (SlurmCluster.free)."""

    def __init__(self, shell: LoginShell, closes_shell: bool = False):
        self.shell, self.ssh = shell, shell.ssh
        self.closes_shell = closes_shell
        self.users = 0
        self.steps = Steps(self.start, SlurmTransport.python)  # the agents of a step, as one srun

    @property
    def label(self) -> str:
        return getattr(self.ssh, "label", "") if self.ssh else "this machine"

    async def open(self) -> None:
        self.users += 1
        if self.ssh is not None:
            await on_loop(self.shell.loop(), self.shell.connected())

    async def start(self, command: str) -> Channel:
        if self.ssh is not None:
            return await self.shell.bridged(self.shell.begin(command))
        async with loop_gate("local spawns", SPAWNS_AT_ONCE):  # a few at a time, as local workers (local.py)
            process = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", command, cwd=os.path.expanduser("~"),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)  # the terminal's Ctrl-C reaches podrun only, never srun
        return cast(Channel, process)

    def start_fanout_early(self) -> None:
        """The fanout of the first step's one srun (slurm_step.py) started now, its Python started and its
        source read while the allocation is asked for; the first batch of several nodes takes it."""
        if self.ssh is not None and self.steps.one_step:
            begun = self.shell.begin(*self.steps.fanout_start())
            self.steps.spare = lambda: self.shell.bridged(begun)

    async def close(self) -> None:
        self.users = max(0, self.users - 1)
        if self.users == 0 and self.closes_shell:
            await asyncio.to_thread(self.shell.close)


class SlurmTransport(Transport):
    """One node of a Slurm allocation: every command is a job step on it."""

    python = "python3"
    root = "~"  # the (shared) home: srun starts where it was started, the login user's home

    def __init__(self, link: LoginLink, login_endpoint: dict | None, job_id: str, node: str):
        self.link, self.login_endpoint = link, login_endpoint
        self.job_id, self.node = job_id, node

    async def connect(self) -> None:
        await self.link.open()

    async def start(self, command: str) -> Channel:
        def own_step() -> Awaitable[Channel]:
            return self.link.start(srun_command(self.job_id, self.node, command))

        if command in self.agent_starts():  # every worker's agent of a step: one srun (slurm_step.py)
            return await self.link.steps.join(self.job_id, self.node, command, self.link.users, own_step)
        return await own_step()

    async def close(self) -> None:
        await self.link.close()

    def agent_starts(self) -> tuple[str, str]:
        """The agent's two commands: from the worker's cache, and with its source (transport.base.BOOTSTRAP)."""
        return script_command(self.python, "agent", cached=True), script_command(self.python, "agent")

    def endpoint(self) -> dict:
        return {"kind": "slurm", "login": self.login_endpoint, "job_id": self.job_id, "node": self.node}

    def interactive(self, command: str | None, terminal: bool) -> tuple[list[str], str | None]:
        """srun with a terminal (--pty) on the node, run through OpenSSH on the login node, or here."""
        shell = ["/bin/sh", "-c", command] if command else ["/bin/bash", "-l"] if terminal else ["/bin/sh"]
        argv = [*srun_argv(self.job_id, [self.node], pty=terminal), *shell]
        if self.link.ssh is None:
            return argv, os.path.expanduser("~")
        return self.link.ssh.interactive(shlex.join(argv), terminal)

    def starting_environment(self) -> str:
        return (f"what srun gives a step on node {self.node} of Slurm job {self.job_id}: the environment of srun on "
                f"{self.link.label} (its PATH and HOME) and Slurm's SLURM_* variables")


_LINKS: dict[str, LoginLink] = {}


def from_endpoint(endpoint: dict) -> Transport:
    """A recorded Slurm worker's transport; workers of one login share its link."""
    login = endpoint.get("login")
    key = repr(sorted(login.items())) if login else ""
    link = _LINKS.get(key)
    if link is None:
        link = _LINKS[key] = LoginLink(LoginShell(_ssh_from(login) if login else None), closes_shell=True)
    return SlurmTransport(link, login, endpoint["job_id"], endpoint["node"])


def _ssh_from(login: dict) -> Transport:
    from podrun.transport import ssh  # asyncssh loads only with a login node

    return ssh.from_endpoint(login)


@dataclass(frozen=True)
class Completed:
    code: int
    stdout: str
    stderr: str

    def error_line(self) -> str:
        """What a failed Slurm command said, as one line."""
        lines = [line.strip() for line in (self.stderr or self.stdout).splitlines() if line.strip()]
        return "; ".join(lines[-3:]) or f"exit code {self.code}"


class Spawned:
    """A command started by LoginShell.spawn: its output's lines as they come (None after the last), its exit code."""

    def __init__(self) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.code: int | None = None
        self.process: subprocess.Popen | None = None


class LoginShell:
    """Runs Slurm's commands on the login node over one SSH connection kept open (in a thread with an
    event loop of its own, so that the target's synchronous steps can use it), or here. The workers'
    channels go over the same connection (LoginLink)."""

    def __init__(self, ssh: Transport | None):
        self.ssh = ssh
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self.owner = 0  # the pid whose thread runs the loop: a forked supervisor starts its own
        self.connecting: asyncio.Future | None = None  # the connection, once asked for (on the loop)
        self.sessions: Sessions | None = None  # the channels on it, and on the further connections they need
        self.lock = threading.Lock()

    @property
    def where(self) -> str:
        return getattr(self.ssh, "label", "the login node") if self.ssh else "this machine"

    def run(self, command: str, timeout_s: float = CONTROL_TIMEOUT_S) -> Completed:
        if self.ssh is None:
            try:
                done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=timeout_s,
                                      cwd=os.path.expanduser("~"), stdin=subprocess.DEVNULL, start_new_session=True)
            except subprocess.TimeoutExpired:
                raise PodrunError(f"{self.where}: no answer from `{command}` within {timeout_s:g}s") from None
            return Completed(done.returncode, done.stdout, done.stderr)
        return self.asked(command, timeout_s).result()

    def asked(self, command: str, timeout_s: float = CONTROL_TIMEOUT_S) -> concurrent.futures.Future[Completed]:
        """`command` started there now (the connection made first): its answer is the future's result."""
        return asyncio.run_coroutine_threadsafe(self._remote(command, timeout_s), self.loop())

    def loop(self) -> asyncio.AbstractEventLoop:
        """The connection's event loop, running in a thread of this process."""
        with self.lock:
            if self.event_loop is None or self.owner != os.getpid():
                self.event_loop = asyncio.new_event_loop()
                self.owner = os.getpid()
                self.connecting = None
                self.sessions = None  # a forked supervisor's: its parent's channels and connections are not its own
                threading.Thread(target=self.event_loop.run_forever, name="slurm-login", daemon=True).start()
            return self.event_loop

    async def connected(self) -> None:
        """On the loop: the connection made, once for every command at once (again after it broke)."""
        assert self.ssh is not None
        if self.connecting is None:
            self.connecting = asyncio.ensure_future(self.ssh.connect())
        try:
            await asyncio.shield(self.connecting)
        except Exception:
            self.connecting = None
            raise

    def begin(self, command: str, stdin: bytes = b"") -> concurrent.futures.Future[Channel]:
        """Start `command` there (`stdin` written to it) on the loop; its channel is the loop's (bridged())."""
        return asyncio.run_coroutine_threadsafe(self._started(command, stdin), self.loop())

    async def bridged(self, begun: concurrent.futures.Future[Channel]) -> Channel:
        """A channel begin() started, for the running loop's use."""
        return BridgedChannel(await asyncio.wrap_future(begun), self.loop())

    async def _started(self, command: str, stdin: bytes) -> Channel:
        assert self.ssh is not None
        await self.connected()
        if self.sessions is None:
            self.sessions = Sessions(self.ssh)
        channel = await self.sessions.start(command)
        if stdin:
            channel.stdin.write(stdin)
        return channel

    async def _remote(self, command: str, timeout_s: float) -> Completed:
        try:
            channel = await self._started(command, b"")
            channel.stdin.write_eof()
            out, err, code = await asyncio.wait_for(asyncio.gather(
                channel.stdout.read(), channel.stderr.read(), channel.wait()), timeout_s)
        except asyncio.TimeoutError:
            raise PodrunError(f"{self.where}: no answer from `{command}` within {timeout_s:g}s") from None
        except Exception as error:  # the connection broke: the next command connects again
            self.connecting = None
            raise PodrunError(f"{self.where}: `{command}` failed: {error}") from None
        return Completed(code, out.decode(errors="replace"), err.decode(errors="replace"))

    def spawn(self, command: str) -> Spawned:
        """Start `command` there and return at once: its output's lines (stdout and stderr) come as they are
        written (salloc, which returns only once its allocation is granted, says its job id first)."""
        spawned = Spawned()
        if self.ssh is None:
            process = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True, cwd=os.path.expanduser("~"),
                                       start_new_session=True)
            spawned.process = process

            def pump() -> None:
                assert process.stdout is not None
                for line in process.stdout:
                    spawned.lines.put(line.rstrip("\n"))
                spawned.code = process.wait()
                spawned.lines.put(None)

            threading.Thread(target=pump, name="slurm-spawned", daemon=True).start()
        else:
            asyncio.run_coroutine_threadsafe(self._spawn_remote(command, spawned), self.loop())
        return spawned

    async def _spawn_remote(self, command: str, spawned: Spawned) -> None:
        try:
            channel = await self._started(command + " 2>&1", b"")
            channel.stdin.write_eof()
            while line := await channel.stdout.readline():
                spawned.lines.put(line.decode(errors="replace").rstrip("\n"))
            spawned.code = await channel.wait()
        except Exception as error:  # the connection broke
            self.connecting = None
            spawned.lines.put(f"podrun: the link to {self.where} broke: {error}")
            spawned.code = 255
        spawned.lines.put(None)

    def close(self) -> None:
        if self.event_loop is not None and self.owner == os.getpid() and self.ssh is not None and self.connecting:
            self.connecting = None
            further, self.sessions = self.sessions.further if self.sessions else [], None
            for transport in [self.ssh, *further]:
                asyncio.run_coroutine_threadsafe(transport.close(), self.event_loop).result(timeout=10)


class Sessions:
    """The channels on the login node's connection: one past what its sshd allows on a connection
    (MaxSessions, 10 by default: a channel per node for `stacks`, `stop`, `logs -f`, or per-node steps)
    goes on a further connection, made then. The limit is learnt from the refusal, so none is assumed."""

    def __init__(self, first: Transport):
        self.first = first
        self.further: list[Transport] = []
        self.open: dict[Transport, int] = {first: 0}  # channels open on each connection
        self.most: dict[Transport, int] = {}  # for a connection that refused one more: how many it holds

    async def start(self, command: str) -> Channel:
        while True:
            transport = await self._with_room()
            self.open[transport] += 1
            try:
                channel = await transport.start(command)
            except SessionRefused:
                self.open[transport] -= 1
                if not self.open[transport]:  # refused with none open: not a limit on sessions
                    raise
                self.most[transport] = self.open[transport]
                continue
            except PodrunError:
                self.open[transport] -= 1
                if transport in self.further:  # broken: the next channel that needs one makes another
                    self.further.remove(transport)
                raise
            return _Counted(channel, functools.partial(self._ended, transport))

    async def _with_room(self) -> Transport:
        for transport in [self.first, *self.further]:
            if transport not in self.most or self.open[transport] < self.most[transport]:
                return transport
        transport = _ssh_from(self.first.endpoint())
        await transport.connect()
        self.further.append(transport)
        self.open[transport] = 0
        return transport

    def _ended(self, transport: Transport) -> None:
        self.open[transport] -= 1


class _Counted:
    """A channel that tells `ended` once, when its command's end was awaited."""

    def __init__(self, channel: Channel, ended: Callable[[], None]):
        self.channel, self.ended = channel, ended
        self.stdin, self.stdout, self.stderr = channel.stdin, channel.stdout, channel.stderr

    async def wait(self) -> int:
        try:
            return await self.channel.wait()
        finally:
            ended, self.ended = self.ended, lambda: None
            ended()
