"""A Slurm job's capacity: its allocation of `nodes` nodes, made for it alone (for_this_job), given
back (scancel) whenever the job ends, fails, is stopped or interrupted.

The allocation is `salloc --no-shell`, chosen by measurement (scripts/bench_slurm.py: granted in
0.31 s on the lab, where `sbatch --wrap` of a script holding the nodes ran after 1.72 s, at the
scheduler's next pass); salloc says its job's id at once when the job pends, so podrun says why it
pends (squeue's reason, every second) and cancels it on Ctrl-C. give_back() cancels the allocation
(scancel) and waits until squeue no longer shows it. Slurm's commands run on the login node, over
one connection (transport/slurm.py's LoginShell), or on this machine when there is no `login`.
"""

from __future__ import annotations

import math
import queue
import re
import shlex
import sys
import time
from concurrent.futures import Future

from podrun.capacity.base import Capacity
from podrun.errors import PodrunError, SpecError
from podrun.output import counted, say
from podrun.spec.model import JobSpec
from podrun.target_kinds.slurm import SlurmOptions, slurm_time_s
from podrun.transport.slurm import Completed, LoginLink, LoginShell

POLL_S = (0.1, 0.2, 0.3, 0.5, 1.0)  # squeue after scancel: quickly first, then every second
PENDING_POLL_S = 1.0  # squeue's reason, while salloc waits
REPORT_EVERY_S = 30  # off a terminal, a pending allocation's line again after this long (at once when its reason changes)
# salloc's lines that carry its job's id: "Pending job allocation 12", "Granted job allocation 12"
JOB_ID_SAID = re.compile(r"job allocation (\d+)")
# Slurm sends --signal's warning at its scheduler's pass, up to this much earlier than asked (salloc(1))
WARNED_EARLY_S = 60
GONE_TIMEOUT_S = 60  # after scancel, how long podrun waits for squeue to show nothing of the job
FIELD = re.compile(r"(\w+)=(\S*)")
PARTITIONS = "scontrol show partition --oneliner"
# while the login connection is made beside podrun's own start (begin()), the thread that makes it takes
# the interpreter at once when a packet comes: at Python's 5 ms the handshake's 7 packets waited ~30 ms
HANDSHAKE_SWITCH_S = 0.0005

class Pending:
    """A pending allocation, told as it waits: redrawn in place on a terminal, else a line when squeue's
    reason changes (and every REPORT_EVERY_S)."""

    def __init__(self, nodes: int):
        self.nodes = nodes
        self.started = time.monotonic()
        self.terminal = sys.stderr.isatty()
        self.shown: str | None = None
        self.shown_at = 0.0
        self.drawn = False

    def show(self, job_id: str | None, reason: str) -> None:
        waited = time.monotonic() - self.started
        line = f"Slurm job {job_id} pending ({reason}): waiting for {counted(self.nodes, 'node')}"
        if self.terminal:
            sys.stderr.write(f"\rpodrun: {line}, {waited:.0f}s (Ctrl-C cancels it)\x1b[K")
            sys.stderr.flush()
            self.drawn = True
        elif line != self.shown or waited - self.shown_at >= REPORT_EVERY_S:
            say(f"{line} (Ctrl-C cancels it)")
            self.shown, self.shown_at = line, waited

    def end(self) -> None:
        """End the line redrawn in place, so that what is said next starts on a line of its own."""
        if self.drawn:
            sys.stderr.write("\n")
            self.drawn = False



class SlurmAllocation(Capacity):
    for_this_job = True  # the allocation is made for this job: give_back() cancels it when the job ends
    runs_out = True  # at its time limit

    def __init__(self, spec: JobSpec, login_ssh):
        super().__init__()
        self.spec = spec
        self.options: SlurmOptions = spec.target.options
        self.job_id: str | None = None
        self.nodes: list[tuple[str, str]] = []  # the workers' (node name, its address), SLURM_JOB_NODELIST order
        self.spare_nodes: list[tuple[str, str]] = []  # the allocation's spares left (target.slurm.spares)
        self.excluded: list[str] = []  # nodes lost in an attempt: left out of every allocation after (--exclude)
        self.said_ran_out: str | None = None  # the allocation whose time limit ran_out() told: not said again
        # one connection to the login node, in a thread of its own (for the synchronous steps of the
        # lifecycle): Slurm's commands, and the workers' steps (used from the launch's event loop)
        self.shell = LoginShell(login_ssh)
        self.link = LoginLink(self.shell)
        self.listing: Future[Completed] | None = None  # the partitions, asked for by begin()
        self.switch_s = 0.0  # the interpreter's switch interval before begin(), restored once it is done
        self.continues = "time_limit" in spec.restart_on  # past its time limit, on a new allocation
        self.stop_grace_s = spec.stop_grace_s  # the launch's (exec --grace) once it acquires; --dry-run shows this

    @property
    def warns_steps(self) -> bool:
        """restarts.on: [time_limit]: Slurm signals the steps stop_grace ahead of the time limit (salloc
        --signal); not a detached job's, whose agents have left their step and whose supervisor warns them
        itself (warning_due_s): Slurm would signal only the supervisor's own steps, which follow the logs."""
        return self.continues and not self.runs_detached

    def salloc_argv(self) -> list[str]:
        """The salloc that asks for the allocation, every option of the spec mapped to Slurm's (and
        sbatch_args: salloc takes sbatch's options). The whole of each node unless the spec says otherwise
        (SlurmOptions.node_share): `--ntasks-per-node=1` alone gets one CPU of each node on a select/cons_tres
        cluster (SLURM_CPUS_ON_NODE=1), where another job lands beside it and task/affinity or cgroups bind the
        worker, torchrun and every rank, to that one CPU."""
        options = self.options
        argv = ["salloc", "--no-shell", f"--job-name=podrun-{self.spec.name}", f"--nodes={options.allocated}",
                "--ntasks-per-node=1"]
        if options.spares:  # a node that fails leaves the job its other nodes, for a spare to take its place
            argv.append("--no-kill")
        if self.excluded:
            argv.append(f"--exclude={','.join(self.excluded)}")
        for flag, value in (("--partition", options.partition), ("--time", options.time),
                            ("--account", options.account), ("--gpus-per-node", options.gpus_per_node),
                            ("--constraint", options.constraint), ("--qos", options.qos)):
            if value is not None:
                argv.append(f"{flag}={value}")
        if self.warns_steps:  # every process of each step, the ranks themselves, gets SIGTERM that long ahead
            argv.append(f"--signal=TERM@{self.warn_ahead_s}")
        return [*argv, *options.node_share(), *options.sbatch_args]

    @property
    def warn_ahead_s(self) -> int:
        """How long before its time limit Slurm signals the steps: the job's stop_grace (Slurm's sig_time is
        whole seconds; it may signal up to a minute earlier, at its scheduler's pass)."""
        return max(1, math.ceil(self.stop_grace_s))

    def begin(self) -> None:
        """The login node's connection made and its partitions listed while the rest of the launch loads;
        acquire() checks the options against them before anything is allocated."""
        if self.shell.ssh is not None:
            self.switch_s = sys.getswitchinterval()
            sys.setswitchinterval(HANDSHAKE_SWITCH_S)
            self.listing = self.shell.asked(PARTITIONS)

    def acquire(self) -> None:
        """Check the options against the cluster's partitions, ask for the allocation, and wait until it
        is granted, saying why while it pends."""
        self.check_options(self._partitions())
        self.queued_from = time.time()
        salloc = self.shell.spawn(shlex.join(self.salloc_argv()))
        if self.options.nodes > 1:
            self.link.start_fanout_early()
        said: list[str] = []
        pending = Pending(self.options.allocated)
        try:
            while True:
                try:
                    line = salloc.lines.get(timeout=PENDING_POLL_S if self.job_id else None)
                except queue.Empty:  # pending: squeue's reason
                    state, reason, _ = self._state()
                    if state == "PENDING":
                        pending.show(self.job_id, reason)
                    continue
                if line is None:
                    break
                said.append(line)
                if self.job_id is None and (granted := JOB_ID_SAID.search(line)):
                    self.job_id = granted.group(1)
                    self.held = f"its Slurm allocation (job {self.job_id})"
        except KeyboardInterrupt:
            pending.end()
            if self.job_id:
                say(f"interrupted: cancelling Slurm job {self.job_id}, which had not started")
            elif salloc.process:
                salloc.process.terminate()  # salloc cancels what it asked for
            raise
        pending.end()
        self.queued_until = time.time()
        if salloc.code != 0 or self.job_id is None:
            refusal = Completed(salloc.code or 1, "", "\n".join(said)).error_line()
            raise SpecError(self.spec.path, "target.slurm", f"salloc refused the allocation: {refusal}")
        state, reason, nodes = self._granted()
        if state != "RUNNING" or not nodes:
            raise PodrunError(f"Slurm job {self.job_id} ended as soon as it started ({state or 'gone'}, {reason})")
        self.nodes, self.spare_nodes = nodes[:self.options.nodes], nodes[self.options.nodes:]
        self.reallocates = False

    def _partitions(self) -> list[dict[str, str]]:
        listing, self.listing = self.listing, None
        try:
            listed = listing.result() if listing else self._run(PARTITIONS)
        finally:
            if self.switch_s:
                sys.setswitchinterval(self.switch_s)
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
                return  # no default partition: salloc says what it says
        name = chosen.get("PartitionName", "")
        total = _number(chosen.get("TotalNodes"))
        most = _number(chosen.get("MaxNodes"))
        if total is not None and options.allocated > total:
            larger = [p.get("PartitionName", "") for p in partitions
                      if (_number(p.get("TotalNodes")) or 0) >= options.allocated]
            hint = f"; partition {', '.join(larger)} has enough" if larger else "; no partition has that many"
            raise SpecError(self.spec.path, "target.slurm.nodes",
                            f"{options.allocated} nodes, but partition {name} has {total}{hint}")
        if most is not None and options.allocated > most:
            raise SpecError(self.spec.path, "target.slurm.nodes",
                            f"{options.allocated} nodes, but partition {name} gives a job at most {most} (MaxNodes)")
        limit = chosen.get("MaxTime", "UNLIMITED")
        try:
            limit_s = slurm_time_s(limit)
        except ValueError:
            return
        if options.time and limit_s is not None and (options.time_s or 0) > limit_s:
            raise SpecError(self.spec.path, "target.slurm.time",
                            f"{options.time} is over partition {name}'s limit, MaxTime={limit}")

    def _state(self) -> tuple[str | None, str, str]:
        """The job's state, squeue's reason and its node list; None: squeue does not show it."""
        return self._state_in(self._run(self._squeue()))

    def _squeue(self) -> str:
        return f"squeue --noheader --jobs={self.job_id} --format='%T|%r|%N'"

    def _granted(self) -> tuple[str | None, str, list[tuple[str, str]]]:
        """Once salloc returned: the job's state, squeue's reason and, if it runs, its nodes with their
        addresses (_node_addresses), asked in one command."""
        nodes = self._nodes_command('"$N"')  # N: the node list, the last field of squeue's line
        script = f'L=$({self._squeue()}) || exit; echo "$L"; echo ---; N="${{L##*|}}"; [ -z "$N" ] || {{ {nodes}; }}'
        shown = self._run(shlex.join(["sh", "-c", script]))  # sh's syntax, whatever the login shell
        state_part, marked, nodes_part = shown.stdout.partition("---\n")
        if not marked:  # squeue itself failed
            state, reason, _ = self._state_in(shown)
            return state, reason, []
        state, reason, nodelist = self._state_in(Completed(0, state_part, ""))
        if state != "RUNNING" or not nodelist:
            return state, reason, []
        return state, reason, self._nodes_in(Completed(shown.code, nodes_part, shown.stderr))

    def _state_in(self, shown: Completed) -> tuple[str | None, str, str]:
        """squeue's answer (_squeue) read."""
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
        return self._nodes_in(self._run(self._nodes_command(shlex.quote(nodelist))))

    @staticmethod
    def _nodes_command(nodelist: str) -> str:
        """`nodelist` (a shell word) as node names, then each node's record (its NodeAddr)."""
        return f"scontrol show hostnames {nodelist} && echo --- && scontrol show node --oneliner {nodelist}"

    def _nodes_in(self, answered: Completed) -> list[tuple[str, str]]:
        """_nodes_command's answer read."""
        if answered.code != 0:
            raise PodrunError(f"{self.shell.where}: cannot read the nodes of Slurm job {self.job_id}: "
                              f"{answered.error_line()}")
        names_part, _, nodes_part = answered.stdout.partition("---")
        addresses = {record.get("NodeName", ""): record.get("NodeAddr", "") for record in parse_records(nodes_part)}
        return [(name, addresses.get(name) or name) for name in names_part.split()]

    def _run(self, command: str) -> Completed:
        return self.shell.run(command)

    def find_running(self) -> None:
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
        self.nodes = self._node_addresses(nodelist.strip())[:self.options.nodes]

    def ran_out(self, warned: bool = False) -> str | None:
        if self.job_id is None:
            return None
        if not (job := self._job_record()):
            return None
        if _timed_out(job):
            self.said_ran_out = self.job_id
            return f"Slurm job {self.job_id} {_time_limit_text(job)}"
        left_s = _time_left_s(job) if warned and job.get("JobState") == "RUNNING" else None
        if left_s is not None and left_s <= self.warn_ahead_s + WARNED_EARLY_S:  # not a scancel or a user's kill
            return (f"Slurm job {self.job_id} was {left_s:.0f}s from its time limit ({job.get('TimeLimit')}): "
                    f"the job was signalled to save and stop")
        return None

    @property
    def spares_left(self) -> int:
        return len(self.spare_nodes)

    def replace(self, worker: int) -> tuple[str, str | None] | None:
        """The lost worker's node left out of the rest of the job: a spare node of the allocation in its rank,
        or, with none left, a new allocation of the same count without it (reallocates)."""
        left = self.nodes[worker][0]
        self.excluded.append(left)
        if not self.spare_nodes:
            self.reallocates = True
            return left, None
        self.nodes[worker] = self.spare_nodes.pop(0)
        return left, self.nodes[worker][0]

    def warning_due_s(self) -> float | None:
        if not self.continues or self.job_id is None:
            return None
        left_s = _time_left_s(job) if (job := self._job_record()) else None
        return None if left_s is None else max(0.0, left_s - self.warn_ahead_s)

    def _job_record(self) -> dict[str, str]:
        """The allocation's job as scontrol shows it ({} when it does not)."""
        records = parse_records(self._run(f"scontrol show job --oneliner {self.job_id} 2>/dev/null").stdout)
        return records[0] if records else {}

    def reacquire(self) -> None:
        """A new allocation for the job's next attempt, once this one reached its time limit (restarts.on:
        [time_limit]): this one cancelled (over the same login connection), the same nodes asked for."""
        self._cancel()
        self.acquire()

    def give_back(self) -> None:
        """Cancel the allocation and wait until squeue shows nothing of it (CG lasts a second or so); the
        login connection closed."""
        if self._cancel():
            self.shell.close()

    def _cancel(self) -> bool:
        """Cancel the allocation and wait until squeue shows nothing of it (not after a node was lost, which holds
        a cancelled job COMPLETING until Slurm marks it down, minutes later): whether it is gone."""
        if self.job_id is None:
            return False
        job_id, self.job_id = self.job_id, None
        # how Slurm saw the job before it is cancelled: one that ended on its own (its time limit) says so
        shown = self._run(f"scontrol show job --oneliner {job_id} 2>/dev/null; echo ---; scancel {job_id}")
        before, _, after = shown.stdout.partition("---")
        if (ended := ended_by_slurm(parse_records(before))) and job_id != self.said_ran_out:
            say(f"Slurm job {job_id} {ended}")
        if shown.code != 0 and "Invalid job id" not in shown.stderr:
            raise PodrunError(f"cannot cancel Slurm job {job_id} (scancel {job_id}): {shown.error_line()}")
        if self.excluded:
            say(f"Slurm job {job_id} cancelled (a lost node keeps it COMPLETING until Slurm marks the node down)")
            return False
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
                return True
            time.sleep(POLL_S[min(polls, len(POLL_S) - 1)])
            polls += 1
        say(f"Slurm job {job_id} cancelled; squeue still shows it after {GONE_TIMEOUT_S}s")
        return False

    def give_back_command(self) -> str | None:
        """What give_back() does, for a user to run when podrun could not."""
        if self.job_id is None:
            return None
        scancel = f"scancel {self.job_id}"
        return f"ssh {shlex.quote(self.options.login)} {scancel}" if self.options.login else scancel



def ended_by_slurm(records: list[dict[str, str]]) -> str | None:
    """Why Slurm ended the allocation before podrun released it (`scontrol show job`), or None: it runs."""
    job = records[0] if records else {}
    state, reason = job.get("JobState", ""), job.get("Reason", "")
    if _timed_out(job):
        return _time_limit_text(job)
    if state and state not in ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING", "COMPLETED", "CANCELLED"):
        return f"ended {state}" + (f" ({reason})" if reason and reason != "None" else "") + " before podrun released it"
    return None


def _time_left_s(job: dict[str, str]) -> float | None:
    """How long the job has before its time limit, as slurmctld counts (TimeLimit less RunTime); None: no limit."""
    try:
        limit_s, run_s = slurm_time_s(job.get("TimeLimit", "")), slurm_time_s(job.get("RunTime", ""))
    except ValueError:
        return None
    return None if limit_s is None or run_s is None else limit_s - run_s


def _timed_out(job: dict[str, str]) -> bool:
    return job.get("JobState") == "TIMEOUT" or job.get("Reason") == "TimeLimit"


def _time_limit_text(job: dict[str, str]) -> str:
    return f"reached its time limit ({job.get('TimeLimit', '?')}): Slurm ended its steps"


def parse_records(text: str) -> list[dict[str, str]]:
    """`scontrol show ... --oneliner` output: one record per line, KEY=VALUE words."""
    return [dict(FIELD.findall(line)) for line in text.splitlines() if "=" in line]


def _number(value: str | None) -> int | None:
    """A count in scontrol's output; None for UNLIMITED or what is not a number."""
    return int(value) if value and value.isdigit() else None

