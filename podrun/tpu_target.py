"""A TPU VM (or pod slice) as a target: its workers from the API, and the user's SSH key on them.

Workers come in the order of the node's `networkEndpoints` (that order is the TPU worker id, as in
`gcloud compute tpus tpu-vm ssh --worker=N`). podrun connects to each worker's external IP, or to its
internal IP with `internal_ip: true` (from a VM in the same network); the workers reach each other
on their internal IPs. Access works as gcloud's: the key ~/.ssh/google_compute_engine (made on first
use) and the local user name, added to the node's `ssh-keys` metadata, which the TPU VM's guest agent
installs on every worker.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path

from podrun import accelerators
from podrun.errors import PodrunError
from podrun.gcloud_settings import location
from podrun.spec import JobSpec
from podrun.targets import Worker

GCLOUD_KEY = Path("~/.ssh/google_compute_engine")
# right after a key is added, the guest agents need a few seconds to install it on every worker
KEY_PROPAGATION_S = 60


def tpu_workers(spec: JobSpec, authorize: bool) -> list[Worker]:
    """The node's workers, ready to connect to. With `authorize`, the user's key is made if it does
    not exist and added to the node's metadata if it is not there yet (not for --dry-run, which
    changes nothing, here or on the node)."""
    from podrun.ssh import SshTransport, ensure_key_pair  # asyncssh and Google's libraries load only here
    from podrun.tpu_api import TpuApi

    tpu = spec.target.tpu
    assert tpu is not None, "tpu_workers is called for tpu targets only"
    api = TpuApi(location(tpu.project, tpu.zone))
    node = api.get(tpu.name)
    if node.state != "READY":
        raise PodrunError(f"TPU VM {tpu.name} is {node.state}, not READY; `podrun describe {tpu.name}` shows "
                          f"its state (a preempted Spot VM must be deleted and created again)")
    expected = accelerators.parse(node.accelerator_type).hosts
    if len(node.workers) < expected:
        raise PodrunError(f"TPU VM {tpu.name} ({node.accelerator_type}) reports {len(node.workers)} of its "
                          f"{expected} workers; it may still be repairing; try again, or recreate it")
    user = spec.ssh.user or getpass.getuser()
    key_path = Path(os.path.expanduser(spec.ssh.identity_file or GCLOUD_KEY))
    just_added = False
    if authorize:
        key_line = f"{user}:{ensure_key_pair(key_path, user, create=not spec.ssh.identity_file)}"
        if not _has_key(node.metadata.get("ssh-keys", ""), key_line):
            keys = node.metadata.get("ssh-keys", "").rstrip("\n")
            api.set_metadata(node, {**node.metadata, "ssh-keys": f"{keys}\n{key_line}".lstrip("\n")})
            just_added = True
    workers = []
    for index, address in enumerate(node.workers):
        host = address.internal_ip if tpu.internal_ip or not address.external_ip else address.external_ip
        transport = SshTransport(host, spec.ssh.port, user, str(key_path), spec.ssh.check_host_keys,
                                 refused_retry_s=KEY_PROPAGATION_S if just_added else 0)
        workers.append(Worker(index, host, address.internal_ip, transport))
    return workers


def _has_key(ssh_keys: str, key_line: str) -> bool:
    """Whether `user:type blob ...` is among the metadata's lines (comments may differ)."""
    user, _, key = key_line.partition(":")
    wanted = key.split()[:2]
    for line in ssh_keys.splitlines():
        line_user, _, line_key = line.partition(":")
        if line_user == user and line_key.split()[:2] == wanted:
            return True
    return False
