"""The odd ones out: one dump of every worker's stacks ({worker index: its text}, as remote/stacks.py
writes it and launch/stacks.py collects it) summed up as where the processes differ, in a few lines:
`w17 is in load_batch (data.py:88); the other 511 are in all_reduce (dist.py:12)`. In a hung collective
(NCCL, gloo) the ranks that wait are alike, and the one that never came is the story.

A process is placed by its main thread (py-spy's "MainThread", else its first thread): by its innermost
frame outside Python's standard library and every frame outward of it, each function with its file and
line. Left out, as they differ between identical hangs: the library's frames below that one (a
Condition.wait under a Queue.get), thread ids, pids, addresses, idle or active. py-spy's short file
names tell the standard library's files (`threading.py`) from the rest, not the user's (`data.py`) from
an installed package's (`torch/distributed/distributed_c10d.py`): both count as the user's code. Without
py-spy (what /proc shows) a process is placed by where its main thread waits in the kernel (its wchan
and kernel stack, offsets left out; one that runs, by its state alone): that tells a sleep from a
lock or a socket's read, never one Python function from another.

Compared are the processes of one depth in each worker's tree of Python processes: the shallowest
depth at which a launcher gave processes a RANK (torchrun's ranks, named `w3 r1`: not torchrun itself,
nor a rank's DataLoader workers below it; podrun's rank_output.py between torchrun and a rank is passed
over), else each worker's outermost. A worker with no process at that depth is placed by its
outermost, or by why it gave no stacks.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from podrun.output import worker_ranges

SECTION = re.compile(r"^=== pid (\d+)(?: \(parent (\d+|\?)(?:, rank (\d+))?\))?: (.*) ===$", re.MULTILINE)
PY_SPY_THREAD = re.compile(r'^Thread \S+ \([^)]*\)(?:: "(.*)")?$')
PY_SPY_FRAME = re.compile(r"^ {4}(\S.*) \((.+?)(?::(\d+))?\)$")
KERNEL_STATE = re.compile(r"^state: (\S+).*, wchan: (\S+)$")
KERNEL_THREAD = re.compile(r"^thread (\d+): wchan (\S+)$")
KERNEL_FRAME = re.compile(r"^ {2}\[<[0-9a-f]+>\] ([^+\s]+)")
RANK_WRAPPER = "/rank_output.py "  # podrun's own, between torchrun and each rank: always reading its rank's pipe
MOST_NAMED = 5  # places named one by one; the rest are counted


@dataclass(frozen=True)
class Place:
    kind: str  # "python", "kernel" or "none"
    frames: tuple[str, ...]  # innermost first: `load_batch (data.py:88)`; a kernel's functions; why none
    said: str  # what follows "is": `in load_batch (data.py:88)`


@dataclass(frozen=True)
class Process:
    worker: int
    pid: int
    rank: int | None
    command: str
    place: Place
    depth: int  # in the tree of the worker's Python processes: 0 for one with no parent among them


def summary(texts: dict[int, str]) -> list[str]:
    """Where the compared processes are: the minority places each named with who is there, then the
    majority's (`the other 511`); one line when all are alike or one place stands out."""
    compared = compared_processes(texts)
    groups: dict[tuple, list[Process]] = {}
    for process in compared:
        groups.setdefault((process.place.kind, process.place.frames), []).append(process)
    apart = sorted(groups.values(), key=len, reverse=True)
    # places that still read alike (one function and line, reached through a recursion one frame deeper) are
    # said as one: an odd one out is never said to be where the rest are
    alike: dict[str, list[Process]] = {}
    for group, said in zip(apart, _told_apart([group[0].place for group in apart])):
        alike.setdefault(said, []).extend(group)
    by_size = sorted(alike.items(), key=lambda item: len(item[1]), reverse=True)
    saids, ordered = [said for said, _ in by_size], [group for _, group in by_size]
    note = (["(from /proc: where each process waits in the kernel, not its Python function: py-spy on the job's "
             "PATH names that)"] if any(process.place.kind == "kernel" for process in compared) else [])
    if len(ordered) == 1:
        return [f"all {_counted(ordered[0])} are {saids[0]}" if len(compared) > 1
                else f"{_names(ordered[0])} is {saids[0]}"] + note
    majority = len(ordered[0]) > len(ordered[1])
    minorities = list(zip(ordered[1:] if majority else ordered, saids[1:] if majority else saids))
    lines = [f"{_names(group)} {_is(group)} {said}" for group, said in minorities[:MOST_NAMED]]
    if rest := minorities[MOST_NAMED:]:
        lines.append(f"{sum(len(group) for group, _ in rest)} more in {len(rest)} other places (in the saved stacks)")
    if majority:
        others = "the other one is" if len(ordered[0]) == 1 else f"the other {len(ordered[0])} are"
        lines.append(f"{others} {saids[0]}")
    return (["; ".join(lines)] if len(lines) == 2 else lines) + note


def compared_processes(texts: dict[int, str]) -> list[Process]:
    """The processes compared across the workers (see the module's docstring), each placed."""
    own = {}
    for worker, text in sorted(texts.items()):
        processes = _processes(worker, text)
        own[worker] = [process for process in processes if RANK_WRAPPER not in process.command + " "] or processes
    ranked = [process.depth for processes in own.values() for process in processes if process.rank is not None]
    compared = []
    for worker, processes in own.items():
        if not processes:
            compared.append(Process(worker, 0, None, "", _no_stacks(texts[worker]), 0))
            continue
        depth = min(ranked) if ranked and min(ranked) in {process.depth for process in processes} else \
            min(process.depth for process in processes)
        compared += [process for process in processes if process.depth == depth]
    return compared


def _processes(worker: int, text: str) -> list[Process]:
    """The processes of a worker's text, each with its depth in the tree of those (0: no parent among them)."""
    headers = list(SECTION.finditer(text))
    parents = {int(header[1]): int(header[2]) if header[2] and header[2].isdigit() else None for header in headers}

    def depth(pid: int) -> int:
        ancestors, parent = 0, parents[pid]
        while parent is not None and parent in parents and ancestors < len(parents):  # no loop, whatever the text
            ancestors, parent = ancestors + 1, parents[parent]
        return ancestors

    return [Process(worker, int(header[1]), int(header[3]) if header[3] else None, header[4],
                    _place(text[header.end():following.start() if following else len(text)], int(header[1])),
                    depth(int(header[1])))
            for header, following in zip(headers, headers[1:] + [None])]


def _place(body: str, pid: int) -> Place:
    lines = body.splitlines()
    threads = [(index, match[1]) for index, line in enumerate(lines) if (match := PY_SPY_THREAD.match(line))]
    if threads:
        start = next((index for index, name in threads if name == "MainThread"), threads[0][0])
        frames = []
        for line in lines[start + 1:]:
            if not (frame := PY_SPY_FRAME.match(line)):
                break
            frames.append((frame[1], frame[2], frame[3]))
        users = [index for index, (_, file, _) in enumerate(frames) if not _in_standard_library(file)]
        kept = frames[users[0]:] if users else frames
        shown = tuple(f"{function} ({file}:{line})" if line else f"{function} ({file})" for function, file, line in kept)
        return Place("python", shown, f"in {shown[0]}" if shown else "in no Python frame")
    said = _first_line("\n".join(line for line in lines if not line.startswith("py-spy dump --pid ")))
    return _kernel_place(lines, pid) or Place("none", (said,), f"without a stack: {said}")


def _kernel_place(lines: list[str], pid: int) -> Place | None:
    """Where the main thread (its id is the pid) waits, in remote/stacks.py's kernel view."""
    state = next((match for line in lines if (match := KERNEL_STATE.match(line))), None)
    if state is None:
        return None
    threads = [(index, match[2]) for index, line in enumerate(lines)
               if (match := KERNEL_THREAD.match(line)) and match[1] == str(pid)]
    start, wchan = threads[0] if threads else (len(lines), state[2])
    functions = []
    for line in lines[start + 1:]:
        if not (frame := KERNEL_FRAME.match(line)):
            break
        functions.append(frame[1])
    if wchan not in ("0", "?"):
        return Place("kernel", (wchan, *functions), f"waiting in the kernel at {wchan}")
    # running, or runnable: its kernel stack, where one shows, is where the scheduler took it off a CPU a moment
    # ago, no place of its own; running processes differ only by their state
    return Place("kernel", (state[1],), f"not waiting in the kernel (state {state[1]})")


def _in_standard_library(file: str) -> bool:
    top = file.split("/", 1)[0].removesuffix(".py")
    return file.startswith("<") or top in sys.stdlib_module_names


def _no_stacks(text: str) -> Place:
    line = _first_line(text).removeprefix("no stacks: ").split(";")[0].rstrip(":")  # not "; its processes:"
    return Place("none", (re.sub(r"\d+", "N", line),), f"without stacks: {line}")


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "nothing")


def _told_apart(places: list[Place]) -> list[str]:
    """Each place as said, where two would read alike (one function and line, called from two places:
    two collectives that do not match) with the frame outward where each goes its own way."""
    saids = [place.said for place in places]
    for said in set(saids):
        alike = [index for index, other in enumerate(saids) if other == said]
        if len(alike) < 2:
            continue
        outward = [places[index].frames[::-1] for index in alike]
        shared = next((depth for depth in range(min(map(len, outward)))
                       if len({frames[depth] for frames in outward}) > 1), min(map(len, outward)))
        for index, frames in zip(alike, outward):
            saids[index] = f"{said} from {frames[shared]}" if shared < len(frames) - 1 else said
    return saids


def _names(group: list[Process]) -> str:
    """`w17`, `w3-5`, `w1 r3`, `w0-1 r0-3`; `w2 pid 4242` where a worker has several processes unranked."""
    ranked = [process for process in group if process.rank is not None]
    plain = [process for process in group if process.rank is None]
    ranks = [process.rank for process in ranked if process.rank is not None]
    names = [f"{worker_ranges(list({process.worker for process in ranked}))} {worker_ranges(ranks, 'r')}"] if ranked else []
    if len({process.worker for process in plain}) == len(plain):
        names += [worker_ranges([process.worker for process in plain])] if plain else []
    else:
        names += [f"w{process.worker} pid {process.pid}" for process in plain[:MOST_NAMED]]
        names += [f"{len(plain) - MOST_NAMED} more"] if len(plain) > MOST_NAMED else []
    return ", ".join(names)


def _counted(group: list[Process]) -> str:
    noun = ("ranks" if all(process.rank is not None for process in group)
            else "workers" if len({process.worker for process in group}) == len(group) else "processes")
    return f"{len(group)} {noun} ({_names(group)})" if noun == "ranks" else f"{len(group)} {noun}"


def _is(group: list[Process]) -> str:
    return "is" if len(group) == 1 else "are"
