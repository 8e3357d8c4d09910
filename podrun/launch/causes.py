"""Why a failed attempt failed: each failed worker's exit (its code or signal) and last lines sorted into a
class, and of all the workers that failed, the first cause told apart from its cascade.

One rank that runs out of memory makes every other rank's collective fail (gloo: "Connection closed by
peer"; NCCL: a watchdog timeout), and those may be reported first. So the cause is the first failure, in
the order the workers' exits came, that is not of the class `collective`; only where every failure is a
collective one is the first of them the cause. Each class and the evidence it takes (docs/running-jobs.md,
Why it failed):

  oom         the worker's lines: Python's MemoryError, PyTorch's "can't allocate memory" (CPU) and
              OutOfMemoryError (CUDA), XLA's RESOURCE_EXHAUSTED, "Cannot allocate memory"; or SIGKILL
              with "Killed" as the last line (the kernel's OOM killer, as a shell reports it)
  collective  an NCCL or gloo error or timeout, a peer that closed or reset the connection
  hardware    GPU Xid or ECC lines, a TPU that failed to initialise, an accelerator in use
  config      ModuleNotFoundError or ImportError, a missing file, a bad argument (argparse's "error:
              unrecognized arguments", "error: argument"), a command not found (exit 126 or 127)
  exception   any other Python exception: its type and message
  signal      SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL
  unknown     none of these: never a guess

  lost        the worker's agent could not tell its exit (its connection dropped, its host gone)

`config` fails the same way every time, so it is never restarted unless restarts.on names it
(launch/lifecycle.py). The preempted, stall and time_limit ends are their own (endings.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from podrun import exits, jobstore
from podrun.launch.steps import EXCEPTION_LINE, RANK_LINE, StepResult
from podrun.output import masked, say, worker_ranges

CLASSES = ("oom", "collective", "hardware", "config", "exception", "signal", "lost", "unknown")
# how the line names each class
SAID = {"oom": "out of memory", "collective": "in the collective", "hardware": "a hardware fault",
        "config": "a configuration error", "exception": "an exception", "signal": "a crash",
        "lost": "lost", "unknown": "a failure"}
# searched in the worker's last lines, last line first; the first class whose pattern a line matches wins
EVIDENCE = (
    ("oom", re.compile(r"\bMemoryError\b|can't allocate memory|OutOfMemoryError|CUDA out of memory|"
                       r"RESOURCE_EXHAUSTED|Cannot allocate memory|out of memory", re.I)),
    ("hardware", re.compile(r"\bXid\b|uncorrectable ECC|ECC error|TPU initialization failed|Failed to initiali[sz]e "
                            r"(the )?TPU|TPU platform|/dev/accel\d* .*(busy|in use)|Device or resource busy")),
    ("collective", re.compile(r"\bNCCL\b|\bgloo\b|ProcessGroup|DistBackendError|Connection closed by peer|"
                              r"Connection reset by peer|collective operation timeout|Broken pipe", re.I)),
    ("config", re.compile(r"\b(ModuleNotFoundError|ImportError)\b|No such file or directory|"
                          r"error: (unrecognized arguments|argument|the following arguments are required)|"
                          r"command not found|can't open file")),
)
CRASH_SIGNALS = {"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL"}
TEXT_LIMIT = 200


@dataclass
class Cause:
    klass: str
    worker: int
    rank: int | None
    text: str  # the line that shows it (or what the exit says), cut to TEXT_LIMIT

    def to_dict(self, step: int | None) -> dict:
        return {"class": self.klass, "worker": self.worker, "rank": self.rank, "step": step, "text": masked(self.text)}


def classify(result: StepResult) -> Cause:
    """The class of one failed worker's end, from its exit and its (failed rank's) last lines."""
    if result.problem or result.code == exits.LOST:
        return Cause("lost", result.index, result.rank, _cut(result.describe()))
    lines = [RANK_LINE.sub("", line).strip() for line in result.shown_tail()]
    lines = [line for line in lines if line]
    for line in reversed(lines):
        for klass, pattern in EVIDENCE:
            if pattern.search(line):
                return Cause(klass, result.index, result.rank, _cut(line))
    if result.code in (126, 127):
        return Cause("config", result.index, result.rank, _cut(lines[-1] if lines else result.describe()))
    if result.signal == "SIGKILL" and lines and lines[-1] == "Killed":
        return Cause("oom", result.index, result.rank, "Killed (SIGKILL: the kernel's OOM killer, as its shell said)")
    if result.signal in CRASH_SIGNALS:
        return Cause("signal", result.index, result.rank, result.describe())
    for line in reversed(lines):
        if match := EXCEPTION_LINE.match(line):
            return Cause("exception", result.index, result.rank, _cut(f"{match[1]}: {match[2]}"))
    return Cause("unknown", result.index, result.rank, _cut(lines[-1] if lines else result.describe()))


def first_cause(failures: list[StepResult]) -> tuple[Cause, list[Cause]]:
    """Of the workers that failed on their own (in the order their exits came): the cause, and the others."""
    classified = [classify(result) for result in failures]
    cause = next((each for each in classified if each.klass != "collective"), classified[0])
    return cause, [each for each in classified if each is not cause]


def kept(record: jobstore.JobRecord, failed: list[StepResult]) -> tuple[Cause, list[Cause], int | None]:
    """Of an attempt's failures (in the order their exits came): the cause, kept in the record (`cause`, with
    the step its worker reached), the others, and that step."""
    cause, cascade = first_cause(failed)
    reached = next(worker.step for worker in record.workers if worker.index == cause.worker)
    record.cause = cause.to_dict(reached)
    return cause, cascade, reached


def told(record: jobstore.JobRecord, failed: list[StepResult], stopped: list[StepResult]) -> StepResult:
    """Of a step's failures (in the order their exits came), the one that caused the others, said in one line
    and kept in the record: the failure the job's end names."""
    cause, cascade, reached = kept(record, failed)
    say(f"cause: {line(cause, cascade, sorted(result.index for result in stopped), reached)}")
    return next(result for result in failed if result.index == cause.worker)


def line(cause: Cause, cascade: list[Cause], stopped: list[int], step: int | None) -> str:
    """`worker 2 failed first: out of memory (DefaultCPUAllocator: ...) at step 5; workers 0-1 then failed in
    the collective`; `stopped`: the workers podrun stopped after it."""
    who = f"worker {cause.worker}" + (f" rank {cause.rank}" if cause.rank is not None else "")
    said = f"{who} failed first: {SAID[cause.klass]} ({cause.text})" + (f" at step {step}" if step is not None else "")
    for klass in dict.fromkeys(each.klass for each in cascade):
        workers = sorted({each.worker for each in cascade if each.klass == klass})
        said += f"; {_workers(workers)} then failed {SAID[klass] if klass == 'collective' else 'too: ' + SAID[klass]}"
    if stopped:
        said += f"; {_workers(stopped)} {'was' if len(stopped) == 1 else 'were'} stopped"
    return said


def _workers(indexes: list[int]) -> str:
    return f"worker {indexes[0]}" if len(indexes) == 1 else f"workers {worker_ranges(indexes, letter='')}"


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT - 3] + "..."
