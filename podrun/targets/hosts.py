"""SSH hosts, such as GPU nodes: `host`, `user@host`, `host:port`, in the spec's order."""

from __future__ import annotations

import ipaddress
import socket

from podrun.errors import SpecError
from podrun.output import counted
from podrun.spec.fields import parse_host
from podrun.targets.base import Target, Worker


class SshHosts(Target):
    worker_noun = "SSH host"
    default_device = "CUDA"

    def workers(self, dry_run: bool) -> list[Worker]:
        from podrun.transport.ssh import host_transport  # asyncssh loads only for SSH targets

        workers = []
        for index, entry in enumerate(self.options):
            user, host, port = parse_host(entry)
            transport = host_transport(self.spec.ssh, user, host, port)
            workers.append(Worker(index, entry, self._internal_ip(host, index), transport))
        return workers

    def ssh_hosts(self) -> list[str]:
        return list(self.options)

    def describe(self, workers: list[Worker]) -> str:
        return f"{counted(len(workers), self.worker_noun)}: {', '.join(worker.address for worker in workers)}"

    def _internal_ip(self, host: str, index: int) -> str:
        """The address the other workers use to reach this one: the host itself when it is an IP,
        else what its name resolves to (a name only ~/.ssh/config knows is not enough for torchrun)."""
        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            pass
        try:
            return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
        except OSError as error:
            raise SpecError(self.spec.path, f"target.hosts.{index}",
                            f"{host} does not resolve ({error.strerror or error}); expected a host name or IP "
                            f"address this machine can look up") from None
