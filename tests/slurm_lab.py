"""The Slurm lab (docs/design.md: How it is tested): a real Slurm cluster on this machine.

A login node (slurmctld, sshd) and compute nodes (slurmd, sshd), each a network namespace on a bridge of
its own (10.97.0.0/24: the SSH lab of tests/lab.py keeps 10.99.0.0/20, and both may run at once), with
its own host name (Slurm's node name), one /etc/hosts naming every node, and ONE home directory shared by
all (bound over /root), as on a cluster's shared file system. Slurm's config is the lab's own
(proctrack/linuxproc, task/none or task/affinity, select/cons_tres, no slurmdbd so no sacct, no
cgroups), mounted at /etc/slurm in each node's mount namespace, where Slurm commands run over SSH find
it; munge runs with a key of the lab's own. Python and torch are shared with this machine, as in the SSH lab.

    with SlurmLab(workdir) as cluster:
        cluster.slurm("squeue --json"), cluster.run(cluster.login, "srun -N2 hostname"), cluster.ssh_args()

Pitfalls met building it (docs/design.md, How it is tested): the daemons run under
`nsenter --net=/run/netns/X` in mount and UTS namespaces of their own (`ip netns exec` remounts /sys
without the cgroups slurmd reads); slurmctld starts only where the host name is SlurmctldHost and
slurmd takes its node name from its host name; daemons inherit open descriptors (Popen closes them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lab import (
    SITE,
    StartStop,
    _sh,
    _wait_for_port,
    add_bridge,
    add_namespace,
    python_under_root,
    remove_namespace,
    sshd_config,
)

# one cluster per lab site (tests/lab.py SITE): its own bridge, /24 and namespace names
BRIDGE = f"podrunslurm{SITE}"
BRIDGE_IP = f"10.97.{SITE}.1"
PREFIX = 24
LOGIN_IP = f"10.97.{SITE}.10"  # compute node i (from 1) is 10.97.SITE.10+i
NAMESPACE_PREFIX = "podrunslurm" if SITE == 0 else f"podrunslurm{SITE}"
VETH_PREFIX = "psv" if SITE == 0 else f"ps{SITE}v"
LOGIN = "slurm-login"
NODE = "slurm-node{}"  # Slurm's NodeName and the node's host name
CLUSTER = "podrunlab"
START_TIMEOUT_S = 30
TOOLS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "sinfo", "srun")

SLURM_CONF = """\
# the Slurm lab's cluster (tests/slurm_lab.py)
ClusterName={cluster}
SlurmctldHost={login}({login_ip})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.socket.2
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/run/slurmctld.pid
SlurmdPidFile={dir}/run/slurmd.%n.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={dir}/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin={task_plugin}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# a node that was down comes back when its slurmd registers
ReturnToService=2
# nodes count as having what they are declared with (more CPUs than this machine's 2 cores)
SlurmdParameters=config_overrides
# seconds between a job's SIGTERM and SIGKILL on scancel or its time limit (the default is 30)
KillWait={kill_wait}
# a finished job stays in `squeue --states=all` and `scontrol show job` this long (seconds)
MinJobAge={min_job_age}
{gres_types}NodeName={nodes} NodeAddr={node_ips} CPUs={cpus} RealMemory={memory}{gres} State=UNKNOWN
{partitions}
"""
GRES_CONF = "NodeName={nodes} Name=gpu Count={gpus}\n"


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: tuple[str, ...]
    max_time: str  # as slurm.conf and sinfo write it: "1:00:00"
    max_time_s: int
    default: bool = False

    def conf_line(self) -> str:
        return (f"PartitionName={self.name} Nodes={','.join(self.nodes)} MaxTime={self.max_time} "
                f"Default={'YES' if self.default else 'NO'} State=UP")


@dataclass
class SlurmNode:
    name: str  # its host name and Slurm node name
    ip: str
    namespace: str
    veth: str
    dir: Path  # its sshd's config and keys, and its logs
    anchor: subprocess.Popen | None = None  # its sshd: the process whose namespaces are the node's
    daemon: subprocess.Popen | None = None  # slurmctld on the login node, slurmd on a compute node


@dataclass
class SlurmLab(StartStop):
    workdir: Path
    compute_nodes: int = 3
    cpus: int = 4  # per compute node
    # task/none binds nothing; task/affinity binds each task to its CPUs, as on most clusters (then `cpus` must be at
    # most this machine's: the nodes' CPUs are its own)
    task_plugin: str = "task/none"
    gpus: int = 0  # per compute node: a count-only GRES (no devices), for --gpus-per-node
    kill_wait_s: int = 5
    min_job_age_s: int = 300
    # channels the login node's sshd allows on one connection (MaxSessions): the suite's refuses a third, as
    # sshd's default (10) refuses an eleventh, so that podrun's channels past it (a node's step or command
    # each) go on further connections at any node count; benchmarks take the default
    login_sessions: int = 2
    login: SlurmNode = field(init=False)
    nodes: list[SlurmNode] = field(init=False)  # the compute nodes
    partitions: list[Partition] = field(init=False)
    bring_up_s: float = 0.0  # seconds from start() to every node idle in sinfo
    munged: subprocess.Popen | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        base = LOGIN_IP.rsplit(".", 1)
        first = int(base[1])
        self.login = SlurmNode(LOGIN, LOGIN_IP, f"{NAMESPACE_PREFIX}-login", f"{VETH_PREFIX}0", self.workdir / "login")
        self.nodes = [SlurmNode(NODE.format(i), f"{base[0]}.{first + i}", f"{NAMESPACE_PREFIX}-node{i}", f"{VETH_PREFIX}{i}",
                                self.workdir / f"node{i}") for i in range(1, self.compute_nodes + 1)]
        names = tuple(node.name for node in self.nodes)
        self.partitions = [Partition("debug", names, "1:00:00", 3600, default=True),
                           Partition("short", names[:1], "00:02:00", 120)]

    # what tests use

    @property
    def home(self) -> Path:
        """The home directory every node sees as /root."""
        return self.workdir / "home"

    @property
    def client_key(self) -> Path:
        """The private key that logs in to every node as root."""
        return self.workdir / "client_ed25519"

    @property
    def login_address(self) -> str:
        return f"root@{self.login.ip}"

    @property
    def all_nodes(self) -> list[SlurmNode]:
        return [self.login, *self.nodes]

    @property
    def hosts_file(self) -> Path:
        """What every node sees as /etc/hosts."""
        return self.workdir / "etc" / "hosts"

    @property
    def conf_dir(self) -> Path:
        """What every node sees as /etc/slurm (slurm.conf, gres.conf)."""
        return self.workdir / "etc" / "slurm"

    def partition(self, name: str) -> Partition:
        return next(p for p in self.partitions if p.name == name)

    def ssh_args(self, node: SlurmNode | None = None) -> list[str]:
        """A plain OpenSSH client command prefix for `node` (the login node if None)."""
        node = node or self.login
        return ["ssh", "-i", str(self.client_key), "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
                f"root@{node.ip}"]

    def nsenter(self, node: SlurmNode | None = None) -> list[str]:
        """A command prefix that runs a program on `node` (the login node if None): in its network, mount
        (its /root, /etc/hosts, /etc/slurm) and UTS (its host name) namespaces, as its sshd runs sessions."""
        node = node or self.login
        assert node.anchor is not None, f"{node.name} is not up"
        return ["nsenter", "-t", str(node.anchor.pid), "-n", "-m", "-u"]

    def run(self, node: SlurmNode | None, command: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """A shell command on `node` (the login node if None), to its end, output captured as text."""
        return subprocess.run([*self.nsenter(node), "sh", "-c", command], capture_output=True, text=True,
                              timeout=timeout, **kwargs)

    def popen(self, node: SlurmNode | None, argv: list[str], **kwargs) -> subprocess.Popen:
        """A long-running program on `node` (the login node if None)."""
        return subprocess.Popen([*self.nsenter(node), *argv], **kwargs)

    def slurm(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """A Slurm command (any shell command) on the login node: `lab.slurm("squeue --json")`."""
        return self.run(self.login, command, timeout=timeout)

    def squeue(self, *args: str) -> list[dict]:
        """The jobs `squeue --json ARGS` lists on the login node: in Slurm 22.05 that is every job
        slurmctld still holds, finished ones too (for MinJobAge s), whatever --states says."""
        result = self.slurm("squeue --json " + " ".join(args))
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["jobs"]

    def queued(self) -> dict[str, str]:
        """What plain `squeue` lists (jobs pending, running or completing): job id -> state ("PD", "R", "CG")."""
        result = self.slurm("squeue -h -o '%i %t'")
        assert result.returncode == 0, result.stderr
        return dict(line.split() for line in result.stdout.splitlines() if line.strip())

    def node_states(self) -> dict[str, str]:
        """Each compute node's state as `sinfo` prints it ("idle", "alloc", "mix", "down*"...)."""
        result = self.slurm("sinfo -h -N -o '%N %t'")
        if result.returncode != 0:
            return {}
        return dict(line.split() for line in result.stdout.splitlines() if line.strip())

    def wait_until_idle(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until sinfo shows every compute node idle (its slurmd registered, no job on it)."""
        deadline = time.monotonic() + timeout
        while (states := self.node_states()) != {node.name: "idle" for node in self.nodes}:
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurm lab: nodes not idle after {timeout} s: {states}; "
                                   f"logs in {self.workdir / 'log'}")
            time.sleep(0.05)

    def wait_until_no_jobs(self, timeout: float = 30) -> None:
        """Until plain `squeue` lists no job (a cancelled one shows CG, completing, for a moment)."""
        deadline = time.monotonic() + timeout
        while jobs := self.queued():
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurm lab: jobs still queued after {timeout} s: {jobs}")
            time.sleep(0.05)

    def cancel_all(self) -> None:
        """Cancel every job and wait until squeue lists none."""
        self.slurm("scancel --user=root")
        self.wait_until_no_jobs()

    # bring-up and teardown

    def start(self) -> None:
        started = time.monotonic()
        self.stop()  # leftovers of a lab that was killed before it could clean up
        for name in ("state", "spool", "run", "log", "munge", "etc"):
            shutil.rmtree(self.workdir / name, ignore_errors=True)
            (self.workdir / name).mkdir(parents=True)
        for node in self.nodes:
            (self.workdir / "spool" / node.name).mkdir()
        self.home.mkdir(parents=True, exist_ok=True)
        self._write_config()
        if not self.client_key.exists():
            _sh(f"ssh-keygen -q -t ed25519 -N '' -C podrun-slurm-lab -f {self.client_key}")
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        add_bridge(BRIDGE, [f"{BRIDGE_IP}/{PREFIX}"])
        Path("/run/sshd").mkdir(exist_ok=True)
        for node in self.all_nodes:
            add_namespace(node.namespace, node.veth, BRIDGE, [f"{node.ip}/{PREFIX}"])
            self._start_anchor(node)
        for node in self.all_nodes:  # its sshd listens: its mounts and host name are made
            _wait_for_port(node.ip, 22)
        self.munged = self._daemon(self.login, ["/usr/sbin/munged", "--foreground", "--force",
                                                f"--socket={self.workdir}/munge/munge.socket.2",
                                                f"--key-file={self.workdir}/munge/munge.key",
                                                f"--pid-file={self.workdir}/munge/munged.pid",
                                                f"--seed-file={self.workdir}/munge/munged.seed",
                                                f"--log-file={self.workdir}/log/munged.log"], "munged")
        self._wait_for_file(self.workdir / "munge" / "munge.socket.2", "munged's socket")
        self.login.daemon = self._daemon(self.login, ["/usr/sbin/slurmctld", "-D", "-i"], "slurmctld")
        for node in self.nodes:
            node.daemon = self._daemon(node, ["/usr/sbin/slurmd", "-D"], "slurmd")
        self.wait_until_idle()
        self.bring_up_s = time.monotonic() - started

    def stop(self) -> None:
        """Kill everything on every node (daemons, sessions, jobs), delete the namespaces (their mounts
        go with their last process), the veths and the bridge. Safe to call at any time, again too."""
        for node in self.all_nodes:
            remove_namespace(node.namespace)
            subprocess.run(["ip", "link", "del", node.veth], capture_output=True)
            for process in (node.anchor, node.daemon):
                if process is not None:
                    process.wait()
            node.anchor = node.daemon = None
        if self.munged is not None:
            self.munged.wait()
            self.munged = None
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)

    def _write_config(self) -> None:
        etc = self.workdir / "etc"
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        names = ",".join(node.name for node in self.nodes)
        (self.conf_dir / "slurm.conf").write_text(SLURM_CONF.format(
            cluster=CLUSTER, login=LOGIN, login_ip=LOGIN_IP, dir=self.workdir, nodes=names,
            node_ips=",".join(node.ip for node in self.nodes), cpus=self.cpus, memory=4000,
            gres_types="GresTypes=gpu\n" if self.gpus else "", gres=f" Gres=gpu:{self.gpus}" if self.gpus else "",
            kill_wait=self.kill_wait_s, min_job_age=self.min_job_age_s, task_plugin=self.task_plugin,
            partitions="\n".join(p.conf_line() for p in self.partitions)))
        (self.conf_dir / "gres.conf").write_text(GRES_CONF.format(nodes=names, gpus=self.gpus))
        (etc / "plugstack.conf").write_text("")
        self.hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{node.ip} {node.name}\n"
                                                                     for node in self.all_nodes))
        key = self.workdir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)

    def _start_anchor(self, node: SlurmNode) -> None:
        """The node's sshd, in the node's network namespace and new mount and UTS namespaces of its own
        (under nsenter, not `ip netns exec`, which remounts /sys without the cgroups slurmd reads)."""
        node.dir.mkdir(parents=True, exist_ok=True)
        for path in node.dir.glob("ssh_host_ed25519_key*"):
            path.unlink()
        _sh(f"ssh-keygen -q -t ed25519 -N '' -C {node.name} -f {node.dir}/ssh_host_ed25519_key")
        config = sshd_config([node.ip], node.dir)
        if node is self.login:
            config = config.replace("MaxSessions 100", f"MaxSessions {self.login_sessions}")
        (node.dir / "sshd_config").write_text(config)
        mounts = [*python_under_root(self.home), f"hostname {node.name}",
                  f"mount --bind {self.hosts_file} /etc/hosts", f"mount --bind {self.conf_dir} /etc/slurm",
                  f"mount --rbind {self.home} /root"]
        script = " && ".join([*mounts, f"exec /usr/sbin/sshd -D -e -f {node.dir}/sshd_config"])
        node.anchor = subprocess.Popen(["nsenter", f"--net=/run/netns/{node.namespace}", "unshare", "-m", "-u",
                                        "--propagation", "private", "sh", "-c", script],
                                       stdin=subprocess.DEVNULL, stderr=open(node.dir / "sshd.log", "ab"))

    def _daemon(self, node: SlurmNode, argv: list[str], name: str) -> subprocess.Popen:
        log = open(self.workdir / "log" / f"{name}.{node.name}.out", "ab")
        with log:
            return self.popen(node, argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def _wait_for_file(self, path: Path, what: str, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurm lab: no {what} after {timeout} s; logs in {self.workdir / 'log'}")
            time.sleep(0.01)


def slurm_lab_problem() -> str | None:
    """Why the Slurm lab cannot run here (beyond the SSH lab's needs), or None."""
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"the Slurm lab needs {tool}: apt-get install slurmctld slurmd slurm-client munge"
    return None


@pytest.fixture(scope="session")
def slurm_lab(tmp_path_factory):
    """A real Slurm cluster (SlurmLab: a login node and 3 compute nodes), shared by the session and torn
    down even after failures."""
    if problem := slurm_lab_problem():
        if os.environ.get("PODRUN_TESTS_REQUIRE_ALL"):
            pytest.fail(f"lab: {problem} (.ci/run installs it)", pytrace=False)
        pytest.skip(f"lab: {problem}")
    with SlurmLab(tmp_path_factory.mktemp("slurm-lab")) as cluster:
        yield cluster


if __name__ == "__main__":  # bring the lab up, print what it is, wait for Enter, tear it down
    import sys
    import tempfile

    with SlurmLab(Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="slurm-lab-"))) as cluster:
        print(f"up in {cluster.bring_up_s:.2f} s; ssh: {' '.join(cluster.ssh_args())}")
        print(cluster.slurm("sinfo").stdout)
        if sys.stdin.isatty():
            input("Enter tears it down ")
