"""An SSH hosts target's options (`target: {hosts: [...]}`, `exec --hosts H1,H2`): the hosts in rank
order, each `host`, `user@host`, `host:port` or `user@host:port`. The target itself is hosts.py's."""

from __future__ import annotations

from typing import Any

from podrun.output import counted
from podrun.spec.fields import HOST_FORMS, HostEntry
from podrun.target_kinds.kind import AdhocFlag, TargetKind


def _summary(hosts: list[str]) -> str:
    return f"{counted(len(hosts), 'SSH host')}: {', '.join(hosts)}"


def _from_flags(value: str, extras: Any) -> list[str]:
    return [host.strip() for host in value.split(",")]


KIND = TargetKind(
    name="hosts", annotation=list[HostEntry], description=HOST_FORMS, field_args={"min_length": 1},
    implementation="podrun.targets.hosts:SshHosts", nothing=f"a list of hosts ({HOST_FORMS})",
    expected={"": "a list of hosts such as [10.0.0.2, gpu-node-1, user@10.0.0.4:2222]", "*": HOST_FORMS},
    flag=AdhocFlag("--hosts", "H1,H2,...", f"SSH hosts, each {HOST_FORMS}"),
    to_options=_from_flags, uses_ssh=True, summary=_summary, worker_count=len)
