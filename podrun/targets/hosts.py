"""SSH hosts, such as GPU nodes: `host`, `user@host`, `host:port`, in the spec's order."""

from __future__ import annotations

import ipaddress
import socket

from podrun.capacity.hosts import HostList
from podrun.errors import SpecError
from podrun.output import counted
from podrun.spec.fields import parse_host
from podrun.spec.model import JobSpec
from podrun.targets.base import Target, Worker


class SshHosts(Target):
    worker_noun = "SSH host"
    default_device = "CUDA"

    def __init__(self, spec: JobSpec):
        super().__init__(spec)
        spares: list[str] = spec.target.sibling("spares")
        for position, spare in enumerate(spares):
            if spare in self.options or spare in spares[:position]:
                raise SpecError(spec.path, f"target.spares.{position}",
                                f"{spare} is {'one of the hosts' if spare in self.options else 'a spare'} already; "
                                f"expected a host of its own")
        self.capacity: HostList = HostList(self.options, spares)

    def workers(self, dry_run: bool) -> list[Worker]:
        from podrun.transport.ssh import host_transport  # asyncssh loads only for SSH targets

        workers = []
        for index, entry in enumerate(self.capacity.hosts):
            user, host, port = parse_host(entry)
            transport = host_transport(self.spec.ssh, user, host, port)
            field = f"target.hosts.{index}" if entry == self.options[index] else \
                f"target.spares.{self.spec.target.sibling('spares').index(entry)}"
            workers.append(Worker(index, entry, self._internal_ip(host, field), transport))
        return workers

    def ssh_hosts(self) -> list[str]:
        return [*self.options, *self.spec.target.sibling("spares")]

    def describe(self, workers: list[Worker]) -> str:
        spares = self.capacity.spares
        return (f"{counted(len(workers), self.worker_noun)}: {', '.join(worker.address for worker in workers)}"
                + (f"; {counted(len(spares), 'spare')}: {', '.join(spares)}" if spares else ""))

    def _internal_ip(self, host: str, field: str) -> str:
        """The address the other workers use to reach this one: the host itself when it is an IP,
        else what its name resolves to (a name only ~/.ssh/config knows is not enough for torchrun)."""
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            pass
        try:
            return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
        except OSError as error:
            raise SpecError(self.spec.path, field,
                            f"{host} does not resolve ({error.strerror or error}); expected a host name or IP "
                            f"address this machine can look up") from None
