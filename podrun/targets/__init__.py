"""Targets: where a job runs. One module per kind (local.py, hosts.py, tpu.py) behind base.Target;
each is imported only when a spec names it, so a local job never loads SSH or Google's libraries."""

from __future__ import annotations

from podrun.spec import JobSpec
from podrun.targets.base import Target
from podrun.transport.base import Transport


def target_for(spec: JobSpec) -> Target:
    if spec.target.tpu is not None:
        from podrun.targets.tpu import TpuVm

        return TpuVm(spec)
    if spec.target.hosts is not None:
        from podrun.targets.hosts import SshHosts

        return SshHosts(spec)
    from podrun.targets.local import LocalWorkers

    return LocalWorkers(spec)


def transport_for(endpoint: dict) -> Transport:
    """The transport a job record's worker endpoint describes (Transport.endpoint())."""
    if endpoint["kind"] == "local":
        from podrun.transport.local import LocalTransport

        return LocalTransport(endpoint["root"])
    from podrun.transport.ssh import SshTransport

    return SshTransport(endpoint["host"], endpoint["port"], endpoint["user"], endpoint["identity_file"],
                        endpoint["check_host_keys"])
