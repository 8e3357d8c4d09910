"""Helpers the test modules share (test modules never import from each other; conftest.py holds only
fixtures and hooks): podrun run as a user runs it, a job's processes, waiting for a condition or an output
line (never a sleep), the CLI run in-process, the lab's flags and processes, trees of shipped code, the TPU
API stand-in's leftovers and gcloud's reading of it."""

from __future__ import annotations

import ast
import contextlib
import ctypes
import fcntl
import hashlib
import io
import json
import os
import queue
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

from podrun import jobstore, progress, timeline
from podrun.cli import main
from podrun.shipping.scan import scan

# --- a parallel test worker's network

CLONE_NEWNET = 0x40000000
_machines_network: int | None = None  # the machine's network namespace, open, once this worker left it


def network_of_its_own() -> None:
    """This process's main thread, which runs the tests and starts their processes and threads, in a new
    network namespace with its loopback up; the machine's stays reachable (`on_the_machines_network`)."""
    global _machines_network
    _machines_network = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) for a test worker's network of its own")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    resolv_conf = Path("/etc/resolv.conf").read_text() if Path("/etc/resolv.conf").exists() else ""
    for nameserver in re.findall(r"^nameserver\s+(\d+\.\d+\.\d+\.\d+)", resolv_conf, re.MULTILINE):
        _answer_no_such_name(nameserver)


def _answer_no_such_name(address: str) -> None:
    """The machine's name server, here, knowing no name: NXDOMAIN for every query, as the machine's answers a
    name it does not know, where an unreachable one would make every lookup outside /etc/hosts a temporary
    failure that only this network sees (and, under torchrun, a warning from every worker)."""
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind((address, 53))

    def serve() -> None:
        while True:
            query, sender = server.recvfrom(512)
            if b"\0" not in query[12:]:
                continue  # not a query: no name in it
            question_end = query.index(b"\0", 12) + 5  # the name's labels, their end, its type and class
            flags = 0x8000 | (int.from_bytes(query[2:4], "big") & 0x7900) | 0x0080 | 3  # a reply: no such name
            header = query[:2] + flags.to_bytes(2, "big") + (1).to_bytes(2, "big") + bytes(6)
            server.sendto(header + query[12:question_end], sender)

    threading.Thread(target=serve, daemon=True, name="no-such-name").start()


def on_the_machines_network(argv: list[str]) -> list[str]:
    """`argv` as a command that runs in the machine's network namespace, where its package index is
    reachable, also from a test worker with a network of its own."""
    if _machines_network is None:
        return argv
    return ["nsenter", f"--net=/proc/{os.getpid()}/fd/{_machines_network}", *argv]


# --- podrun as a user runs it: a process, its output, its job's processes

FUZZ_SCALE = int(os.environ.get("PODRUN_FUZZ_SCALE", "1"))


def examples(count: int) -> int:
    """A property's number of examples: `count` in CI, more under scripts/fuzz.py."""
    return count * FUZZ_SCALE


REPO = Path(__file__).resolve().parents[1]


JOB_ID_LINE = re.compile(r"^podrun: job (\S+): ", re.MULTILINE)


# a spec's run that does what the README advises: save on SIGTERM, then exit 0 (each worker says "up N", then "saved N")
SAVES_ON_SIGTERM = ("run: |\n  trap 'echo \"saved $PODRUN_WORKER\"; exit 0' TERM\n"
                    "  echo \"up $PODRUN_WORKER\"; sleep 300 & wait\n")


def podrun(*args: str, timeout: float = 120, text: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run the real CLI to completion, capturing its output (as bytes when text=False)."""
    return subprocess.run([sys.executable, "-m", "podrun", *map(str, args)], capture_output=True, text=text,
                          timeout=timeout, cwd=REPO, **kwargs)


OWN_USAGE = ("import os, re, sys; from podrun import cli; code = cli.main(sys.argv[1:]); times = os.times(); "
             "peak = re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read())[1]; "
             "print('own usage', peak, times.user + times.system, file=sys.stderr); cli._exit(code)")


def podrun_own_usage(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run the real CLI as podrun() does, with its own peak RSS (MB, VmHWM) and CPU seconds, for its process
    alone: wait4's would count its agents and workers, and a process that subprocess starts with vfork begins
    with its parent's peak (a test's that captured 200 MB)."""
    result = subprocess.run([sys.executable, "-c", OWN_USAGE, *map(str, args)], capture_output=True,
                            timeout=timeout, cwd=REPO)
    usage = re.search(rb"own usage (\d+) (\S+)\n\Z", result.stderr)
    assert usage, result.stderr[-2000:]
    return result, int(usage[1]) / 1024, float(usage[2])


IMPORT_PROBE = """
import sys
sys.argv = ["podrun", *{args!r}]
from podrun.cli import main
main()
packages = {packages!r}
print("IMPORTED", sorted(name for name in sys.modules if any(name == p or name.startswith(p + ".") for p in packages)))
"""


def modules_imported_by(args: list[str], packages: tuple[str, ...]) -> list[str]:
    """The modules of `packages` (names like "google" or "google.cloud.tpu_v2") that `podrun ARGS`
    imports, run to its end in a fresh interpreter."""
    probe = subprocess.run([sys.executable, "-c", IMPORT_PROBE.format(args=list(map(str, args)), packages=packages)],
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    imported = [line for line in probe.stdout.splitlines() if line.startswith("IMPORTED ")]
    assert imported, probe.stderr
    return ast.literal_eval(imported[-1].removeprefix("IMPORTED "))


def run_in_terminal(args: list, rows: int, columns: int, timeout: float = 120,
                    interrupt_after: bytes | None = None, answer: bytes | None = None) -> tuple[int, bytes]:
    """Run podrun with a real pseudo-terminal as its stdin, stdout and stderr (sending it SIGINT once it
    wrote `interrupt_after`, if given; typing `answer` and Enter when it asks `[y/N]`); returns its
    exit code and all it wrote to the terminal."""
    controller, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    process = subprocess.Popen([sys.executable, "-m", "podrun", *map(str, args)], cwd=REPO,
                               stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    written = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if interrupt_after is not None and interrupt_after in written:
            process.send_signal(signal.SIGINT)
            interrupt_after = None
        if select.select([controller], [], [], 0.1)[0]:
            try:
                written += os.read(controller, 65536)
            except OSError:  # EIO: nothing has the terminal open any more
                break
            if answer is not None and written.endswith(b"[y/N] "):
                os.write(controller, answer + b"\n")
        elif process.poll() is not None:
            break
    os.close(controller)
    return process.wait(timeout=10), bytes(written)


def job_id_in(stderr: str) -> str:
    match = JOB_ID_LINE.search(stderr)
    assert match, f"no job id announced in:\n{stderr}"
    return match.group(1)


def live_processes() -> list[tuple[int, str, list[bytes]]]:
    """Every live (not zombie) process, the lab hosts' too (they share this machine's pid namespace):
    (pid, its command line, its environment's entries)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z":
            found.append((int(entry), command, environ))
    return found


def processes_of_job(job_id: str) -> list[str]:
    """Every live process whose environment carries PODRUN_JOB_ID=job_id (what `ps e` shows)."""
    marker = f"PODRUN_JOB_ID={job_id}".encode()
    return [f"{pid} {command}" for pid, command, environ in live_processes() if marker in environ]


def wait_until(condition, what: str, timeout: float = 15) -> float:
    """Poll a condition the system under test will make true (not a sleep standing in for it);
    returns the seconds it took."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - started


def crashed(output: str) -> bool:
    """Whether podrun ended in a traceback, or caught one as an internal error (cli.main)."""
    return "Traceback" in output or "podrun: internal error:" in output


def stderr_lines_without_traceback(stderr: str) -> list[str]:
    assert not crashed(stderr), stderr
    return [line for line in stderr.splitlines() if line.strip()]


class Background:
    """podrun running in the background; its output lines arrive in a queue as they are printed."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen([sys.executable, "-m", "podrun", *map(str, args)], cwd=REPO,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        """The first line, printed so far or until `timeout`, that matches `pattern`; fails if the output
        ends or time runs out first."""
        for line in self.lines:
            if re.search(pattern, line):
                return line
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} within {timeout}s; got:\n"
                                     + "\n".join(self.lines)) from None
            if line is None:
                raise AssertionError(f"output ended before {pattern!r}; got:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if re.search(pattern, line):
                return line

    def finish(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout=timeout)
        while (line := self._queue.get(timeout=timeout)) is not None:
            self.lines.append(line)
        return code

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


# the lab host that plays a supervisor (the `supervisor` fixture); `tpu_api_on_lab` never hands it out
SUPERVISOR_HOST = 3


LAPTOP_TOKEN = "stand-in-token"  # what the test process's gcloud settings hold


SUPERVISOR_TOKEN = "supervisor-token"  # what the supervisor host's own gcloud configuration holds


class SupervisorHost:
    """Lab host SUPERVISOR_HOST set up as a user sets up a supervisor: its own gcloud configuration in its
    home (`[auth] access_token_file` with a token of its own, SUPERVISOR_TOKEN, and nothing else: the
    project, zone and API endpoint are the laptop's to send) and this checkout's podrun at `podrun`, a
    wrapper on a path the host sees (lab hosts share this machine's files but /root). `spec` is the spec
    line that hands a job to it; a spec's `ssh:` with the lab's key reaches it. Its podrun keeps its jobs
    in `home`/.podrun/jobs/ID (`job_dir`), as podrun on any host does."""

    def __init__(self, lab, tmp_path: Path):
        host = lab.hosts[SUPERVISOR_HOST]
        self.index, self.ip, self.home = host.index, host.ip, host.home
        gcloud = self.home / ".config" / "gcloud"
        (gcloud / "configurations").mkdir(parents=True, exist_ok=True)
        (gcloud / "token").write_text(SUPERVISOR_TOKEN + "\n")
        (gcloud / "active_config").write_text("default\n")
        (gcloud / "configurations" / "config_default").write_text("[auth]\naccess_token_file = /root/.config/gcloud/token\n")
        self.podrun = tmp_path / "podrun-on-supervisor"
        self.podrun.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m podrun \"$@\"\n")
        self.podrun.chmod(0o755)

    @property
    def address(self) -> str:
        return f"root@{self.ip}"

    @property
    def spec(self) -> str:
        return f"supervisor: {{host: {self.address}, podrun: {self.podrun}}}\n"

    def job_dir(self, job_id: str) -> Path:
        return self.home / ".podrun" / "jobs" / job_id

    def record(self, job_id: str) -> dict:
        return json.loads((self.job_dir(job_id) / "job.json").read_text())


# --- the CLI in this process

PYDANTIC_WORDS = re.compile(r"Input should|instance of|should match pattern|type=|For further information|"
                            r"errors\.pydantic|model_type|[Vv]alidation error|Field required|Value error")


def run_cli(*args: str) -> tuple[int, str]:
    """podrun's main() in this process: (exit code, what it wrote to stderr)."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
        code = main(list(args))
    return code, errors.getvalue()


# --- the lab's hosts (tests/lab.py)

def lab_flags(lab, hosts=(0, 1, 2)) -> list[str]:
    """exec's target flags for lab hosts (by index), as root with the lab's key."""
    return ["--hosts", ",".join(lab.hosts[i].ip for i in hosts), "--user", "root", "--identity-file", str(lab.client_key)]


def ps_on_every_host(lab, job_id: str) -> list[str]:
    """What `ps` on each lab host shows of the job: processes whose environment carries its id."""
    found = []
    for host in lab.hosts:
        listing = lab.run(host.index, "ps axeww -o pid=,stat=,args=").stdout
        for line in listing.splitlines():
            pid, state, command = line.split(None, 2)
            if f"PODRUN_JOB_ID={job_id} " in command + " " and not state.startswith("Z"):
                found.append(f"host {host.index}: {pid} {command[:120]}")
    return found


@contextlib.contextmanager
def packets_dropped(match: str, table: str = "podrun_lab_cut"):
    """Every packet this machine sends that `match` (an nft rule's match, e.g. `ip daddr 10.99.0.10 tcp
    dport 22`) dropped until the block ends; the lab hosts' own packets, in their namespaces, go on."""
    from lab import SITE

    require_nft()
    table = f"{table}{SITE}"  # a table per lab site: parallel test workers add and delete their own
    subprocess.run(["nft", "add", "table", "ip", table], check=True)
    try:
        subprocess.run(["nft", f"add chain ip {table} out {{ type filter hook output priority 0; }}"], check=True)
        subprocess.run(["nft", f"add rule ip {table} out {match} drop"], check=True)
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "ip", table], check=True)


def bridge_sent_bytes() -> int:
    """Bytes this machine (the launcher's side) sent into the lab's bridge; traffic between lab
    hosts crosses the bridge without passing this machine's network stack."""
    from lab import BRIDGE

    return device_sent_bytes(BRIDGE)


def device_sent_bytes(device: str) -> int:
    """Bytes network device `device` has sent: the bridge's, or a lab host's side of it (lab.VETH_PREFIX +
    its index: what the host received). From /proc/net/dev, which shows this process's network namespace
    (/sys/class/net shows the one /sys was mounted in)."""
    for line in Path("/proc/self/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == device:
            return int(counters.split()[8])  # 8 received counters, then the bytes sent
    raise AssertionError(f"no device {device} in /proc/self/net/dev")


def require_nft() -> None:
    """Skip (fail where CI requires every facility) in one line without nft, before the test starts a job."""
    import pytest

    if shutil.which("nft") is None:
        missing = "a test that drops packets needs nft: apt-get install nftables"
        if os.environ.get("PODRUN_TESTS_REQUIRE_ALL"):
            pytest.fail(missing, pytrace=False)
        pytest.skip(missing)


def dropped_from_launcher(addresses: list[str]):
    """Every packet this machine (the launcher) sends to `addresses` dropped until the block ends; the lab
    hosts still reach each other (their traffic crosses the bridge without passing this machine's stack)."""
    return packets_dropped(f"ip daddr {{ {', '.join(addresses)} }}", "podrun_lab_drop")


@contextlib.contextmanager
def new_ssh_connections(lab, index: int):
    """Counts the TCP connections opened to host `index`'s sshd while the block runs (an nft counter in its
    own namespace); the block gets a function that reads the count."""
    require_nft()
    # each connection's source address and port, once: a SYN sent again is no new connection
    nft = ("nft add table ip podrun_count && "
           "nft 'add set ip podrun_count seen { type ipv4_addr . inet_service; size 65535; flags dynamic; }' && "
           "nft 'add chain ip podrun_count in { type filter hook input priority 0; }' && "
           "nft 'add rule ip podrun_count in tcp dport 22 tcp flags & (syn | ack) == syn "
           "add @seen { ip saddr . tcp sport }'")
    assert lab.run(index, nft).returncode == 0
    try:
        yield lambda: len(re.findall(r"[\d.]+ \. \d+", lab.run(index, "nft list set ip podrun_count seen").stdout))
    finally:
        lab.run(index, "nft delete table ip podrun_count")


def podrun_on_this_machine(home: Path) -> list[str]:
    """podrun's processes on this machine itself, outside every lab host's namespaces (what `ps` on the
    laptop shows): Python processes in this process's network namespace whose environment holds
    PODRUN_HOME=home, as every podrun the test starts (and anything it forks) does. "pid command" each."""
    marker = f"PODRUN_HOME={home}".encode()
    own_network = os.readlink("/proc/self/ns/net")
    found = []
    for pid, command, environ in live_processes():
        if pid == os.getpid() or marker not in environ:
            continue
        try:
            here = os.readlink(f"/proc/{pid}/ns/net") == own_network
            python = os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
        except OSError:
            continue
        if here and python:
            found.append(f"{pid} {command}")
    return found


# --- shipped code

BLOB_BYTES = 4_000_000


def tree_listing(root: Path) -> dict[str, tuple[str, str]]:
    """Every file under root: its kind (file, exec, link) and its content's sha256 (or link target)."""
    listing = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            relative = str(path.relative_to(root))
            if path.is_symlink():
                listing[relative] = ("link", os.readlink(path))
            else:
                kind = "exec" if os.access(path, os.X_OK) else "file"
                listing[relative] = (kind, hashlib.sha256(path.read_bytes()).hexdigest())
    return listing


def workdir_with_blob(spec: Path) -> Path:
    code = spec.parent / "code"
    (code / "weights.bin").write_bytes(os.urandom(BLOB_BYTES))  # incompressible: sent as it is
    (code / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    (code / "tool.sh").chmod(0o755)
    (code / "link").symlink_to("tool.sh")
    (code / "pkg").mkdir()
    (code / "pkg" / "model.py").write_text("import torch\n" * 20_000)  # compressible
    return code


def code_dirs(lab, hosts, spec: Path) -> list[Path]:
    """Where each host keeps this spec's code: ~/podrun/<name>/<content hash>."""
    digest = scan(spec.parent / "code").digest
    return [lab.hosts[index].home / "podrun" / spec.stem / digest for index in hosts]


# --- jobs on the Cloud TPU API stand-in (tests/tpu_stand_in.py)

ZONE = "us-central2-b"
PREEMPTED = 75  # exits.PREEMPTED, as the README documents it
# a run that says it started, then waits to be preempted on attempt 0 and succeeds on a later one
WAIT_FOR_PREEMPTION = ('echo "attempt $PODRUN_ATTEMPT on worker $PODRUN_WORKER"\n'
                       'if [ "$PODRUN_ATTEMPT" = 0 ]; then exec sleep 600; fi\n'
                       'echo "resumed on worker $PODRUN_WORKER"')


def gcloud(*args: str) -> subprocess.CompletedProcess:
    """The real `gcloud compute tpus tpu-vm ARGS` in the stand-in's zone, as JSON (tests calling it are
    marked `gcloud`)."""
    return subprocess.run(["gcloud", "compute", "tpus", "tpu-vm", *args, f"--zone={ZONE}", "--format=json"],
                          capture_output=True, text=True, timeout=60)


def create(name: str, accelerator_type: str = "v4-32", *flags: str) -> subprocess.CompletedProcess:
    result = podrun("create", accelerator_type, "--name", name, *flags)
    assert result.returncode == 0, result.stderr
    return result


def lifecycle_spec(job_file, run: str, tpu: str = "", files: dict[str, str] | None = None,
                   accelerator_type: str = "v4-16", **top: str) -> Path:
    """A spec whose target.tpu declares a v4-16 (2 lab hosts; or `accelerator_type`) named `life`, plus
    `tpu` fields, and its workdir with `files`."""
    lines = [f"target: {{tpu: {{name: life, accelerator_type: {accelerator_type}{', ' + tpu if tpu else ''}}}}}",
             "ssh: {user: root}", f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}", "run: |",
             *(f"  {line}" for line in run.splitlines()), *(f"{key}: {value}" for key, value in top.items())]
    return job_file("\n".join(lines) + "\n", files)


def left_in_api(tpu_api) -> tuple[list[str], list[str]]:
    """(queued resources, nodes) the stand-in holds, by short name, once pending deletions finish."""
    deadline = time.monotonic() + 30
    while True:
        with tpu_api.lock:
            tpu_api._advance()
            pending = any(op.outcome is None for op in tpu_api.operations.values())
            queued = sorted(name.rsplit("/", 1)[1] for name in tpu_api.queued)
            nodes = sorted(name.rsplit("/", 1)[1] for name in tpu_api.nodes)
        if not pending or time.monotonic() > deadline:
            return queued, nodes
        time.sleep(0.1)


def worker_exit(home: Path, worker: int, job_id: str) -> dict | None:
    """Local worker `worker`'s run.exit of the job, as its agent wrote it; None while its run goes on."""
    exit_file = home / "local" / f"w{worker}" / ".podrun" / "jobs" / job_id / "run.exit"
    return json.loads(exit_file.read_text()) if exit_file.exists() else None


def job_record(home: Path, job_id: str) -> dict:
    return json.loads((home / "jobs" / job_id / "job.json").read_text())


# --- a supervisor host's jobs (tests/supervisor/)

def supervised_tpu_spec(job_file, lab, supervisor, run: str) -> Path:
    """A spot v4-16 that exec creates (helpers.lifecycle_spec: `life`, two lab hosts), restarted after up
    to two preemptions and deleted at the end, handed over to the supervisor; the lab's key reaches it."""
    spec = lifecycle_spec(job_file, run, "spot: true", restarts="{max: 2, on: [preemption]}", delete_after="always")
    text = spec.read_text().replace("ssh: {user: root}", f"ssh: {{user: root, identity_file: {lab.client_key}}}")
    spec.write_text(text + supervisor.spec)
    return spec


def as_run(script: str) -> str:
    """A spec's `run:` holding these lines."""
    return "run: |\n" + "".join(f"  {line}\n" for line in script.splitlines())


def worker_log_on_the_laptop(job_id: str, worker: int) -> str:
    """What the laptop's `podrun logs ID --worker N` shows."""
    return podrun("logs", job_id, "--worker", str(worker)).stdout


def listed_as_json(job_id: str) -> dict:
    """The job as the laptop's `podrun jobs --json` gives it."""
    listed = podrun("jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    return next(job for job in json.loads(listed.stdout) if job["id"] == job_id)


def anything_of_the_job(job_id: str) -> list[str]:
    """The job's processes on this machine and on every lab host (they share its pid namespace): its
    workers (PODRUN_JOB_ID in their environment) and any process whose command line names the job."""
    marker = f"PODRUN_JOB_ID={job_id}".encode()
    return [f"{pid} {command}" for pid, command, environ in live_processes()
            if pid != os.getpid() and (job_id in command or marker in environ)]


# a run that prints, then waits until the test lets it go on (the lab hosts see this machine's /tmp)
UNTIL_RELEASED = ('echo "started on worker $PODRUN_WORKER"\n'
                  'until [ -e {release} ]; do sleep 0.1; done\n'
                  'echo "finished on worker $PODRUN_WORKER"\n')



def idle_watchers(lab) -> list[int]:
    """The idle watches running on this lab's hosts (the bootstrap on their command line names the script's
    cache entry); another test process's lab (pytest -n) has hosts of its own, in network namespaces of their own."""
    from podrun.transport.base import cache_name

    namespaces = {_network_namespace(host.sshd.pid) for host in lab.hosts}
    return [pid for pid, command, _ in live_processes()
            if cache_name("idle_watch") in command and _network_namespace(pid) in namespaces]


def _network_namespace(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:  # it ended meanwhile
        return None


# --- notifications (the spec's `notify`; tests/webhook_stand_in.py)

# worker 1 fails attempt 0 (worker 0 ends well at once: the failure is worker 1's whatever the timing)
FAILS_ONCE = ('run: test "$PODRUN_ATTEMPT" = 1 || test "$PODRUN_WORKER" = 0 || exit 3\n'
              "restarts: {max: 2, on: [failure]}\n")
# why its first attempt failed, as a notification has it: worker 1 exits 3 and prints nothing
FAILS_ONCE_CAUSE = {"class": "unknown", "worker": 1, "rank": None, "step": None, "text": "exited with code 3",
                    "said": "unknown on worker 1"}


def notification(job_id: str, name: str, event: str, state: str, attempt: int, reason: str,
                 cause: dict | None = None) -> dict:
    """The message a webhook gets, exactly (README: Long runs); `cause`: a failure's (docs/notifications.md)."""
    verb = {"failure": "failed", "preemption": "was preempted", "restart": "restarts", "stall": "stalled",
            "success": "succeeded"}[event]
    line = f"podrun: job {name} {verb} (attempt {attempt}{', ' + cause['said'] if cause else ''}): {reason} [{job_id}]"
    return {"job": job_id, "name": name, "state": state, "event": event, "attempt": attempt, "step": None,
            "reason": reason, "cause": cause, "text": line, "content": line, "allowed_mentions": {"parse": []}}


def failed_restarted_succeeded(job_id: str, name: str, why: str, cause: dict | None = None) -> list[dict]:
    """What a webhook gets of a FAILS_ONCE job: its failure (`why`, with its `cause` where it was classified),
    its restart, its success."""
    return [notification(job_id, name, "failure", "failed", 0, why, cause),
            notification(job_id, name, "restart", "running", 1, f"after failure: {why}"),
            notification(job_id, name, "success", "succeeded", 1, "every worker exited with code 0")]


# --- the jobs table

LONG_NAME = "resnet50-imagenet-sweep-lr0.1-wd1e-4-bs4096-warmup5-cosine-label-smoothing"


def recorded_job(name: str, started_at: float, codes: list[int | None], state: str = jobstore.SUCCEEDED,
                 exit_code: int | None = 0, stopped: tuple[int, ...] = (), serial: int = 0) -> str:
    """A job's record, written by the job store as the launcher writes it, for jobs a real run would take
    too long to make (32 workers, dozens of jobs); `stopped`: the workers SIGTERM ended. Returns its id."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started_at))
    workers = [jobstore.WorkerRecord(index, f"local/w{index}", code, "SIGTERM" if index in stopped else None)
               for index, code in enumerate(codes)]
    # a running job's launcher is this test's process, alive; a finished one's is gone
    record = jobstore.JobRecord(id=f"{name}-{stamp}-{serial:04x}", name=name, target=f"local:{len(codes)}",
                                spec_path=f"{name}.yaml", workers=workers, state=state, started_at=started_at,
                                ended_at=None if state == jobstore.RUNNING else started_at + 3725, exit_code=exit_code,
                                launcher=None if state == jobstore.RUNNING else {})
    record.create()
    return record.id


class StepsRecord:
    """A job's record of one worker, made as the launcher and lifecycle make it (timeline.begin/end,
    progress.advance, record.restart), attempt by attempt, at the epoch seconds given: for reports and
    restart rules with exact numbers. Needs a PODRUN_HOME (the `home` fixture): a restart saves it."""

    def __init__(self, started_at: float = 1000.0):
        self.record = jobstore.JobRecord(id=f"steps-20260101-000000-{os.urandom(2).hex()}", name="steps",
                                         target="local:1", spec_path="steps.yaml",
                                         workers=[jobstore.WorkerRecord(0, "local/w0")], started_at=started_at,
                                         launcher={})
        self.record.create()

    def phase(self, phase: str, start: float, end: float) -> StepsRecord:
        """Worker 0 in `phase` from start to end."""
        timeline.end(timeline.begin(self.record, phase, [0], at=start), 0, at=end)
        return self

    def attempt(self, run: tuple[float, float], steps: list[tuple[float, int]], state: str = jobstore.FAILED,
                restart_s: float | None = None) -> StepsRecord:
        """Worker 0's run from run[0] to run[1], reaching each (epoch seconds, step) of `steps`; the attempt
        ends there in `state`, and with `restart_s`, the next attempt begins after a restart phase that long."""
        for at, step in steps:
            progress.advance(self.record, self.record.workers[0], step, at)
        self.phase("run", *run)
        self.record.finish(state, 0 if state == jobstore.SUCCEEDED else 1, None, ended_at=run[1])
        if restart_s is not None:
            self.record.restart()
            self.record.workers = [jobstore.WorkerRecord(0, "local/w0")]
            timeline.add(self.record, "restart", run[1], run[1] + restart_s)
        return self


def jobs_on_a_terminal(columns: int, monkeypatch) -> str:
    """`podrun jobs` on a real terminal `columns` wide (COLUMNS says the same, as a shell exports it)."""
    monkeypatch.setenv("COLUMNS", str(columns))
    code, written = run_in_terminal(["jobs"], rows=50, columns=columns)
    assert code == 0, written
    return written.decode().replace("\r\n", "\n")


# --- the documentation: the README and the pages of docs/ (the site's), where its text moved

DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def section(text: str, heading: str) -> str:
    """The text under a markdown heading (`## Title`), up to the next heading of its level or above."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    following = re.search(rf"\n#{{1,{len(level)}}} ", text[start + 1:])
    return text[start:start + 1 + following.start()] if following else text[start:]


def documented_section(title: str) -> str:
    """The section titled `title`, at whatever level, in the one page of the README or docs/ that has it."""
    found = [section(text, match[0].strip("\n")) for text in map(Path.read_text, DOC_PAGES)
             for match in re.finditer(rf"\n#+ {re.escape(title)}\n", text)]
    assert len(found) == 1, f"{len(found)} sections titled {title!r} in the README and docs/"
    return found[0]


def documentation() -> str:
    """Everything the README and the pages of docs/ say."""
    return "\n".join(page.read_text() for page in DOC_PAGES)


# --- a real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def require_chromium() -> None:
    """Skip (fail where CI requires every facility) in one line without Chromium (Debian's, which .ci/run installs)."""
    import pytest

    if CHROMIUM is None:
        missing = "chromium is not on PATH: apt-get install chromium"
        if os.environ.get("PODRUN_TESTS_REQUIRE_ALL"):
            pytest.fail(f"{missing} (.ci/run installs it)", pytrace=False)
        pytest.skip(f"chromium: {missing}")


class Browser:
    """Headless Chromium driven through its DevTools pipe (--remote-debugging-pipe: JSON messages, each ended
    by NUL, on its fds 3 and 4), so a test can watch one page while its script changes it. `errors`: what
    the page's console said as errors, and its uncaught exceptions."""

    def __init__(self, profile: Path):
        require_chromium()
        assert CHROMIUM
        to_chromium, self._to = os.pipe()
        self._from, from_chromium = os.pipe()
        # above 3 and 4, so that putting them there cannot overwrite one with the other
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_chromium, from_chromium)]
        for fd in (to_chromium, from_chromium):
            os.close(fd)
        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=lambda: (os.dup2(high[0], 3), os.dup2(high[1], 4)))
        for fd in high:
            os.close(fd)
        self.errors: list[str] = []
        self._answers: dict[int, dict] = {}
        self._answered = threading.Condition()
        self._next_id = 0
        self._session: str | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        pending = b""
        while chunk := os.read(self._from, 65536):
            *messages, pending = (pending + chunk).split(b"\0")
            for message in map(json.loads, messages):
                if message.get("method") == "Runtime.exceptionThrown":
                    self.errors.append(message["params"]["exceptionDetails"]["exception"]["description"])
                elif message.get("method") == "Runtime.consoleAPICalled" and message["params"]["type"] == "error":
                    self.errors.append(" ".join(str(arg.get("value")) for arg in message["params"]["args"]))
                elif "id" in message:
                    with self._answered:
                        self._answers[message["id"]] = message
                        self._answered.notify_all()

    def send(self, method: str, timeout: float = 30, **params) -> dict:
        """One DevTools command (to the page, once open() attached to it); its result."""
        self._next_id += 1
        number = self._next_id
        command = {"id": number, "method": method, "params": params}
        if self._session and not method.startswith("Target."):
            command["sessionId"] = self._session
        os.write(self._to, json.dumps(command).encode() + b"\0")
        with self._answered:
            assert self._answered.wait_for(lambda: number in self._answers, timeout), f"{method}: no answer"
            answer = self._answers.pop(number)
        assert "error" not in answer, f"{method}: {answer['error']}"
        return answer["result"]

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Runtime.enable")
        self.send("Page.navigate", url=url)

    def evaluate(self, expression: str):
        """The expression's value in the page, now (None where it throws, as before the page has loaded)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return None if "exceptionDetails" in result else result["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout: float = 30):
        """The expression's first truthy value in the page, polled until `timeout`."""
        values = []
        wait_until(lambda: values.append(self.evaluate(expression)) or values[-1], what, timeout)
        return values[-1]

    def close(self) -> None:
        with contextlib.suppress(OSError, AssertionError):
            self.send("Browser.close", timeout=5)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to)
        os.close(self._from)


def sshd_sessions(namespace: str) -> list[int]:
    """A lab host's sshd processes that serve a connection (not the one that listens): killed, its connections
    drop while the host and its sshd stay."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
    serving = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if re.match(rb"sshd(-session)?: root", Path(f"/proc/{pid}/cmdline").read_bytes()):
                serving.append(int(pid))
    return serving
