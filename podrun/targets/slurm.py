"""A Slurm cluster (`target: {slurm: {...}}`): the job gets an allocation of `nodes` nodes, made for
it alone, and runs one worker on each, worker i on the i-th node of SLURM_JOB_NODELIST; worker 0's
node address is MASTER_ADDR.

The allocation is a batch job that only holds the nodes (`sbatch --wrap 'exec sleep ...'`): sbatch
answers at once with the job's id, so podrun can say why it pends (squeue's reason) and cancel it on
Ctrl-C; each worker's steps are srun steps on its node (transport/slurm.py), with podrun's agent as
the task. `free()` cancels it (scancel) and waits until squeue no longer shows it.

Slurm's commands run on the login node, over SSH as `hosts` are reached (the spec's `ssh:` keys and
host-key rules), or on this machine when there is no `login`. The nodes share the login user's home
(shares_root): the code ships there once.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import sys
import time

from podrun.errors import PodrunError, SpecError
from podrun.output import counted, say
from podrun.spec import JobSpec
from podrun.targets.base import Target, Worker
from podrun.targets.slurm_options import SlurmOptions, slurm_time_s
from podrun.transport.slurm import Completed, LoginLink, LoginShell, SlurmTransport, srun_command

HOLD_COMMAND = "exec sleep 2147483647"  # the batch script: holds the nodes until scancel or the time limit
POLL_S = (0.1, 0.2, 0.3, 0.5, 1.0)  # squeue while the allocation starts: quickly first, then every second
REPORT_EVERY_S = 30  # off a terminal, a pending allocation's line again after this long (at once when its reason changes)
GONE_TIMEOUT_S = 60  # after scancel, how long podrun waits for squeue to show nothing of the job
FIELD = re.compile(r"(\w+)=(\S*)")
ENDED_STATES = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                "OUT_OF_MEMORY")


class SlurmCluster(Target):
    worker_noun = "Slurm node"
    default_device = "CUDA"
    holds = True  # the allocation is made for this job: free() gives it back
    shares_root = True  # the nodes share the login user's home: the code ships once

    def __init__(self, spec: JobSpec):
        super().__init__(spec)
        self.job_id: str | None = None
        self.nodes: list[tuple[str, str]] = []  # (node name, its address) in SLURM_JOB_NODELIST order
        self.login_ssh = self._login_transport()
        # two connections to the login node: Slurm's commands (a thread of their own, for the synchronous
        # steps of the lifecycle) and the workers' steps (in the launch's event loop)
        self.shell = LoginShell(self._login_transport())
        self.link = LoginLink(self.login_ssh)

    @property
    def options(self) -> SlurmOptions:
        return self.spec.target.options

    def _login_transport(self):
        login = self.options.login
        if not login:
            return None
        from podrun.spec_fields import parse_host
        from podrun.transport.ssh import SshTransport  # asyncssh loads only with a login node

        ssh = self.spec.ssh
        user, host, port = parse_host(login)
        return SshTransport(host, port or ssh.port, user or ssh.user, ssh.identity_file, ssh.check_host_keys,
                            known_hosts_file=ssh.known_hosts)

    # --- the allocation -------------------------------------------------------------------------
    def sbatch_argv(self) -> list[str]:
        """The sbatch that asks for the allocation, every option of the spec mapped to Slurm's."""
        options = self.options
        argv = ["sbatch", "--parsable", f"--job-name=podrun-{self.spec.name}", f"--nodes={options.nodes}",
                "--ntasks-per-node=1", "--output=/dev/null", "--error=/dev/null"]
        for flag, value in (("--partition", options.partition), ("--time", options.time),
                            ("--account", options.account), ("--gpus-per-node", options.gpus_per_node),
                            ("--constraint", options.constraint), ("--qos", options.qos)):
            if value is not None:
                argv.append(f"{flag}={value}")
        return [*argv, *options.sbatch_args, f"--wrap={HOLD_COMMAND}"]

    def provision(self) -> None:
        """Check the options against the cluster's partitions, ask for the allocation, and wait until it
        runs, saying why while it pends."""
        self.check_options(self._partitions())
        submitted = self._run(shlex.join(self.sbatch_argv()))
        if submitted.code != 0:
            raise SpecError(self.spec.path, "target.slurm", f"sbatch refused the allocation: {submitted.error_line()}")
        self.job_id = submitted.stdout.strip().split(";")[0].splitlines()[-1].strip()
        if not self.job_id.isdigit():
            raise PodrunError(f"sbatch answered {submitted.stdout.strip()!r}, not a job id")
        self.held = f"its Slurm allocation (job {self.job_id})"
        self._wait_running()

    def _partitions(self) -> list[dict[str, str]]:
        listed = self._run("scontrol show partition --oneliner")
        if listed.code != 0:
            raise PodrunError(f"{self.shell.where}: cannot list Slurm's partitions (scontrol show partition): "
                              f"{listed.error_line()}")
        return parse_records(listed.stdout)

    def check_options(self, partitions: list[dict[str, str]]) -> None:
        """Refuse, before anything is allocated, what no partition can give: one line naming the option."""
        options = self.options
        names = [p.get("PartitionName", "") for p in partitions]
        if options.partition is not None:
            chosen = next((p for p in partitions if p.get("PartitionName") == options.partition), None)
            if chosen is None:
                raise SpecError(self.spec.path, "target.slurm.partition",
                                f"no partition {options.partition!r} on the cluster; it has {', '.join(names) or 'none'}")
        else:
            chosen = next((p for p in partitions if p.get("Default") == "YES"), None)
            if chosen is None:
                return  # no default partition: sbatch says what it says
        name = chosen.get("PartitionName", "")
        total = _number(chosen.get("TotalNodes"))
        most = _number(chosen.get("MaxNodes"))
        if total is not None and options.nodes > total:
            larger = [p.get("PartitionName", "") for p in partitions
                      if (_number(p.get("TotalNodes")) or 0) >= options.nodes]
            hint = f"; partition {', '.join(larger)} has enough" if larger else "; no partition has that many"
            raise SpecError(self.spec.path, "target.slurm.nodes",
                            f"{options.nodes} nodes, but partition {name} has {total}{hint}")
        if most is not None and options.nodes > most:
            raise SpecError(self.spec.path, "target.slurm.nodes",
                            f"{options.nodes} nodes, but partition {name} gives a job at most {most} (MaxNodes)")
        limit = chosen.get("MaxTime", "UNLIMITED")
        try:
            limit_s = slurm_time_s(limit)
        except ValueError:
            return
        if options.time and limit_s is not None and (options.time_s or 0) > limit_s:
            raise SpecError(self.spec.path, "target.slurm.time",
                            f"{options.time} is over partition {name}'s limit, MaxTime={limit}")

    def _wait_running(self) -> None:
        """Poll squeue until the allocation runs; while it pends, say so with squeue's reason (redrawn in
        place on a terminal, a line when it changes otherwise)."""
        started = time.monotonic()
        terminal = sys.stderr.isatty()
        shown: str | None = None
        shown_at = 0.0
        drawn = False
        polls = 0
        try:
            while True:
                state, reason, nodelist = self._state()
                if state == "RUNNING" and nodelist:
                    self.nodes = self._node_addresses(nodelist)
                    return
                if state is None or state in ENDED_STATES:
                    raise PodrunError(f"Slurm job {self.job_id} ended before it started"
                                      + (f" ({state}, {reason})" if state else " (squeue no longer shows it)"))
                waited = time.monotonic() - started
                if state == "PENDING" and reason not in ("None", "") and not (reason == "Priority" and waited < 2):
                    line = f"Slurm job {self.job_id} pending ({reason}): waiting for {counted(self.options.nodes, 'node')}"
                    if terminal:
                        sys.stderr.write(f"\rpodrun: {line}, {waited:.0f}s (Ctrl-C cancels it)\x1b[K")
                        sys.stderr.flush()
                        drawn = True
                    elif line != shown or waited - shown_at >= REPORT_EVERY_S:
                        say(f"{line} (Ctrl-C cancels it)")
                        shown, shown_at = line, waited
                time.sleep(POLL_S[min(polls, len(POLL_S) - 1)])
                polls += 1
        except KeyboardInterrupt:
            if drawn:
                sys.stderr.write("\n")
                drawn = False
            say(f"interrupted: cancelling Slurm job {self.job_id}, which had not started")
            raise
        finally:
            if drawn:
                sys.stderr.write("\n")

    def _state(self) -> tuple[str | None, str, str]:
        """The job's state, squeue's reason and its node list; None: squeue does not show it."""
        shown = self._run(f"squeue --noheader --jobs={self.job_id} --format='%T|%r|%N'")
        if shown.code != 0:
            if "Invalid job id" in shown.stderr:
                return None, "", ""
            raise PodrunError(f"{self.shell.where}: squeue failed: {shown.error_line()}")
        line = shown.stdout.strip().splitlines()[-1] if shown.stdout.strip() else ""
        if not line:
            return None, "", ""
        state, _, rest = line.partition("|")
        reason, _, nodelist = rest.partition("|")
        return state, reason, nodelist

    def _node_addresses(self, nodelist: str) -> list[tuple[str, str]]:
        """The allocation's nodes in SLURM_JOB_NODELIST order, each with its address (NodeAddr), as one
        command on the login node."""
        quoted = shlex.quote(nodelist)
        answered = self._run(f"scontrol show hostnames {quoted} && echo --- && scontrol show node --oneliner {quoted}")
        if answered.code != 0:
            raise PodrunError(f"{self.shell.where}: cannot read the nodes of Slurm job {self.job_id}: "
                              f"{answered.error_line()}")
        names_part, _, nodes_part = answered.stdout.partition("---")
        addresses = {record.get("NodeName", ""): record.get("NodeAddr", "") for record in parse_records(nodes_part)}
        return [(name, addresses.get(name) or name) for name in names_part.split()]

    def _run(self, command: str) -> Completed:
        return self.shell.run(command)

    # --- the workers ----------------------------------------------------------------------------
    def workers(self, dry_run: bool) -> list[Worker]:
        if dry_run and self.job_id is None:  # nothing allocated: the nodes are named by their place
            return [Worker(index, f"node {index} of the allocation", f"<node {index} address>",
                           SlurmTransport(self.link, self._login_endpoint(), "<job id>", f"<node {index}>"))
                    for index in range(self.options.nodes)]
        if self.job_id is None:  # `podrun ssh` / `cp`: the running job of this spec
            self._find_running()
        assert self.job_id is not None
        return [Worker(index, name, address,
                       SlurmTransport(self.link, self._login_endpoint(), self.job_id, name))
                for index, (name, address) in enumerate(self.nodes)]

    def _find_running(self) -> None:
        """The allocation of this spec's running job (`podrun ssh` and `cp` reach its nodes)."""
        name = f"podrun-{self.spec.name}"
        shown = self._run(f"squeue --noheader --me --states=RUNNING --name={shlex.quote(name)} --format='%i|%N'")
        lines = [line for line in shown.stdout.splitlines() if "|" in line] if shown.code == 0 else []
        if not lines:
            raise PodrunError(f"no running Slurm job {name} to reach on {self.shell.where}"
                              + (f" ({shown.error_line()})" if shown.code else "")
                              + "; start it with `podrun exec --detach`")
        job_id, _, nodelist = lines[-1].partition("|")
        self.job_id = job_id.strip()
        self.held = f"its Slurm allocation (job {self.job_id})"
        self.nodes = self._node_addresses(nodelist.strip())

    def _login_endpoint(self) -> dict | None:
        return self.login_ssh.endpoint() if self.login_ssh else None

    def describe(self, workers: list[Worker]) -> str:
        where = f"via {self.options.login}" if self.options.login else "on this machine (the login node)"
        lines = [f"{counted(len(workers), self.worker_noun)}, allocated for the job; Slurm's commands run {where}:",
                 f"  allocate: {shlex.join(self.sbatch_argv())}",
                 "  wait:     squeue --noheader --jobs=<job id> --format='%T|%r|%N' (until RUNNING)"]
        lines += [f"  worker {worker.index}: {srun_command(worker.transport.job_id, worker.transport.node, '<agent>')}"
                  for worker in workers if isinstance(worker.transport, SlurmTransport)]
        lines.append("  <agent>:  python3 -I -S -c <podrun's agent> (it runs the worker's script below)")
        lines.append("  release:  scancel <job id> (when the job ends, fails, is stopped or interrupted)")
        return "\n".join(lines)

    def record_label(self, workers: list[Worker]) -> str:
        return f"slurm:{len(workers)} job {self.job_id}"

    def free(self) -> None:
        """Cancel the allocation and wait until squeue shows nothing of it (CG lasts a second or so)."""
        if self.job_id is None:
            return
        job_id, self.job_id = self.job_id, None
        cancelled = self._run(f"scancel {job_id}")
        if cancelled.code != 0 and "Invalid job id" not in cancelled.stderr:
            raise PodrunError(f"cannot cancel Slurm job {job_id} (scancel {job_id}): {cancelled.error_line()}")
        deadline = time.monotonic() + GONE_TIMEOUT_S
        polls = 0
        while time.monotonic() < deadline:
            self.job_id = job_id
            try:
                state, _, _ = self._state()
            finally:
                self.job_id = None
            if state is None:
                say(f"Slurm job {job_id} released")
                self.shell.close()
                return
            time.sleep(POLL_S[min(polls, len(POLL_S) - 1)])
            polls += 1
        say(f"Slurm job {job_id} cancelled; squeue still shows it after {GONE_TIMEOUT_S}s")

    def free_command(self) -> str | None:
        """What free() does, for a user to run when podrun could not."""
        if self.job_id is None:
            return None
        scancel = f"scancel {self.job_id}"
        return f"ssh {shlex.quote(self.options.login)} {scancel}" if self.options.login else scancel


def parse_records(text: str) -> list[dict[str, str]]:
    """`scontrol show ... --oneliner` output: one record per line, KEY=VALUE words."""
    return [dict(FIELD.findall(line)) for line in text.splitlines() if "=" in line]


def _number(value: str | None) -> int | None:
    """A count in scontrol's output; None for UNLIMITED or what is not a number."""
    return int(value) if value and value.isdigit() else None


def is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True
