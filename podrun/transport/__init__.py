"""Transports: how a command reaches one worker (base.py: the interface, the worker-side script
bootstrap), over SSH (ssh.py), as a local process tree (local.py) or as a Slurm job step through the
login node (slurm.py); known_hosts.py: the host keys on record, podrun's and the user's."""

from __future__ import annotations

from podrun.transport.base import Transport


def transport_for(endpoint: dict) -> Transport:
    """The transport a job record's worker endpoint describes (Transport.endpoint()); `podrun logs`
    and `stop` reach a detached job's workers with it, without reading its spec."""
    if endpoint["kind"] == "local":
        from podrun.transport.local import LocalTransport

        return LocalTransport(endpoint["root"])
    if endpoint["kind"] == "slurm":  # temporary wiring, until transports register by kind (issue 29 part 1)
        from podrun.transport.slurm import from_endpoint

        return from_endpoint(endpoint)
    from podrun.transport.ssh import SshTransport

    # records of jobs started before TPU workers had host key aliases have neither field, nor known_hosts_file
    return SshTransport(endpoint["host"], endpoint["port"], endpoint["user"], endpoint["identity_file"],
                        endpoint["check_host_keys"], host_key_alias=endpoint.get("host_key_alias"),
                        host_keys=tuple(endpoint.get("host_keys", ())), known_hosts_file=endpoint.get("known_hosts_file"))
