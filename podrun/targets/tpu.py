"""A TPU VM (or pod slice) as a target: its workers from the API, the user's SSH key on them, and
no run while a process left from an earlier one holds the TPU.

Workers come in the order of the node's `networkEndpoints` (that order is the TPU worker id, as in
`gcloud compute tpus tpu-vm ssh --worker=N`). podrun connects to each worker's external IP, or to its
internal IP with `internal_ip: true` (from a VM in the same network); the workers reach each other
on their internal IPs. A TPU podrun creates asks for external IPs unless `internal_ip: true`, as
gcloud does unless --internal-ips (the API's default is none); a node without them is named before
podrun falls back to its internal IPs. A spec may name the way to the workers instead: through IAP
(`iap: true`: each worker through `gcloud compute start-iap-tunnel`, to the instance name its guest
agent published, as gcloud's `tpu-vm ssh --tunnel-through-iap`), or a bastion (`ssh.proxy_command`);
then podrun connects to the internal IPs, which the far end reaches. Access works as gcloud's: the
key ~/.ssh/google_compute_engine (made on first use) and the local user name, added to the node's
`ssh-keys` metadata, which the TPU VM's guest agent installs on every worker; or, where OS Login
governs the node (cloud/oslogin.py), that key imported into the account's OS Login profile and its
POSIX user, with no `ssh-keys` written.

Host keys too are gcloud's: each worker is known by gcloud's alias for it (HostKeyAlias
`tpu.<node id>-<worker>[-<last 6 characters of its ed25519 key>]`, from command_lib/compute/tpus/
tpu_vm/ssh.py, GetInstanceID), with the keys its guest agent published (guest attributes, namespace
`hostkeys`) trusted as they are. A TPU VM made again (after a preemption, or deleted and created
under the same name) has another id and other keys: a new host, never a changed one. Where nothing
is published, its key is trusted on first use under the alias.

A process left from an earlier run that still holds /dev/accel* (or /dev/vfio/*, or libtpu's
lockfile) makes the next run die with "TPU in use". Every worker's agent looks for such processes in
its probe (remote/tpu_holders.py); they are named with their PIDs and command lines, and killed only
when the user asks (exec --kill-stale).
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from podrun.capacity.tpu import TpuCapacity
from podrun.cloud import accelerators
from podrun.cloud.no_external_ips import say_if_internal_only, unreachable_hint
from podrun.cloud.settings import Location
from podrun.errors import PodrunError
from podrun.output import counted, say
from podrun.spec.model import JobSpec
from podrun.target_kinds.tpu import TpuOptions
from podrun.targets.base import Target, Worker

if TYPE_CHECKING:
    from podrun.cloud.oslogin import OsLogin
    from podrun.cloud.request import TpuRequest
    from podrun.cloud.tpu_api import TpuApi
    from podrun.cloud.tpu_resources import TpuNode

GCLOUD_KEY = Path("~/.ssh/google_compute_engine")
# what gcloud lets into an IAP tunnel's ProxyCommand as an instance name (ssh.py, _BuildIapTunnelProxyCommandArgs)
IAP_INSTANCE = re.compile(r"^[A-Za-z0-9._-]+\Z")
# right after a key is added, the guest agents need a few seconds to install it on every worker
KEY_PROPAGATION_S = 60
# libtpu's DCN port between slices, as the queued-resource service sets it for a multislice (docs/targets/tpu.md)
MEGASCALE_PORT = "8080"


# where the TPU runtime's files are; PODRUN_ACCELERATOR_FILES (glob patterns, colon-separated)
# replaces the list, for images that put them elsewhere
ACCELERATOR_FILES = "/dev/accel*:/dev/vfio/[0-9]*:/tmp/libtpu_lockfile"
STALE_KILL_GRACE_S = 3


class TpuVm(Target):
    worker_noun = "TPU worker"
    default_device = "TPU"
    container_flags = ("--privileged",)  # the container needs /dev/accel* and the TPU runtime's sysfs

    def __init__(self, spec: JobSpec):
        super().__init__(spec)
        tpu: TpuOptions = self.options
        self.tpu = tpu
        self.node_names = tpu.node_names  # one, or the slices in slice order
        self.nodes: list[TpuNode] = []  # empty while a TPU the spec declares does not exist (--dry-run)
        self.capacity: TpuCapacity = TpuCapacity(spec, lambda: ssh_key_line(spec))

    @property
    def api(self) -> TpuApi:
        return self.capacity.api

    @property
    def oslogin(self) -> OsLogin:
        return self.capacity.oslogin

    @property
    def multislice(self) -> bool:
        return len(self.node_names) > 1

    def workers(self, dry_run: bool) -> list[Worker]:
        if dry_run and self.tpu.accelerator_type:
            if (existing := self.capacity.existing()) is None:
                return self._workers_to_be()
            self.capacity.refuse_another_shape(existing)  # as exec would
        self.nodes, workers = tpu_workers(self.spec, self.api, None if dry_run else self.oslogin,
                                          just_created=self.capacity.just_created)
        return workers

    def worker_env(self, worker: Worker, workers: list[Worker]) -> dict[str, str]:
        """On a multislice: where the worker is among the slices, and the MEGASCALE_* variables that
        libtpu joins the slices by (and JAX numbers its processes by), as the queued-resource service
        writes them into each VM's `tpu-env` metadata: slice 0 worker 0 coordinates."""
        if not self.multislice or worker.slice is None:
            return {}
        slice_id, in_slice = worker.slice
        return {"PODRUN_SLICE": str(slice_id), "PODRUN_NUM_SLICES": str(len(self.node_names)),
                "PODRUN_WORKER_IN_SLICE": str(in_slice),
                "MEGASCALE_COORDINATOR_ADDRESS": f"{workers[0].internal_ip}:{MEGASCALE_PORT}",
                "MEGASCALE_NUM_SLICES": str(len(self.node_names)), "MEGASCALE_SLICE_ID": str(slice_id),
                "MEGASCALE_PORT": MEGASCALE_PORT}

    def describe(self, workers: list[Worker]) -> str:
        what = f"multislice {self.tpu.label}" if self.multislice else f"TPU VM {self.tpu.label}"
        if not self.nodes:
            return (f"{what} does not exist: podrun exec creates it ({self.capacity.request().summary()}); "
                    f"its {counted(len(workers), self.worker_noun)}' addresses are known then")
        node = self.nodes[0]
        shape = f"{len(self.nodes)} x {node.accelerator_type}" if self.multislice else node.accelerator_type
        states = sorted({each.state for each in self.nodes})
        return (f"{what} ({shape}, runtime {node.runtime_version}, {', '.join(states)}) in "
                f"{node.location.project}/{node.location.zone}: {counted(len(workers), self.worker_noun)}")

    def price(self) -> dict:
        from podrun.cloud.prices import tpu_price

        node = self.nodes[0]
        return tpu_price(node.accelerator_type, node.location.zone, spot=node.spot or self.tpu.spot,
                         reserved=node.reserved or self.tpu.reservation is not None, slices=len(self.nodes))

    def _workers_to_be(self) -> list[Worker]:
        """The workers a TPU the spec declares will have, for --dry-run: their addresses are not known yet."""
        from podrun.transport.ssh import SshTransport

        assert self.tpu.accelerator_type
        user, key_path = _user_and_key(self.spec)
        hosts = accelerators.parse(self.tpu.accelerator_type).hosts
        workers = []
        for slice_id in range(len(self.node_names)):
            for in_slice in range(hosts):
                index = slice_id * hosts + in_slice
                workers.append(Worker(index, f"<worker {index}>", f"<worker {index} internal IP>",
                                      SshTransport(f"<worker {index}>", self.spec.ssh.port, user, str(key_path), True),
                                      (slice_id, in_slice) if self.multislice else None))
        return workers

    def promised_devices(self) -> dict | None:
        """A TPU type's chips per host, as device files (/dev/accel*, /dev/vfio/N)."""
        accelerator = accelerators.parse(self.nodes[0].accelerator_type)
        return {"kind": "TPU chip", "count": accelerator.chips // accelerator.hosts, "why": accelerator.name,
                "files": os.environ.get("PODRUN_ACCELERATOR_FILES", ACCELERATOR_FILES)}

    def probe(self, kill_stale: bool) -> dict:
        return {"accelerator_files": os.environ.get("PODRUN_ACCELERATOR_FILES", ACCELERATOR_FILES),
                "kill_stale": kill_stale, "stale_grace": STALE_KILL_GRACE_S}

    def check_probes(self, reports: list[tuple[Worker, dict]], kill_stale: bool) -> None:
        """Fail, naming the processes that hold the TPU ("pid TAB file TAB command" lines in each
        probe), or with kill_stale (the agents killed them already) say so and go on."""
        lines = []
        for worker, report in reports:
            for line in report["holders"].splitlines():
                pid, path, command = line.split("\t", 2)
                lines.append(f"worker {worker.index} ({worker.address}): pid {pid} holds {path}: {command}")
        if lines and kill_stale:
            say(f"killed {len(lines)} process(es) that held the TPU:\n  " + "\n  ".join(lines))
        elif lines:
            raise PodrunError("the TPU is in use on the workers (left from an earlier run?):\n  " + "\n  ".join(lines)
                              + "\nstop them, or run again with --kill-stale to have podrun kill them")


def created_tpu(made: TpuRequest, where: Location) -> TpuVm:
    """The TPU `podrun create` just made (a VM, or a multislice), as a target whose workers podrun reaches."""
    from podrun.spec.problems import validate_fields
    tpu = {"name": made.name, "zone": where.zone, "project": where.project, "accelerator_type": made.accelerator_type,
           "internal_ip": not made.external_ips, **({"slices": made.slices} if made.slices > 1 else {})}
    return TpuVm(validate_fields({"name": "create", "run": "true", "target": {"tpu": tpu}}))


def tpu_workers(spec: JobSpec, api: TpuApi, oslogin: OsLogin | None, just_created: bool = False
                ) -> tuple[list[TpuNode], list[Worker]]:
    """The nodes (one, or the slices in slice order) and their workers ready to connect to, slice by
    slice, each in worker-id order. With `oslogin` (None for --dry-run, which changes nothing, here
    or on the node), the user's key is made if it does not exist and authorized: in OS Login where it
    governs a node (then its workers are logged into as the account's POSIX user), else added to the
    node's metadata where it is not there yet. Logins refused right after the key reached the
    metadata (just now, or as the node was `just_created`) are retried while the workers install it.
    The workers' published host keys are read too, except for --dry-run, which connects nowhere."""
    from podrun.cloud.tpu_resources import Published
    from podrun.transport.ssh import SshTransport

    tpu: TpuOptions = spec.target.options
    names = tpu.node_names
    authorize = oslogin is not None
    key_line = ssh_key_line(spec) if authorize else None
    if tpu.iap and authorize:
        _require_gcloud()
    # the slices' reads, key updates and guest attributes (host keys, instance names) at once
    with ThreadPoolExecutor(max_workers=min(2 * len(names), 32)) as pool:
        published = [pool.submit(api.guest_attributes, name) if tpu.iap or (authorize and spec.ssh.check_host_keys)
                     else None for name in names]
        reached = list(pool.map(lambda name: _reach(api, name, key_line, oslogin), names))
        attributes = [future.result() if future else [] for future in published]
    routed = tpu.iap or bool(spec.ssh.proxy_command or spec.ssh.proxy_jump)  # the spec names how the workers are reached
    if not tpu.internal_ip and not routed:
        say_if_internal_only([node for node, _ in reached])
    # OS Login's guest asks the API at each login: a key it took works at once, a refusal is final
    logins = {node.name: oslogin.login(node.metadata, key_line.partition(":")[2])
              for node, _ in reached if oslogin and key_line and oslogin.governs(node.metadata)}
    installing = [node.name for node, just_added in reached if (just_added or just_created) and node.name not in logins]
    if installing:
        say(f"your SSH key is new in the metadata of TPU VM {', '.join(installing)}: its workers' guest agents "
            f"install it within seconds; until then a refused login is retried, for up to {KEY_PROPAGATION_S}s")
    user, key_path = _user_and_key(spec)
    if (login := next(iter(logins.values()), None)) and spec.ssh.user and spec.ssh.user != login.user:
        say(f"OS Login governs TPU VM {', '.join(logins)}: logging in as {login.user} ({login.account}), "
            f"not as ssh.user {spec.ssh.user}, as gcloud does")
    workers: list[Worker] = []
    for slice_id, ((node, _), node_attributes) in enumerate(zip(reached, attributes)):
        login = logins.get(node.name)
        for in_slice, address in enumerate(node.workers):
            # through a route, the far end (a bastion, IAP) reaches the internal IP
            host = address.external_ip if address.external_ip and not (routed or tpu.internal_ip) else address.internal_ip
            internal = host == address.internal_ip
            worker_published = node_attributes[in_slice] if in_slice < len(node_attributes) else Published()
            keys = worker_published.host_keys if spec.ssh.check_host_keys else ()
            transport = SshTransport(host, spec.ssh.port, login.user if login else user, str(key_path),
                                     spec.ssh.check_host_keys,
                                     refused_retry_s=KEY_PROPAGATION_S if node.name in installing else 0,
                                     host_key_alias=host_key_alias(node, in_slice, keys), host_keys=keys,
                                     known_hosts_file=spec.ssh.known_hosts,
                                     proxy_command=(iap_tunnel(node, in_slice, worker_published.instance) if tpu.iap
                                                    else spec.ssh.proxy_command),
                                     proxy_jump=None if tpu.iap else spec.ssh.proxy_jump,
                                     refused_advice=login.refused_advice() if login else "",
                                     unreachable_hint=unreachable_hint(host) if internal and not routed else None)
            workers.append(Worker(len(workers), host, address.internal_ip, transport,
                                  (slice_id, in_slice) if len(names) > 1 else None))
    return [node for node, _ in reached], workers


def iap_tunnel(node: TpuNode, worker: int, instance: str | None) -> str:
    """The ProxyCommand that reaches the worker through IAP, as gcloud's `tpu-vm ssh --tunnel-through-iap`
    builds it (command_lib/util/ssh/ssh.py, _BuildIapTunnelProxyCommandArgs): `gcloud compute
    start-iap-tunnel INSTANCE %p --listen-on-stdin --project=P --zone=Z`, INSTANCE its VM's name from the
    node's guest attributes (key `hostname`). The project and zone are spelled out, so that a job's record
    reaches it from a shell with other gcloud defaults."""
    if instance is None:
        raise PodrunError(
            f"TPU VM {node.name}: worker {worker} published no instance name (guest attributes, key hostname), which "
            f"an IAP tunnel needs; check that the organization policy constraints/compute.disableGuestAttributesAccess "
            f"is not enforced in project {node.location.project} and that the TPU VM is READY and HEALTHY (as gcloud's "
            f"tpu-vm ssh --tunnel-through-iap says)")
    if not IAP_INSTANCE.match(instance):  # it becomes part of a shell command (OpenSSH runs ProxyCommand with sh -c)
        raise PodrunError(f"TPU VM {node.name}: worker {worker} published the instance name {instance!r}, which is not "
                          f"a Compute Engine instance name; refusing to tunnel to it")
    where = node.location
    return (f"gcloud compute start-iap-tunnel {instance} %p --listen-on-stdin --project={where.project} "
            f"--zone={where.zone} --verbosity=warning")


def _require_gcloud() -> None:
    if shutil.which("gcloud") is None:
        raise PodrunError("target.tpu.iap (--tunnel-through-iap): an IAP tunnel is opened by the gcloud CLI (`gcloud "
                          "compute start-iap-tunnel`), which is not on PATH; install the Google Cloud CLI "
                          "(https://cloud.google.com/sdk/docs/install) and `gcloud auth login`")


def host_key_alias(node: TpuNode, worker: int, host_keys: tuple[str, ...]) -> str | None:
    """gcloud's HostKeyAlias for the worker (GetInstanceID in gcloud's command_lib/compute/tpus/tpu_vm/
    ssh.py): `tpu.<node id>-<worker>`, then `-` and the last 6 characters of its ed25519 host key
    where one is published. None for a node without an id (then its address names it)."""
    if not node.id:
        return None
    ed25519 = next((key.split()[1] for key in host_keys if key.startswith("ssh-ed25519 ")), None)
    return f"tpu.{node.id}-{worker}" + (f"-{ed25519[-6:]}" if ed25519 else "")


def _reach(api: TpuApi, name: str, key_line: str | None, oslogin: OsLogin | None) -> tuple[TpuNode, bool]:
    """The READY node with all its workers; with `key_line`, that key added to its metadata unless
    OS Login governs the node. Whether it was added just now."""
    from podrun.cloud.capacity import PREEMPTED_NODE_STATES

    node = api.get(name)
    if node.state != "READY":
        where = node.location.flags
        advice = (f"a preempted Spot VM must be deleted and created again (`podrun delete {name} {where}`)"
                  if node.state in PREEMPTED_NODE_STATES else
                  f"`podrun describe {name} {where}` shows its state; run again once it is READY")
        raise PodrunError(f"TPU VM {name} is {node.state}, not READY; {advice}")
    expected = accelerators.parse(node.accelerator_type).hosts
    if len(node.workers) < expected:
        raise PodrunError(f"TPU VM {name} ({node.accelerator_type}) reports {len(node.workers)} of its "
                          f"{expected} workers; it may still be repairing; try again, or recreate it")
    if key_line is None or _has_key(node.metadata.get("ssh-keys", ""), key_line):
        return node, False
    if oslogin and oslogin.governs(node.metadata):
        return node, False
    keys = node.metadata.get("ssh-keys", "").rstrip("\n")
    api.set_metadata(node, {**node.metadata, "ssh-keys": f"{keys}\n{key_line}".lstrip("\n")})
    return node, True


def _user_and_key(spec: JobSpec) -> tuple[str, Path]:
    return spec.ssh.user or getpass.getuser(), Path(os.path.expanduser(spec.ssh.identity_file or GCLOUD_KEY))


def ssh_key_line(spec: JobSpec) -> str:
    """`user:ssh-ed25519 AAAA... user` for the node's `ssh-keys` metadata; the key pair is made
    (~/.ssh/google_compute_engine) when the spec names none and it does not exist yet."""
    from podrun.transport.client_keys import ensure_key_pair  # asyncssh loads only here

    user, key_path = _user_and_key(spec)
    return f"{user}:{ensure_key_pair(key_path, user, create=not spec.ssh.identity_file)}"


def _has_key(ssh_keys: str, key_line: str) -> bool:
    """Whether `user:type blob ...` is among the metadata's lines (comments may differ)."""
    user, _, key = key_line.partition(":")
    wanted = key.split()[:2]
    for line in ssh_keys.splitlines():
        line_user, _, line_key = line.partition(":")
        if line_user == user and line_key.split()[:2] == wanted:
            return True
    return False
