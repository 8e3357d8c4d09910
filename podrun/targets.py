"""Resolve a spec's target to its workers, in rank order, each carrying its transport."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from dataclasses import dataclass

from podrun import paths
from podrun.errors import PodrunError, SpecError
from podrun.spec import JobSpec, parse_host
from podrun.transport import ChannelLost, LocalTransport, Transport

LOCAL_IP = "127.0.0.1"


@dataclass(frozen=True)
class Worker:
    index: int
    address: str  # what podrun connects to, as shown to the user
    internal_ip: str  # what the workers use to reach each other (rendezvous, PODRUN_WORKER_IPS)
    transport: Transport


@contextlib.asynccontextmanager
async def naming_lost_connections(worker: Worker, doing: str):
    """Turn a broken connection into one line that names the worker and what it was doing."""
    try:
        yield
    except ChannelLost as lost:
        raise PodrunError(f"worker {worker.index} ({worker.address}) lost its connection {doing} ({lost})") from None


def resolve_workers(spec: JobSpec, dry_run: bool = False) -> list[Worker]:
    """The target's workers in rank order. Nothing changes anywhere with dry_run (a TPU VM is read,
    but the user's key is not added to it)."""
    target = spec.target
    if target.local is not None:
        return [Worker(index, f"local/w{index}", LOCAL_IP, LocalTransport(paths.local_worker_root(index)))
                for index in range(target.local.workers)]
    if target.hosts is not None:
        return [_ssh_worker(index, entry, spec) for index, entry in enumerate(target.hosts)]
    from podrun.tpu_target import tpu_workers

    return tpu_workers(spec, authorize=not dry_run)


def transport_for(endpoint: dict) -> Transport:
    """The transport a job record's worker endpoint describes (see Transport.endpoint)."""
    if endpoint["kind"] == "local":
        return LocalTransport(endpoint["root"])
    from podrun.ssh import SshTransport

    return SshTransport(endpoint["host"], endpoint["port"], endpoint["user"], endpoint["identity_file"],
                        endpoint["check_host_keys"])


def _ssh_worker(index: int, entry: str, spec: JobSpec) -> Worker:
    from podrun.ssh import SshTransport  # asyncssh loads only for SSH targets

    user, host, port = parse_host(entry)
    transport = SshTransport(host, port or spec.ssh.port, user or spec.ssh.user, spec.ssh.identity_file,
                             spec.ssh.check_host_keys)
    return Worker(index, entry, _internal_ip(host, spec, index), transport)


def _internal_ip(host: str, spec: JobSpec, index: int) -> str:
    """The address the other workers use to reach this one: the host itself when it is an IP,
    else what its name resolves to (a name only ~/.ssh/config knows is not enough for torchrun)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError as error:
        raise SpecError(spec.path, f"target.hosts.{index}",
                        f"{host} does not resolve ({error.strerror or error}); expected a host name or IP "
                        f"address this machine can look up") from None
