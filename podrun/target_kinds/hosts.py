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


def _spares_from_flags(extras: Any) -> dict:
    return {"spares": _from_flags(extras["spares"], extras)} if extras.get("spares") else {}


KIND = TargetKind(
    name="hosts", annotation=list[HostEntry], description=HOST_FORMS, field_args={"min_length": 1},
    implementation="podrun.targets.hosts:SshHosts", nothing=f"a list of hosts ({HOST_FORMS})",
    expected={"": "a list of hosts such as [10.0.0.2, gpu-node-1, user@10.0.0.4:2222]", "*": HOST_FORMS,
              "spares": "a list of spare hosts such as [10.0.0.9]", "spares.*": HOST_FORMS},
    flag=AdhocFlag("--hosts", "H1,H2,...", f"SSH hosts, each {HOST_FORMS}"),
    extra_flags=(AdhocFlag("--spares", "H1,H2,...", "spare SSH hosts: a host lost in an attempt is left out, and "
                                                    "the next attempt runs a spare in its place"),),
    to_options=_from_flags, uses_ssh=True, summary=_summary, worker_count=len,
    siblings={"spares": (list[HostEntry], "spare hosts: a host lost in an attempt is left out for the rest of the "
                                          "job, and the next attempt runs the first spare left in its rank")},
    to_siblings=_spares_from_flags)
