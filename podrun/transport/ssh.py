"""SSH workers: one asyncssh connection per worker per job; every step is a channel on it.

asyncssh was chosen by measurement (scripts/bench_transports.py, `true` on 4/16/64 lab hosts over
fresh connections): asyncssh 0.11/0.23/0.77 s, paramiko with a thread per host 0.16/0.25/0.79 s,
OpenSSH clients 0.31/0.86/3.23 s (0.16/0.34/1.06 s with curve25519), and it fits the asyncio
launcher without a thread per host. It honours ~/.ssh/config (aliases, HostName, User, Port).

Host keys (known_hosts.py): a host that the user's known-hosts files or podrun's own know must present
a key they hold for it; one none knows is trusted the first time podrun sees it, and its key kept in
podrun's file (ssh.check_host_keys: false turns all this off).
A host is known by its address and port, or by its `host_key_alias` where it has one: a TPU worker
goes by gcloud's alias for it (targets/tpu.py), so a TPU VM made again on the same addresses is a
new host, not a changed one. Keys its owner published (`host_keys`: a TPU VM's guest attributes)
are trusted as they are, with no first use to trust.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import random
import re
import shlex
from typing import TYPE_CHECKING

import podrun.transport.known_hosts as known_hosts
from podrun import paths
from podrun.errors import PodrunError, UsageError
from podrun.transport import client_keys, hops
from podrun.transport.base import Channel, SessionRefused, Transport, loop_gate
from podrun.transport.ssh_channel import SshChannel, reason

if TYPE_CHECKING:
    import asyncssh

    from podrun.spec.model import SshOptions
else:
    from podrun.transport.ssh_library import asyncssh

CONNECT_TIMEOUT_S = 10
MAX_JUMP_HOSTS = 8  # more on the way to one host is a ProxyJump loop in ~/.ssh/config
# a dead link or host is noticed within 15 s: asyncssh sends a keepalive after 5 s of silence and
# gives up when the next timer finds COUNT_MAX of them unanswered, i.e. after 5 s x (2 + 1)
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT_MAX = 2
KEY_RETRY_INTERVAL_S = 2
# Handshakes in flight at once, over all of this launcher's connections (PODRUN_SSH_HANDSHAKES). An
# sshd drops connections not yet authenticated beyond its MaxStartups (default 10:30:100: beyond 10,
# 30% of new ones, rising to all at 100), so 1,000 at once to hosts behind one bastion, or to one
# sshd, get most of theirs dropped; a handshake is mostly the launcher's CPU (key exchange,
# signature), so more in flight than that buys nothing on hosts apart (docs/benchmarks.md).
DEFAULT_HANDSHAKES = 32
# A handshake that sshd dropped before authentication (MaxStartups) is tried again after a random
# pause of up to 0.1 s, doubling up to 5 s, for at most PODRUN_SSH_CONNECT_RETRY seconds.
DEFAULT_CONNECT_RETRY_S = 60.0
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
_DROPPED = (asyncssh.ConnectionLost, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
# AES-GCM is one OpenSSL call per packet (hardware AES); asyncssh's default first choice,
# chacha20-poly1305, is two. Measured: 9.7 GB/s against 3.8 GB/s for 32 KB packets here.
ENCRYPTION_ALGS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
                   "aes128-ctr", "aes256-ctr")


class SshTransport(Transport):
    python = "python3"
    root = "~"
    reusable = True

    def __init__(self, host: str, port: int | None, user: str | None, identity_file: str | None,
                 check_host_keys: bool, refused_retry_s: float = 0, host_key_alias: str | None = None,
                 host_keys: tuple[str, ...] = (), known_hosts_file: str | None = None,
                 proxy_command: str | None = None, proxy_jump: str | None = None, refused_advice: str = "",
                 unreachable_hint: str | None = None):
        self.host, self.port, self.user = host, port, user
        self.identity_file = identity_file
        self.check_host_keys = check_host_keys
        self.refused_retry_s = refused_retry_s  # a key that was just authorized may take this long to work
        self.host_key_alias = host_key_alias  # its name in the known-hosts file, in place of host:port
        self.host_keys = host_keys  # "ssh-ed25519 AAAA..." as its owner published them: trusted as they are
        self.known_hosts_file = known_hosts_file  # the spec's ssh.known_hosts, read with ~/.ssh/known_hosts
        # OpenSSH's ProxyCommand: its stdin and stdout carry the connection (%h, %p, %r, %% as OpenSSH expands them)
        self.proxy_command = proxy_command
        self.refused_advice = refused_advice  # why the key may be refused and what to do (OS Login's roles)
        self.unreachable_hint = unreachable_hint  # added where the host cannot be reached: the ways in (TPU internal IPs)
        # OpenSSH's ProxyJump (hops.py): "user@bastion:port,..." or "none"; unset: ~/.ssh/config's, as OpenSSH reads it
        self.proxy_jump = proxy_jump
        self.jump_host_for: str | None = None  # set on a jump host: the host it leads to, for its errors
        self.jumps_before = 0  # jump hosts on the way to this one, when it is a jump host itself
        self.leads_to: tuple[str, ...] = ()  # on a jump host: the hosts it leads to, the nearest first
        self.hop: hops.Hop | None = None  # the jump host this host is reached through, once connected
        self.connection: asyncssh.SSHClientConnection | None = None
        self.handshakes, self.connect_retry_s = connect_settings()  # a bad value: one line, before any connects
        self.handshake_attempts = 0  # how many handshakes connect() began (dropped ones tried again)
        self.forward_agent: str | None = None  # a control tree's relay: the agent socket its connection forwards

    @property
    def label(self) -> str:
        return self.host if self.port in (None, 22) else f"{self.host}:{self.port}"

    @property
    def named(self) -> str:
        """The host as its errors name it: a jump host says which host it leads to."""
        return f"{self.label} (jump host for {self.jump_host_for})" if self.jump_host_for else self.label

    @property
    def known_as(self) -> str:
        """Its name in known-hosts lines: the alias (OpenSSH's HostKeyAlias, which takes no port), or host[:port]."""
        return self.host_key_alias or _host_pattern(self.host, self.port or 22)

    def _keys_on_record(self) -> tuple[str, list[known_hosts.KnownLine], bool]:
        """The known-hosts lines the host's key must match ("": none knows the host, trust it on first
        contact), those of them that the user's files hold or a handed-over job carried (named if the
        key matches none), and whether a file on this machine holds any (else the key, once it matched,
        is kept in podrun's)."""
        if self.host_keys:
            return "".join(f"{self.known_as} {key}\n" for key in self.host_keys), [], True
        here = known_hosts.lines_for(self.known_as, known_hosts.user_files(self.known_hosts_file))
        users = here + known_hosts.handed_over(self.known_as)
        own = known_hosts.podrun_lines(self.known_as).decode()
        return "".join(line.as_known(self.known_as) for line in users) + own, users, bool(here or own)

    def route_known_as(self) -> list[str]:
        """The names this host and each jump host on its way go by in known-hosts files."""
        return [self.known_as, *known_as_of(self.jumps())]

    def jumps(self) -> list[tuple[str | None, str, int | None]]:
        """(user, host, port) of each jump host on the way, the first reached first: the spec's proxy_jump,
        else ~/.ssh/config's ProxyJump unless the spec names a proxy_command (as `ssh -o` wins over the file)."""
        jump = self.proxy_jump
        if jump is None and self.proxy_command is None:
            jump = hops.config_proxy_jump(self.host, self.port, self.user)
        return hops.hops_of(jump) if jump else []

    def _jump_host(self, jumps: list[tuple[str | None, str, int | None]]) -> SshTransport:
        """The last of `jumps`, as a host of its own: the spec's key and host-key rules, its own user and port
        (else ~/.ssh/config's, else ssh's defaults, as OpenSSH's -J does), reached through the ones before it."""
        user, host, port = jumps[-1]
        before = ",".join(map(_jump_entry, jumps[:-1])) or None  # None: the first one's own ProxyJump applies
        jump_host = SshTransport(host, port, user, self.identity_file, self.check_host_keys,
                                 known_hosts_file=self.known_hosts_file, proxy_jump=before)
        jump_host.jump_host_for, jump_host.jumps_before = self.label, self.jumps_before + 1
        jump_host.leads_to = (self.host, *self.leads_to)
        return jump_host

    async def _open_route(self) -> asyncssh.SSHClientConnection | None:
        """The connection to the last jump host on the way, shared with every other host behind it; None
        where the host is reached without one."""
        jumps = self.jumps()
        if not jumps:
            return None
        if looped := [host for _, host, _ in jumps if host in (self.host, *self.leads_to)]:  # as OpenSSH says it
            raise PodrunError(f"{self.named}: jumphost loop via {looped[0]}: its ProxyJump in {hops.USER_CONFIG} leads "
                              f"back to it; give it `ProxyJump none` in a Host block of its own, before the pattern")
        if self.jumps_before >= MAX_JUMP_HOSTS:
            raise PodrunError(f"{self.named}: more than {MAX_JUMP_HOSTS} jump hosts on the way; is there a "
                              f"ProxyJump loop in {hops.USER_CONFIG}?")
        key = (tuple(jumps), self.identity_file, self.check_host_keys, self.known_hosts_file)
        self.hop = await hops.open_hop(key, lambda: self._jump_host(jumps))
        return self.hop.transport.connection

    async def _close_route(self) -> None:
        hop, self.hop = self.hop, None
        if hop:
            await hops.close_hop(hop)

    async def connect(self) -> None:
        await self._close_route()  # connected again after a loss: the hop it went through is given back first
        tunnel = await self._open_route()  # before the handshake gate: a worker's place there waits on no hop
        try:
            await self._connect_through(tunnel)
        except BaseException:
            await self._close_route()
            raise

    async def _connect_through(self, tunnel: asyncssh.SSHClientConnection | None) -> None:
        known, users, recorded = self._keys_on_record() if self.check_host_keys else ("", [], True)
        options: dict[str, object] = {"known_hosts": asyncssh.import_known_hosts(known) if known else None,
                                      "host_key_alias": self.host_key_alias,
                                      "connect_timeout": CONNECT_TIMEOUT_S, "encryption_algs": ENCRYPTION_ALGS,
                                      "keepalive_interval": KEEPALIVE_INTERVAL_S,
                                      "keepalive_count_max": KEEPALIVE_COUNT_MAX}
        if self.port:
            options["port"] = self.port
        if self.user:
            options["username"] = self.user
        options.update(await client_keys.auth_options(self.identity_file))
        if self.forward_agent:
            options.update(agent_forwarding=True, agent_path=self.forward_agent)
        if tunnel is not None:
            options["tunnel"] = tunnel
        elif self.proxy_command:
            # the spec's, expanded here; it wins over a ProxyJump in ~/.ssh/config, as `ssh -o ProxyCommand=` does
            options.update(tunnel=None, proxy_command=self._expanded(self.proxy_command))
        elif self.proxy_jump is not None:  # "none": straight to the host, whatever ~/.ssh/config says
            options.update(tunnel=None, proxy_command=None)
        through = f" through {self.hop.transport.label}" if self.hop else ""
        try:
            self.connection = await self._connect(options)
        except asyncssh.HostKeyNotVerifiable:
            raise PodrunError(self._key_refused(users)) from None
        except asyncssh.PermissionDenied:
            refused = (f"key refused for user {self.user or 'default'} (identity file: "
                       f"{self.identity_file or 'ssh defaults'})")
            refused += f"; {self.refused_advice}" if self.refused_advice else ""
            error = PodrunError(f"{self.named}: {refused}")
            if self.refused_advice:  # the account's refusal (OS Login's roles), not this host's
                error.alike = refused
            raise error from None
        except (asyncio.TimeoutError, TimeoutError):
            raise PodrunError(f"{self.named}: no answer{through} within {CONNECT_TIMEOUT_S}s "
                              f"(host down or unreachable?){self._hint()}") from None
        except (OSError, asyncssh.Error) as error:
            raise PodrunError(f"{self.named}: cannot connect{through}: {reason(error)}{self._hint()}") from None
        host_key = self.connection.get_server_host_key()
        if self.check_host_keys and not recorded and host_key is not None:
            known_hosts.remember(self.known_as, [host_key.export_public_key().decode().strip()])

    def _hint(self) -> str:
        return f"; {self.unreachable_hint}" if self.unreachable_hint else ""

    def _key_refused(self, users: list[known_hosts.KnownLine]) -> str:
        """Why the host's key was refused, and what to do: one line."""
        if self.host_keys:
            return (f"{self.named}: its host key is not one of those its TPU VM published (guest attributes, "
                    f"namespace hostkeys); refusing to connect")
        if users:
            removals = "; ".join(f"ssh-keygen -R {shlex.quote(self.known_as)} -f {shlex.quote(path)}"
                                 for path in dict.fromkeys(line.path for line in users))
            there = " there" if all(line.elsewhere for line in users) else ""
            return (f"{self.named}: host key differs from the one recorded for it in {known_hosts.where(users)}; "
                    f"if the host was rebuilt, remove that record{there} ({removals})")
        alias = f" as {self.host_key_alias}" if self.host_key_alias else ""
        return (f"{self.named}: host key changed since podrun first connected (recorded in "
                f"{known_hosts.podrun_known_hosts()}{alias}); if the host was rebuilt, remove its line there")

    async def _connect(self, options: dict) -> asyncssh.SSHClientConnection:
        loop = asyncio.get_running_loop()
        started = loop.time()
        backoff_s = BACKOFF_FIRST_S
        while True:
            try:
                self.handshake_attempts += 1
                async with loop_gate("ssh handshakes", self.handshakes):
                    return await asyncssh.connect(self.host, **options)
            except asyncssh.PermissionDenied:
                if loop.time() >= started + self.refused_retry_s:
                    raise
                await asyncio.sleep(KEY_RETRY_INTERVAL_S)
            except _DROPPED:
                pause_s = random.uniform(0, backoff_s)  # full jitter: the dropped ones do not come back together
                if loop.time() + pause_s - started > self.connect_retry_s:
                    raise PodrunError(
                        f"{self.named}: the connection was closed before authentication, "
                        f"{counted_times(self.handshake_attempts)} in {loop.time() - started:.0f}s (sshd's MaxStartups "
                        f"drops handshakes beyond its limit: raise it there, or lower PODRUN_SSH_HANDSHAKES "
                        f"(now {self.handshakes}); PODRUN_SSH_CONNECT_RETRY sets the seconds to keep trying)") from None
                await asyncio.sleep(pause_s)
                backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)

    def endpoint(self) -> dict:
        return {"kind": "ssh", "host": self.host, "port": self.port, "user": self.user,
                "identity_file": self.identity_file, "check_host_keys": self.check_host_keys,
                "host_key_alias": self.host_key_alias, "host_keys": list(self.host_keys),
                "known_hosts_file": self.known_hosts_file, "proxy_command": self.proxy_command,
                "proxy_jump": self.proxy_jump, "refused_advice": self.refused_advice,
                "unreachable_hint": self.unreachable_hint}

    def _expanded(self, command: str) -> str:
        """OpenSSH's tokens in a ProxyCommand: %h the host, %p the port, %r the user, %% a percent sign."""
        values = {"h": self.host, "p": str(self.port or 22), "r": self.user or getpass.getuser(), "%": "%"}
        return re.sub(r"%(.)", lambda match: values.get(match[1], match[0]), command)

    def interactive(self, command: str | None, terminal: bool) -> tuple[list[str], str | None]:
        """OpenSSH's client, as gcloud's `tpu-vm ssh` runs it: a real terminal (resize, Ctrl-C to
        the remote program) for free, with podrun's keys and its host-key rules (its known-hosts file
        and the user's, trust on first use, a changed key refused; published keys written there and required)."""
        argv = ["ssh", "-t"] if terminal else ["ssh"]
        return [*argv, *self._client_options(), "--", self.host, *([command] if command else [])], None

    def _client_options(self) -> list[str]:
        """OpenSSH client options that reach this host with podrun's key, host-key rules and route."""
        argv = []
        if self.check_host_keys:
            own = known_hosts.podrun_known_hosts()
            paths.make_private_dir(str(own.parent))
            known = known_hosts.podrun_lines(self.known_as).decode().splitlines()
            known_hosts.remember(self.known_as, [key for key in self.host_keys if f"{self.known_as} {key}" not in known])
            # OpenSSH adds a key seen on first contact to the first file; published keys need no other
            files = [str(own), *([] if self.host_keys else known_hosts.user_files(self.known_hosts_file))]
            argv += ["-o", f"UserKnownHostsFile={' '.join(map(_quoted_for_ssh_config, files))}",
                     "-o", f"StrictHostKeyChecking={'yes' if self.host_keys else 'accept-new'}",
                     "-o", "HashKnownHosts=no"]  # podrun reads the file by host name
            if self.host_key_alias:
                # CheckHostIP=no: the address may have served another VM's key before, as gcloud's tpu-vm ssh sets it
                argv += ["-o", f"HostKeyAlias={self.host_key_alias}", "-o", "CheckHostIP=no"]
        else:
            argv += ["-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR"]
        argv += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
        if self.port:
            argv += ["-p", str(self.port)]
        if self.user:
            argv += ["-l", self.user]
        if self.identity_file:
            argv += ["-i", os.path.expanduser(self.identity_file)]
        if jumps := self.jumps():
            # not -J: OpenSSH's jump runs `ssh -W` without this command's -o options, so the jump host's key would
            # go unchecked by podrun's rules; the jump host's own options are expanded once more by this ssh: %% keeps them
            jump_host = self._jump_host(jumps)
            reach = [word.replace("%", "%%") for word in [*jump_host._client_options(), "--", jump_host.host]]
            argv += ["-o", f"ProxyCommand=ssh -W %h:%p {shlex.join(reach)}"]
        elif self.proxy_command:
            argv += ["-o", f"ProxyCommand={self.proxy_command}"]  # OpenSSH expands its tokens itself
        elif self.proxy_jump is not None:  # "none"
            argv += ["-o", "ProxyJump=none"]
        return argv

    def starting_environment(self) -> str:
        who = f"{self.user}@{self.label}" if self.user else self.label
        return f"what sshd gives a command on {who} (the login user's PATH and HOME; not podrun's environment)"

    async def start(self, command: str) -> Channel:
        assert self.connection is not None, "start() comes after connect()"
        try:
            return SshChannel(await self.connection.create_process(command, encoding=None))
        except asyncssh.ChannelOpenError as error:
            raise SessionRefused(f"{self.label}: cannot start a command: {reason(error)}") from None
        except (OSError, asyncssh.Error) as error:
            raise PodrunError(f"{self.label}: cannot start a command: {reason(error)}") from None

    def is_open(self) -> bool:
        return self.connection is not None and not self.connection.is_closed()

    async def close(self) -> None:
        if self.connection:
            self.connection.close()
            await self.connection.wait_closed()
        await self._close_route()


def connect_settings() -> tuple[int, float]:
    """PODRUN_SSH_HANDSHAKES (handshakes in flight at once) and PODRUN_SSH_CONNECT_RETRY (seconds to keep
    trying a handshake that sshd dropped before authentication), or their defaults."""
    text = os.environ.get("PODRUN_SSH_HANDSHAKES", "").strip() or str(DEFAULT_HANDSHAKES)
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"PODRUN_SSH_HANDSHAKES={text!r}: expected how many SSH handshakes podrun may have in "
                         f"flight at once, 1 or more (default {DEFAULT_HANDSHAKES})")
    retry = os.environ.get("PODRUN_SSH_CONNECT_RETRY", "").strip()
    try:
        retry_s = float(retry) if retry else DEFAULT_CONNECT_RETRY_S
    except ValueError:
        retry_s = -1.0
    if not 0 <= retry_s < float("inf"):
        raise UsageError(f"PODRUN_SSH_CONNECT_RETRY={retry!r}: expected the seconds to keep retrying a handshake "
                         f"that sshd dropped, 0 or more (default {DEFAULT_CONNECT_RETRY_S:g})")
    return int(text), retry_s


def counted_times(count: int) -> str:
    return "once" if count == 1 else "twice" if count == 2 else f"{count} times"



def _quoted_for_ssh_config(path: str) -> str:
    """A path as one word of an ssh_config value (which splits at spaces, and honours double quotes)."""
    return f'"{path}"' if " " in path else path


def _jump_entry(jump: tuple[str | None, str, int | None]) -> str:
    """(user, host, port) as a ProxyJump entry: user@host:port, an IPv6 address in brackets."""
    user, host, port = jump
    return (f"{user}@" if user else "") + (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")


def known_as_of(hosts: list[tuple[str | None, str, int | None]]) -> list[str]:
    """The names (user, host, port) entries go by in known-hosts files."""
    return [_host_pattern(host, port or 22) for _, host, port in hosts]


def _host_pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"



def from_endpoint(endpoint: dict) -> SshTransport:
    # records of jobs started before TPU workers had host key aliases have neither field, nor known_hosts_file
    return SshTransport(endpoint["host"], endpoint["port"], endpoint["user"], endpoint["identity_file"],
                        endpoint["check_host_keys"], host_key_alias=endpoint.get("host_key_alias"),
                        host_keys=tuple(endpoint.get("host_keys", ())), known_hosts_file=endpoint.get("known_hosts_file"),
                        proxy_command=endpoint.get("proxy_command"), proxy_jump=endpoint.get("proxy_jump"),
                        refused_advice=endpoint.get("refused_advice", ""), unreachable_hint=endpoint.get("unreachable_hint"))


def host_transport(ssh: SshOptions, user: str | None, host: str, port: int | None) -> SshTransport:
    """An SSH host of the spec's (a worker, a login node, the supervisor): its own user@ and :port
    win over the spec's ssh: settings, which apply to everything else."""
    return SshTransport(host, port or ssh.port, user or ssh.user, ssh.identity_file, ssh.check_host_keys,
                        known_hosts_file=ssh.known_hosts, proxy_command=ssh.proxy_command, proxy_jump=ssh.proxy_jump)
