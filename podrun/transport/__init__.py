"""Transports: how a command reaches one worker (base.py: the interface, the worker-side script
bootstrap), over SSH (ssh.py) or as a local process tree (local.py)."""

from __future__ import annotations

from podrun.transport.base import Transport


def transport_for(endpoint: dict) -> Transport:
    """The transport a job record's worker endpoint describes (Transport.endpoint()); `podrun logs`
    and `stop` reach a detached job's workers with it, without reading its spec."""
    if endpoint["kind"] == "local":
        from podrun.transport.local import LocalTransport

        return LocalTransport(endpoint["root"])
    from podrun.transport.ssh import SshTransport

    return SshTransport(endpoint["host"], endpoint["port"], endpoint["user"], endpoint["identity_file"],
                        endpoint["check_host_keys"])
