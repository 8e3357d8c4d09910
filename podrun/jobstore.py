"""The launcher's job store: PODRUN_HOME/jobs/<JOB_ID>/ holds job.json and every worker's log.

job.json is replaced atomically, so a launcher killed mid-write leaves the previous version; an
entry that cannot be read anyway is skipped by `podrun jobs` and named by `podrun logs`.
"""

from __future__ import annotations

import io
import json
import os
import re
import time

from podrun import paths
from podrun.errors import PodrunError
from podrun.output import masked

RUNNING, SUCCEEDED, FAILED, STOPPED, LOST = "running", "succeeded", "failed", "stopped", "lost"
PREEMPTED = "preempted"  # the TPU was preempted and no restart was left (exits.PREEMPTED)
STALLED = "stalled"  # no worker printed anything for the job's `stall`: stacks saved, job stopped (exits.STALLED)
STATES = (RUNNING, SUCCEEDED, FAILED, STOPPED, LOST, PREEMPTED, STALLED)
STACKS_DIR = "stacks"
RECORD_FILE = "job.json"
RESUME_FILE = "supervise.json"  # a supervisor host's job: what adopting it again takes (launch/kept.py)
AMBIGUOUS_SHOWN = 5  # candidates an ambiguous id prefix names
JOB_ID_TAIL = r"-\d{8}-\d{6}-[0-9a-f]{4}"  # after the job's name: new_job_id's stamp and suffix
# where a job lives, kept here and read only by its handle (handles/), which chooses by them where each
# verb reaches the job
SUPERVISOR_NOTES = "notes"  # in supervised_by: what the supervisor host's `podrun jobs` notes of where the job lives
RESIDENCE = ("launcher", "detached", "supervisor", "cleanup", "supervised_by")


# plain classes: importing dataclasses (it loads inspect) made `podrun jobs` start 15 ms slower,
# a sixth of its whole run
class WorkerRecord:
    def __init__(self, index: int, address: str, exit_code: int | None = None, signal: str | None = None,
                 endpoint: dict | None = None, stop_reason: str | None = None, rank: int | None = None,
                 output_at: float | None = None, killed: bool = False, step: int | None = None,
                 step_at: float | None = None):
        self.index = index
        self.address = address
        self.exit_code = exit_code
        self.signal = signal
        self.endpoint = endpoint or {}  # how to reach it again: Transport.endpoint()
        self.stop_reason = stop_reason  # why its agent stopped it early (e.g. SIGTERM from podrun stop)
        self.rank = rank  # under torchrun: the rank that failed first, whose exit code exit_code is
        # when its output last came (epoch seconds), as its worker told a detached job's fetch; an
        # attached job's is its log's mtime (last_output_at)
        self.output_at = output_at
        self.killed = killed  # a stop's SIGKILL ended it, after the grace period: no failure of its own
        self.step = step  # its latest step in the current attempt (the spec's `progress`: progress.py)
        self.step_at = step_at  # when that step was reached (epoch seconds)


class JobRecord:
    def __init__(self, id: str, name: str, target: str, spec_path: str, workers: list[WorkerRecord],
                 state: str = RUNNING, started_at: float | None = None, ended_at: float | None = None,
                 exit_code: int | None = None, summary: str | None = None, launcher: dict | None = None,
                 detached: bool = False, stop_grace_s: float = 30.0, attempt: int = 0,
                 attempts: list[dict] | None = None, supervisor: dict | None = None, cleanup: str | None = None,
                 supervised_by: dict | None = None, phases: list[dict] | None = None, shared_root: bool = False,
                 steps: list[dict] | None = None, events: list[dict] | None = None, price: dict | None = None,
                 giving_back: str | None = None, cause: dict | None = None, total_steps: int | None = None,
                 straggler: dict | None = None):
        self.id = id
        self.name = name
        self.target = target  # e.g. "local:2"
        self.spec_path = spec_path
        self.workers = workers
        self.state = state
        self.started_at = time.time() if started_at is None else started_at
        self.ended_at = ended_at
        self.exit_code = exit_code
        self.summary = summary  # why it failed or stopped, one line
        self.launcher = process_identity(os.getpid()) if launcher is None else launcher
        self.detached = detached  # the run goes on without its launcher; logs and stop reach the workers
        self.stop_grace_s = stop_grace_s  # a stop waits this long for the job's processes to end, then kills
        self.attempt = attempt  # restarts so far (`restarts`): the attempt that runs now, or ran last
        # how each earlier attempt ended: {attempt, state, exit_code, summary, started_at, ended_at}
        self.attempts = attempts or []
        # a detached job that restarts or deletes its TPU: the local process that watches it (pid, start)
        self.supervisor = supervisor
        self.cleanup = cleanup  # the command that deletes what the supervisor would delete (delete_after)
        # a job handed to a supervisor host (supervisor/): this record points at the one kept there, and
        # holds what was last read of it; {host, endpoint: Transport.endpoint(), podrun: its command there}
        self.supervised_by = supervised_by
        self.phases = phases or []  # where its time went: timeline.py
        self.shared_root = shared_root  # its workers share one home (Target.shares_root): a job directory each in it
        self.steps = steps or []  # the job's steps in each attempt (the spec's `progress`): progress.py
        self.events = events or []  # what happened to its notifications (the spec's `notify`): notify.py
        # what its workers cost per hour, as known where it started: {per_hour, source} or {per_hour: None,
        # why} (Target.price, the spec's cost.per_hour); report/cost.py bills it
        self.price = price
        # what podrun does with the capacity after the job ended, while it does it or where it failed (`deleting
        # its TPU`, `deleting its TPU failed: ...`): the state alone would read as if nothing were still billed
        self.giving_back = giving_back
        # why the current attempt failed, once it did: {class, worker, rank, step, text} (launch/causes.py)
        self.cause = cause
        self.total_steps = total_steps  # the spec's progress.total: the job's last step, for its ETA (`podrun jobs`)
        self.straggler = straggler  # the worker that held the others back, once `stragglers` named it (launch/stragglers.py)

    def to_dict(self) -> dict:
        return {**vars(self), "workers": [vars(worker) for worker in self.workers]}

    def take_fields(self, kept: JobRecord) -> None:
        """This record's fields as `kept` has them (the record a supervisor host keeps of the job this one
        points at), but where the job lives: this record's own."""
        vars(self).update({name: value for name, value in vars(kept).items() if name not in RESIDENCE})

    def remote_job_dir(self, worker: WorkerRecord) -> str:
        """The current attempt's directory on the worker (paths.remote_job_dir)."""
        return paths.remote_job_dir(self.id, self.attempt, worker.index if self.shared_root else None)

    @property
    def dir(self) -> str:
        return os.path.join(paths.jobs_dir(), self.id)

    def log_path(self, index: int, attempt: int | None = None) -> str:
        """Worker `index`'s log of `attempt` (default: the current one); a restart's have a folder each."""
        attempt = self.attempt if attempt is None else attempt
        return os.path.join(self.dir, *([f"attempt-{attempt}"] if attempt else []), f"w{index}.log")

    def output_at(self, worker: WorkerRecord) -> float | None:
        """When the worker's output last came (epoch seconds); None if it printed nothing yet. A detached
        job's worker says (fetched); an attached job's launcher writes each chunk to the log as it comes."""
        if worker.output_at is not None:
            return worker.output_at
        try:
            info = os.stat(self.log_path(worker.index))
        except OSError:
            return None
        return info.st_mtime if info.st_size else None

    def new_stacks_dir(self) -> str:
        """A fresh `stacks/<n>/` for one dump of every worker's stacks (n counts from 1, across attempts)."""
        root = os.path.join(self.dir, STACKS_DIR)
        os.makedirs(root, mode=0o700, exist_ok=True)
        taken = [int(entry) for entry in os.listdir(root) if entry.isdigit()]
        number = max(taken, default=0) + 1
        while True:  # a stall and a `podrun stacks` may dump at once
            try:
                os.mkdir(os.path.join(root, str(number)), 0o700)
                return os.path.join(root, str(number))
            except FileExistsError:
                number += 1

    def restart(self) -> None:
        """Close the current attempt (its outcome is the record's state now) and start the next, running
        again; its workers are the caller's to set."""
        self.attempts.append({"attempt": self.attempt, "state": self.state, "exit_code": self.exit_code,
                              "summary": self.summary, "started_at": self.attempt_started_at(),
                              "ended_at": self.ended_at, "cause": self.cause, "straggler": self.straggler})
        self.attempt += 1
        self.state, self.exit_code, self.summary, self.ended_at, self.cause = RUNNING, None, None, None, None
        self.straggler = None
        os.makedirs(os.path.dirname(self.log_path(0)), mode=0o700, exist_ok=True)
        self.save()

    def attempt_started_at(self) -> float:
        return self.attempts[-1]["ended_at"] if self.attempts else self.started_at

    def supervised(self) -> bool:
        """Whether the job's supervisor (a detached job that restarts or deletes its TPU) is at work."""
        return self.supervisor is not None and is_alive(self.supervisor)

    def live_supervisor(self) -> dict | None:
        """The identity of the job's supervisor process, while it lives (supervisor/daemon.py waits for it)."""
        return self.supervisor if self.supervised() else None

    def supervisor_lost(self) -> bool:
        """Whether a running job's supervisor died (killed, its machine rebooted): nothing restarts the
        job or deletes its TPU any more."""
        return self.supervisor is not None and self.state == RUNNING and not is_alive(self.supervisor)

    def current_state(self) -> str:
        """The state, with a running job whose launcher has died shown as lost (a supervised job's
        supervisor tells: supervisor/remote.py)."""
        if self.state == RUNNING and self.supervised_by:
            return self.state
        if self.state == RUNNING and not self.detached and not is_alive(self.launcher):
            return LOST
        return self.state

    def outcome(self) -> str:
        """How the job ended, one line: `job ID failed: worker 1 exited with code 3 after 4.2s`; a summary
        that begins with the state reads on from it (`job ID stopped by SIGTERM after 4.2s`)."""
        state = self.current_state()
        summary = self.summary if self.summary not in (None, "", state) and state != SUCCEEDED else None
        how = summary if summary and summary.startswith(f"{state} ") else f"{state}: {summary}" if summary else state
        took = f"{self.ended_at - self.started_at:.1f}s" if self.ended_at else ""
        if self.attempt:
            restarts = f"{self.attempt} restart{'s' * (self.attempt > 1)}"
            took = f" after {restarts}, {took} in all" if took else f" after {restarts}"
        elif took:
            took = f" after {took}"
        return f"job {self.id} {how}{took}"

    def create(self) -> None:
        try:
            paths.private_dirs(paths.jobs_dir())
            try:
                os.mkdir(self.dir, 0o700)
            except FileExistsError:  # a supervisor host's job: its console came first (supervisor/daemon.py)
                if os.path.lexists(os.path.join(self.dir, RECORD_FILE)):
                    raise
            self.save()
        except OSError as error:
            raise paths.unusable_home(error) from None

    def save(self) -> None:
        # compact: json's C encoder serves only indent=None (46 ms against 5 ms for 512 workers' record)
        write_json(os.path.join(self.dir, RECORD_FILE), self.to_dict())

    def finish(self, state: str, exit_code: int, summary: str | None = None, ended_at: float | None = None) -> None:
        """Record the job's end; `ended_at`: when it ended, if not now (a detached job's workers say)."""
        self.state, self.exit_code, self.summary = state, exit_code, summary and masked(summary)  # a program's words
        self.ended_at = ended_at or time.time()
        self.save()

    def note_giving_back(self, doing: str | None) -> None:
        """Say (and save) what is being done with its capacity now, or that it is done (None)."""
        self.giving_back = doing
        self.save()


def cause_brief(cause: dict | None) -> str | None:
    """`oom on worker 2`: an attempt's cause (record.cause, or an attempt's) as `jobs`, the report and a
    notification name it; None where the attempt has none (it succeeded, or ended by a stop or a preemption)."""
    return f"{cause['class']} on worker {cause['worker']}" if cause else None


def is_job_id(text: str, name: str) -> bool:
    """Whether `text` is an id that new_job_id could have given a job of this name."""
    return re.fullmatch(re.escape(name) + JOB_ID_TAIL, text) is not None


def new_job_id(name: str) -> str:
    """A fresh id: the second it starts in and a short random suffix, one no job in the store has.
    Jobs started in one second (a script's loop) would otherwise meet a taken suffix about once in
    65536 pairs, and the second job would fail to create its directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    while True:
        job_id = f"{name}-{stamp}-{os.urandom(2).hex()}"
        if not os.path.lexists(os.path.join(paths.jobs_dir(), job_id)):
            return job_id


def load(job_id: str) -> JobRecord:
    record = load_if_there(job_id)
    if record is None:
        raise PodrunError(f"no job {job_id!r} in {paths.jobs_dir()}; `podrun jobs` lists them")
    return record


def find(text: str) -> JobRecord:
    """The job `text` names: its exact id, else the one id it begins, else the newest job of that name.
    A full id costs one file read: `podrun logs ID` starts at once however many jobs there are."""
    exact = load_if_there(text) if _is_plain_name(text) else None
    if exact:
        return exact
    # an id begins with its job's name (new_job_id), so the jobs of that name are among these
    candidates = sorted((entry for entry in job_ids() if entry.startswith(text)), reverse=True)
    if len(candidates) == 1:
        return load(candidates[0])
    named = [record for record in _readable(candidates) if record.name == text]
    if named:
        return max(named, key=lambda record: record.started_at)
    if not candidates:
        raise PodrunError(f"no job {text!r} in {paths.jobs_dir()} (no id begins so, no job has that name); "
                          f"`podrun jobs` lists them")
    more = f", and {len(candidates) - AMBIGUOUS_SHOWN} more" if len(candidates) > AMBIGUOUS_SHOWN else ""
    raise PodrunError(f"job {text!r} is ambiguous: {len(candidates)} job ids begin so "
                      f"({', '.join(candidates[:AMBIGUOUS_SHOWN])}{more}); give more of the id")


def all_jobs() -> list[JobRecord]:
    """Every readable job, newest first."""
    return sorted(_readable(job_ids()), key=lambda record: record.started_at, reverse=True)


def open_log(path: str) -> io.FileIO:
    """A worker's log, for appending; created 0600 like job.json: it holds the job's output."""
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab", buffering=0)


def write_json(path: str, data, indent: int | None = None) -> None:
    """Replace the file at path with data as JSON (mode 0600), atomically: a reader, or a writer
    killed mid-write, sees the old version or the new one, whole."""
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}")
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        handle.write(json.dumps(data, indent=indent))  # json.dump never uses the C encoder
    os.replace(temporary, path)


def job_ids() -> list[str]:
    root = paths.jobs_dir()
    return os.listdir(root) if os.path.isdir(root) else []


def _readable(job_ids: list[str]) -> list[JobRecord]:
    records = []
    for job_id in job_ids:
        try:
            records.append(_read(os.path.join(paths.jobs_dir(), job_id, RECORD_FILE)))
        except (OSError, ValueError, TypeError, KeyError):
            continue  # half-created or damaged: not a job we can show
    return records


def load_if_there(job_id: str) -> JobRecord | None:
    path = os.path.join(paths.jobs_dir(), job_id, RECORD_FILE)
    try:
        return _read(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise PodrunError(f"job {job_id!r}: its record {path} is unreadable ({error})") from None


def _is_plain_name(text: str) -> bool:
    """Whether text can be a job's directory name: no path of its own (`../x`, `a/b`)."""
    return text == os.path.basename(text) and text not in ("", ".", "..")


def _read(path: str) -> JobRecord:
    with open(path) as handle:
        return from_dict(json.load(handle))


def from_dict(data: dict) -> JobRecord:
    """A record from its JSON form (to_dict(), or a line of `podrun jobs --json`)."""
    return JobRecord(**{**data, "workers": [WorkerRecord(**worker) for worker in data["workers"]]})


def is_alive(identity: dict) -> bool:
    """Whether the process of this identity (process_identity) still runs; an empty identity (no
    /proc to take it from) cannot be told dead."""
    return process_identity(identity.get("pid", 0)) == identity


def process_identity(pid: int) -> dict:
    """pid plus the kernel's start time of that process, so a reused pid is not mistaken for it;
    {} for no such process, or one that has exited and waits to be reaped (a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            # fields 3 and 22, counted after the command name, which may itself hold spaces
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return {}
    if len(fields) < 20 or fields[0] == "Z":
        return {}
    return {"pid": pid, "start": fields[19]}
