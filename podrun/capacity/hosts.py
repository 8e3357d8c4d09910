"""SSH hosts with spares (`target: {hosts: [...], spares: [...]}`): the hosts in rank order, and the
spares that take a lost host's place. A host whose worker was lost in an attempt is left out for the
rest of the job; the next attempt runs the first spare left in its rank, the others' ranks unchanged."""

from __future__ import annotations

from podrun.capacity.base import Capacity


class HostList(Capacity):
    def __init__(self, hosts: list[str], spares: list[str]):
        super().__init__()
        self.hosts = list(hosts)  # in rank order, each entry as the spec writes it
        self.spares = list(spares)  # the spares left, in the spec's order
        self.has_spares = bool(spares)

    @property
    def spares_left(self) -> int:
        return len(self.spares)

    def replace(self, worker: int) -> tuple[str, str | None] | None:
        if not self.has_spares:
            return None
        left = self.hosts[worker]
        if not self.spares:
            return left, None
        self.hosts[worker] = self.spares.pop(0)
        return left, self.hosts[worker]
