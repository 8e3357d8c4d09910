"""TPU VMs without external IPs (docs/targets/company-projects.md): the organization policy that refuses
them external IPs, and the ways a launcher outside their VPC network reaches their workers anyway,
each said in one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from podrun.errors import PodrunError
from podrun.output import say

if TYPE_CHECKING:
    from podrun.cloud.tpu_resources import TpuNode

# the list constraint that, enforced with no VM allowed, makes Google refuse any VM an external IP
EXTERNAL_IP_CONSTRAINT = "constraints/compute.vmExternalIpAccess"
WAYS_IN = ("through IAP (target.tpu.iap: true, or --tunnel-through-iap) or a bastion (ssh.proxy_jump or "
           "ssh.proxy_command), or run podrun on a host inside the VPC (a supervisor host there, or over a VPN)")


class ExternalIpsRefused(PodrunError):
    """Google refused to create a TPU VM with external IPs, under the organization policy."""


def refuses_external_ips(message: str | None) -> bool:
    """Whether Google's error (a call's or an operation's message) is the policy's refusal."""
    return EXTERNAL_IP_CONSTRAINT in (message or "")


def external_ips_refused(doing: str, project: str) -> ExternalIpsRefused:
    return ExternalIpsRefused(
        f"{doing}: the organization policy {EXTERNAL_IP_CONSTRAINT} of project {project} allows no VM an external "
        f"IP; create it with internal IPs only (`podrun create ... --internal-ips`, or target.tpu.internal_ip: true) "
        f"and reach its workers {WAYS_IN}; podrun left nothing of it in the API")


def unreachable_hint(host: str) -> str:
    """What a failed connection to a worker's internal IP adds: the ways in from outside the VPC."""
    return f"{host} is an internal IP of a TPU VM, which only its VPC network reaches: from elsewhere, go {WAYS_IN}"


def say_if_internal_only(nodes: list[TpuNode]) -> None:
    """One line naming the nodes whose workers have no external IP: podrun falls back to their
    internal IPs, which only a machine in their VPC network reaches."""
    lacking = [node for node in nodes if any(not worker.external_ip for worker in node.workers)]
    if not lacking:
        return
    internal = [worker.internal_ip for node in lacking for worker in node.workers if not worker.external_ip]
    shown = ", ".join(internal[:3]) + (f" and {len(internal) - 3} more" if len(internal) > 3 else "")
    what = f"TPU VM {lacking[0].name} has" if len(lacking) == 1 else f"TPU VMs {', '.join(n.name for n in lacking)} have"
    say(f"{what} no external IPs: connecting to internal IPs {shown}, which only a machine in its VPC network "
        f"(or on a VPN to it) reaches; from there, set target.tpu.internal_ip: true; from elsewhere, go {WAYS_IN}")
