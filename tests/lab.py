"""The test lab (docs/design.md: How it is tested): N real SSH hosts on this machine.

Each host is a network namespace on one bridge with its own address (10.99.0.10 for host 0, 200
hosts per /24 of 10.99.0.0/20, in site 0 of up to 8 labs that run side by side: `SITE`), its own sshd
and its own home directory (sshd runs under `unshare -m` with a directory bound over /root, and
one over /home for other users), so a file shipped to one host is not on another. Its cron spool is
its own too (where the machine has one, a directory bound over CRON_SPOOL): `crontab` on a host never
edits this machine's crontabs. Each has its own
hostname (`unshare -u`), which its own /etc/hosts maps to 127.0.0.1, as many cloud images do: the
trap that makes gloo and NCCL advertise loopback (`hosts_file` holds it, for a test to change).
Python and torch are shared, so real torchrun runs on every host and rendezvouses over real TCP.
Needs root, iproute2, openssh-server and util-linux. Traffic only ever goes to these lab addresses.

    with Lab(4, workdir) as lab:
        lab.hosts[0].ip, lab.client_key, lab.run(0, "ps -e")
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar


def _site() -> int:
    """Which of up to 8 labs on this machine this process's is: a pytest-xdist worker's number plus one
    (gw0 is site 1), else 0 (a serial run, a benchmark). Each site has its own bridge, addresses and
    namespace names, so the suite's parallel workers each run a lab of their own beside a serial one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    site = int(worker.removeprefix("gw")) + 1 if worker else 0
    if site >= 8:
        raise RuntimeError(f"lab: pytest-xdist worker {worker} has no lab site: run at most 7 workers (-n)")
    return site


SITE = _site()
NETWORK = f"10.99.{32 * SITE}.0/20"  # room for 3,200 hosts (a v5p-12288 has 1,536)
BRIDGE_IP = f"10.99.{32 * SITE}.1"
# a second address per host, for the TPU stand-in's externalIp (podrun connects to it, while the
# workers reach each other on the first, internal one)
EXTERNAL_NETWORK = f"10.99.{32 * SITE + 16}.0/20"
EXTERNAL_BRIDGE_IP = f"10.99.{32 * SITE + 16}.1"
FIRST_HOST = 10
CRON_SPOOL = "/var/spool/cron/crontabs"  # Debian's and Ubuntu's
HOSTS_PER_OCTET = 200
BRIDGE = f"podrunlab{SITE}"
NAMESPACE_PREFIX = "podrunlab" if SITE == 0 else f"podrun{SITE}lab"  # host i's network namespace: PREFIX + i
VETH_PREFIX = "plv" if SITE == 0 else f"pl{SITE}v"  # host i's side of the bridge: PREFIX + i
# an sshd's settings after its ListenAddress lines (`sshd_config`)
SSHD_SETTINGS = """\
Port 22
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
# the launcher opens one connection per host, but benchmarks and gcloud open more at once
MaxStartups 200:30:400
MaxSessions 100
LogLevel ERROR
Subsystem sftp internal-sftp
"""
LOOPBACK_HOSTS = "127.0.0.1 localhost\n127.0.0.1 {hostname}\n"


def require_lab_tools() -> str | None:
    """Why the lab cannot run here, or None."""
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces)"
    for tool in ("ip", "unshare", "ssh-keygen", "/usr/sbin/sshd"):
        if shutil.which(tool) is None:
            return f"the lab needs {tool}: apt-get install iproute2 util-linux openssh-server openssh-client"
    return None


@dataclass
class LabHost:
    index: int
    ip: str
    external_ip: str
    namespace: str
    dir: Path  # sshd's config and keys
    home: Path  # what the host's processes see as /root
    sshd: subprocess.Popen | None = None

    @property
    def homes(self) -> Path:
        """What the host's processes see as /home: other users' homes (an OS Login user's), its own."""
        return self.dir / "home"

    @property
    def hostname(self) -> str:
        return f"podrun-lab{self.index}"

    @property
    def cron_spool(self) -> Path:
        """What the host's `crontab` sees as CRON_SPOOL."""
        return self.dir / "crontabs"

    @property
    def hosts_file(self) -> Path:
        """What the host's processes see as /etc/hosts."""
        return self.dir / "hosts"

    def host_key(self) -> str:
        """Its sshd's public key, "ssh-ed25519 AAAA... comment"."""
        return (self.dir / "ssh_host_ed25519_key.pub").read_text().strip()


StartStopT = TypeVar("StartStopT", bound="StartStop")


class StartStop:
    """A lab as a context manager: start() on entering (stop() too when start() fails), stop() on leaving."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self: StartStopT) -> StartStopT:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Lab(StartStop):
    def __init__(self, count: int, workdir: Path):
        self.workdir = Path(workdir)
        self.sshd_extra = ""  # sshd_config lines after SSHD_SETTINGS (set_sshd_extra)
        self.client_key = self.workdir / "client_ed25519"
        self.hosts = [LabHost(i, _address(NETWORK, i), _address(EXTERNAL_NETWORK, i), f"{NAMESPACE_PREFIX}{i}",
                              self.workdir / f"host{i}", self.workdir / f"host{i}" / "root")
                      for i in range(count)]

    def start(self) -> None:
        self.stop()  # leftovers of a lab that was killed before it could clean up
        self.workdir.mkdir(parents=True, exist_ok=True)
        _sh(f"ssh-keygen -q -t ed25519 -N '' -C podrun-lab -f {self.client_key}")
        _raise_neighbour_limits(2 * len(self.hosts))
        add_bridge(BRIDGE, [f"{BRIDGE_IP}/20", f"{EXTERNAL_BRIDGE_IP}/20"])
        Path("/run/sshd").mkdir(exist_ok=True)
        for host in self.hosts:
            self._add_host(host)

    def authorize(self, index: int, extra_keys: str = "") -> None:
        """Host `index` accepts the lab's client key and `extra_keys` (authorized_keys lines) for root."""
        ssh_dir = self.hosts[index].home / ".ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text() + extra_keys)

    def _add_host(self, host: LabHost) -> None:
        add_namespace(host.namespace, f"{VETH_PREFIX}{host.index}", BRIDGE, [f"{host.ip}/20", f"{host.external_ip}/20"])
        self.authorize(host.index)
        host.hosts_file.write_text(LOOPBACK_HOSTS.format(hostname=host.hostname))
        _make_host_key(host)
        host.homes.mkdir()
        if os.path.isdir(CRON_SPOOL):  # as the machine's: crontab (setgid crontab) writes there
            spool = os.stat(CRON_SPOOL)
            host.cron_spool.mkdir()
            os.chown(host.cron_spool, spool.st_uid, spool.st_gid)
            os.chmod(host.cron_spool, spool.st_mode & 0o7777)
        (host.dir / "sshd_config").write_text(sshd_config([host.ip, host.external_ip], host.dir))
        self.start_sshd(host.index)

    def set_sshd_extra(self, lines: str) -> None:
        """Every host's sshd takes `lines` of sshd_config too ("": none), from now on: each is restarted."""
        self.sshd_extra = lines
        for host in self.hosts:
            (host.dir / "sshd_config").write_text(sshd_config([host.ip, host.external_ip], host.dir) + lines)
            if host.sshd and host.sshd.poll() is None:
                self.stop_sshd(host.index)
                self.start_sshd(host.index)

    def renew_host_key(self, index: int) -> None:
        """Host `index` as a VM made again: its sshd (stopped first, if it runs) serves a host key made now."""
        host = self.hosts[index]
        if host.sshd and host.sshd.poll() is None:
            self.stop_sshd(index)
        _make_host_key(host)
        self.start_sshd(index)

    def start_sshd(self, index: int) -> None:
        host = self.hosts[index]
        # this Python lives under /root (pyenv): keep it visible under the host's own /root
        mounts = [*python_under_root(host.home), f"echo {host.hostname} > /proc/sys/kernel/hostname",
                  f"mount --bind {host.hosts_file} /etc/hosts", f"mount --rbind {host.home} /root",
                  f"mount --bind {host.homes} /home",
                  *([f"mount --bind {host.cron_spool} {CRON_SPOOL}"] if host.cron_spool.is_dir() else [])]
        script = " && ".join(mounts + [f"exec /usr/sbin/sshd -D -e -f {host.dir}/sshd_config"])
        host.sshd = subprocess.Popen(["ip", "netns", "exec", host.namespace, "unshare", "-m", "-u", "sh", "-c", script],
                                     stdin=subprocess.DEVNULL, stderr=open(host.dir / "sshd.log", "ab"))
        _wait_for_port(host.ip, 22)

    def stop(self) -> None:
        for host in self.hosts:
            remove_namespace(host.namespace)
            if host.sshd:
                host.sshd.wait()
                host.sshd = None
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)

    def run(self, index: int, command: str) -> subprocess.CompletedProcess:
        """A command on host `index`, in its namespaces (its network, its /root, its hostname), as sshd runs them."""
        sshd_pid = self.hosts[index].sshd.pid  # ip netns exec, unshare and `sh -c 'exec sshd'` keep one pid
        return subprocess.run(["nsenter", "-t", str(sshd_pid), "-n", "-m", "-u", "sh", "-c", command],
                              capture_output=True, text=True, timeout=60)

    def popen(self, index: int, argv: list[str]) -> subprocess.Popen:
        """A long-running process on host `index`, in its namespaces."""
        return subprocess.Popen(["nsenter", "-t", str(self.hosts[index].sshd.pid), "-n", "-m", "-u", *argv],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)

    @contextlib.contextmanager
    def names_resolving_to_addresses(self, indices):
        """Hosts `indices` map their own names to their addresses, as a well-made image does, until the
        block ends (the other hosts keep 127.0.0.1)."""
        for index in indices:
            host = self.hosts[index]
            host.hosts_file.write_text(f"127.0.0.1 localhost\n{host.ip} {host.hostname}\n")
        try:
            yield
        finally:
            for index in indices:
                self.hosts[index].hosts_file.write_text(LOOPBACK_HOSTS.format(hostname=self.hosts[index].hostname))

    def stop_sshd(self, index: int) -> None:
        """Stop the host's sshd (the host stays up: its address answers, its port 22 refuses)."""
        host = self.hosts[index]
        host.sshd.kill()
        host.sshd.wait()

    def ssh_args(self, index: int) -> list[str]:
        """A plain OpenSSH client command prefix for host `index` (the raw baseline)."""
        return ["ssh", "-i", str(self.client_key), "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
                f"root@{self.hosts[index].ip}"]


def add_bridge(bridge: str, addresses: list[str]) -> None:
    """A bridge with `addresses` ("10.99.0.1/20"), up: this machine's side of a lab's network."""
    _sh(f"ip link add {bridge} type bridge && "
        + "".join(f"ip addr add {address} dev {bridge} && " for address in addresses) + f"ip link set {bridge} up")


def add_namespace(namespace: str, veth: str, bridge: str, addresses: list[str]) -> None:
    """Network namespace `namespace` joined to `bridge` by veth pair `veth`/`veth`p, seen inside as eth0
    with `addresses` ("10.99.0.10/20"), and its loopback up."""
    # the kernel deletes a namespace's devices after `ip netns del` returns: a veth of a namespace of
    # that name made before may linger a moment, and the bridge may keep its address's old MAC
    subprocess.run(["ip", "link", "del", veth], capture_output=True)
    subprocess.run(["ip", "neigh", "flush", "dev", bridge], capture_output=True)
    _sh(f"ip netns add {namespace} && ip link add {veth} type veth peer name {veth}p && "
        f"ip link set {veth}p netns {namespace} && ip link set {veth} master {bridge} up && "
        f"ip -n {namespace} link set {veth}p name eth0 && "
        + "".join(f"ip -n {namespace} addr add {address} dev eth0 && " for address in addresses)
        + f"ip -n {namespace} link set eth0 up && ip -n {namespace} link set lo up")


def remove_namespace(namespace: str) -> None:
    """Kill every process in network namespace `namespace` (SIGKILL), then delete it; nothing if it is absent."""
    if Path(f"/run/netns/{namespace}").exists():
        pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def sshd_config(addresses: list[str], directory: Path) -> str:
    """A lab sshd's configuration: listening on `addresses`, its host key and pid file in `directory`."""
    return "".join(f"ListenAddress {address}\n" for address in addresses) + SSHD_SETTINGS.format(dir=directory)


def python_under_root(home: Path) -> list[str]:
    """Shell commands that keep this Python visible under a lab host's own /root (`home`, bound over /root
    after them) where it lives under /root (pyenv); none where it does not."""
    if not sys.base_prefix.startswith("/root/"):
        return []
    inside = home / sys.base_prefix.removeprefix("/root/")
    inside.mkdir(parents=True, exist_ok=True)
    return [f"mount --bind {sys.base_prefix} {inside}"]


def _address(network: str, index: int) -> str:
    base = ipaddress.ip_network(network).network_address
    return str(base + 256 * (index // HOSTS_PER_OCTET) + FIRST_HOST + index % HOSTS_PER_OCTET)


def _raise_neighbour_limits(entries: int) -> None:
    """Room in this machine's ARP table for `entries` neighbours (each host's two addresses): past
    gc_thresh2 (512 by default) the kernel drops entries, and with 512 hosts, 38 of them were
    "No route to host" ("neighbor table overflow" in dmesg). Limits are only ever raised. They are the
    machine's: a network namespace of its own (a parallel test worker's) shows none of them."""
    for name, wanted in (("gc_thresh1", entries), ("gc_thresh2", 2 * entries), ("gc_thresh3", 4 * entries)):
        path = Path(f"/proc/sys/net/ipv4/neigh/default/{name}")
        if not path.exists():
            return
        if int(path.read_text()) < wanted:
            path.write_text(str(wanted))


def _make_host_key(host: LabHost) -> None:
    for path in host.dir.glob("ssh_host_ed25519_key*"):
        path.unlink()
    _sh(f"ssh-keygen -q -t ed25519 -N '' -C {host.hostname} -f {host.dir}/ssh_host_ed25519_key")


def _sh(command: str) -> None:
    result = subprocess.run(command, shell=True, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"lab: {command!r} failed: {result.stderr.strip()}")


def _wait_for_port(ip: str, port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((ip, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"lab: sshd on {ip}:{port} did not come up") from None
            time.sleep(0.02)
