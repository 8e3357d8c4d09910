"""Transports: how a command reaches one worker (base.py: the interface, the worker-side script
bootstrap), over SSH (ssh.py) or as a local process tree (local.py); known_hosts.py: the host keys on
record, podrun's and the user's. Each transport module registers here by its endpoint kind."""

from __future__ import annotations

import importlib

from podrun.errors import PodrunError
from podrun.transport.base import Transport

# endpoint kind (Transport.endpoint()["kind"]) -> the module whose from_endpoint() reaches it again
TRANSPORTS = {"local": "podrun.transport.local", "ssh": "podrun.transport.ssh", "slurm": "podrun.transport.slurm"}


def transport_for(endpoint: dict) -> Transport:
    """The transport a job record's worker endpoint describes (Transport.endpoint()); `podrun logs`
    and `stop` reach a detached job's workers with it, without reading its spec."""
    module = TRANSPORTS.get(endpoint.get("kind", ""))
    if module is None:
        raise PodrunError(f"a worker's endpoint of unknown kind {endpoint.get('kind')!r} (expected one of "
                          f"{', '.join(TRANSPORTS)}): was the job started by another version of podrun?")
    return importlib.import_module(module).from_endpoint(endpoint)
