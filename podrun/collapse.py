"""Identical lines from several workers, shown once: `[w0-511,513-1023] Epoch 3 loss 1.23`.

A finished line (terminal.Terminal.print_line) joins the open group of lines with the same text, or
opens a group of its own. A group is held for WINDOW_S from its first line, then goes out once, with
the range of the workers (and, under torchrun, of the ranks: `[w0-3 r0-31]`) that printed it. A
worker's own lines and its ranks' lines never share a group. A group of a worker's own lines that
every worker has joined cannot grow: it is due at once (so a one-worker job's lines wait for nothing).

Order. A worker's (or rank's) lines go out in the order it printed them: a group goes out once its
window has ended and the groups of its sources' earlier lines are out. A line joins the open group of
its text unless that would put the group after its source's previous line's group while that group
must come after it (a cycle): then it opens a group of its own. So worker 5 printing A then B while
the others print only A shows `[w0-N] A`, then `[w5] B` (B waits for A's window); a worker with a
line more than the others (a warning) still joins their next lines; and worker 3 printing B then A
after worker 5 printed A then B shows `[w5] A`, `[w3,5] B`, `[w3] A`: worker 3's A cannot go out
before its B, so it does not join the A that must.

Each group has a level above the levels of the groups before it (of its sources), so a group of a
level above a line's previous group cannot be before it, and the search for a cycle stays among the
few groups between the two levels.

The clock is whatever the caller counts in: time.monotonic() while a job runs; rounds of reading for
`podrun logs`, which replays logs faster than they were written (commands/logs.py).
"""

from __future__ import annotations

import itertools
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

WINDOW_S = 1.0  # how long a line waits for the same line from other workers (in a pipe, the delay it gets)
# held lines at most: past this (a flood of different lines), the oldest go out before their window ends
MAX_HELD = 10_000

Source = tuple[int, "int | None"]  # (worker, rank); rank None: the worker's own line


class Group:
    """One line's text and the sources that printed it within its window, in the order they did."""

    __slots__ = ("text", "ranked", "sources", "opened", "level", "after", "waiting", "out")

    def __init__(self, text: bytes, ranked: bool, opened: float, level: int):
        self.text = text
        self.ranked = ranked
        self.sources: list[Source] = []
        self.opened = opened
        self.level = level
        # the groups its sources' next lines joined while it was held (an ordered set); None until one does: a
        # million ranks' one line each never does, and a dict for each group was a fifth of the collapse's time
        self.after: dict[Group, None] | None = None
        self.waiting = 0  # the groups held that must go out before it
        self.out = False


class Collapse:
    """The groups held: add() each finished line, due() the groups to show now, in an order that keeps
    every source's."""

    def __init__(self, workers: list[int], window: float = WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.worker_count = len(set(workers))
        self.window = window
        self.clock = clock
        self.held: dict[Group, None] = {}  # by opening, oldest first
        self.open: dict[tuple[bytes, bool], Group] = {}  # the newest held group of each text
        self.last: dict[Source, Group] = {}  # each source's last line's group, while it is held
        self.completed: list[Group] = []  # groups that every worker joined since due() looked
        self.held_lines = 0  # the lines of the groups held (one group of a million ranks' lines holds a million)

    def add(self, source: Source, text: bytes) -> tuple[Group, bool]:
        """The group the line joined, and whether it opened it."""
        ranked = source[1] is not None
        key = (text, ranked)
        group, before = self.open.get(key), self.last.get(source)  # `last` holds only groups held: not out
        new = group is None or group is before or (before is not None and not _may_follow(group, before))
        if new:
            group = self.open[key] = Group(text, ranked, self.clock(), before.level + 1 if before else 0)
            self.held[group] = None
        assert group is not None
        group.sources.append(source)
        self.held_lines += 1
        if not ranked and len(group.sources) >= self.worker_count:  # _complete(group)
            self.completed.append(group)
        self.last[source] = group
        if before is not None:
            if before.after is None:
                before.after = {}
            if group not in before.after:
                before.after[group] = None
                group.waiting += 1
        return group, new

    def due(self, everything: bool = False) -> list[Group]:
        """The groups to show now (every group held, with `everything`), taken out, in order."""
        everything = everything or self.crowded
        ended = self.clock() - self.window
        ready = list(self.held) if everything else list(itertools.takewhile(lambda group: group.opened <= ended,
                                                                              self.held))
        ready += self.completed
        self.completed = []
        shown: list[Group] = []

        def follows(after: Group) -> bool:
            return everything or after.opened <= ended or self._complete(after)

        for group in ready:
            if not group.waiting and not group.out:
                self._take_out(group, shown, follows)
        return shown

    def due_in(self) -> float | None:
        """How long until the oldest group held that waits for no other is due (0: it is due now, its
        window having ended since due() looked); None if none is held. A group held that waits for
        another goes out with it, or after it."""
        ended = self.clock() - self.window
        return next((max(group.opened - ended, 0.0) for group in self.held if not group.waiting), None)

    def _take_out(self, group: Group, shown: list[Group], ready: Callable[[Group], bool]) -> None:
        """Take the group out, then the groups after it that waited only for it, and are ready."""
        going = [group]
        while going:
            group = going.pop()
            group.out = True
            del self.held[group]
            self.held_lines -= len(group.sources)
            key = (group.text, group.ranked)
            if self.open.get(key) is group:
                del self.open[key]
            for source in group.sources:  # a line out orders nothing after it: `last` keeps only sources held
                if self.last.get(source) is group:
                    del self.last[source]
            shown.append(group)
            for after in reversed(group.after or ()):
                after.waiting -= 1
                if not after.waiting and ready(after):
                    going.append(after)

    @property
    def crowded(self) -> bool:
        """More lines held than MAX_HELD: due() takes every group out, whatever its window."""
        return self.held_lines > MAX_HELD

    def _complete(self, group: Group) -> bool:
        return not group.ranked and len(group.sources) >= self.worker_count


def _may_follow(group: Group, before: Group) -> bool:
    """Whether `group` may go out after `before` (no chain of sources' lines leads from it to `before`);
    if so, its level and those of the groups after it are raised above `before`'s."""
    if group.level <= before.level:
        seen = {group}
        going = [group]
        while going:
            for after in going.pop().after or ():
                if after is before:
                    return False
                if not after.out and after.level < before.level and after not in seen:
                    seen.add(after)
                    going.append(after)
        group.level = before.level + 1
        raising = [group]
        while raising:
            lower = raising.pop()
            for after in lower.after or ():
                if not after.out and after.level <= lower.level:
                    after.level = lower.level + 1
                    raising.append(after)
    return True
