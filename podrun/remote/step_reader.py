"""The job's step on this worker (the spec's `progress`), read by its agent: from the run's output lines
(the pattern's step group: its group named `step`, else its first group other than `epoch`), or from a
file the job writes its step into, read every FILE_EVERY_S. Standard library only, Python 3.8+; nothing
done at import (re is imported only by jobs with a pattern).

A worker's step is the highest it reached: a line whose step is lower (another rank behind, a log line
that quotes an old step) changes nothing, so the step must grow through the run. A step reached is
reported at most every REPORT_EVERY_S, with the time it was reached: a job of ten steps a second costs
one message a second per worker, and the time is exact.

A step that falls and counts up again below the highest (a per-epoch bar's `Epoch 2: 1/10` after `Epoch
1: 10/10`, a count that started over) is a fall: to at most half the highest, then a line with a step
above that, before any new highest. The first one is told once (fell()), as the launcher says so.

With an epoch group (`(?P<epoch>...)`), a line's place is (epoch, step), and its step is a running
count that rises through epochs: (epoch - first epoch) * steps per epoch + step, where the first epoch
is the first one read and an epoch's steps the most any finished epoch reached (both handed on to a
later attempt in `progress["epochs"]`, so that its count goes on where the earlier one's stood). Those
steps only grow, as an epoch ends: the count never falls, and `Epoch 2: 0/10` is `Epoch 1: 10/10`.

auto_bound() is `stall: auto`'s rule, shared by the launcher (launch/stall.py) and a detached job's hub.
"""

import os
import time

REPORT_EVERY_S = 1.0
MAX_SAMPLES = 1024  # (time, step) pairs kept of a run, however long: see add_sample
FILE_EVERY_S = 1.0
LONGEST_LINE = 1 << 16  # of a line without a newline yet, what is kept to match: its end
# stall: auto: AUTO_MULTIPLE times the median step time of the last AUTO_WINDOW advances, between the floor
# and the cap; until AUTO_STEPS_NEEDED steps were timed (a first step may compile for an hour), the cap
AUTO_MULTIPLE = 10.0
AUTO_WINDOW = 32
AUTO_STEPS_NEEDED = 3
AUTO_FLOOR_S = 300.0
AUTO_CAP_S = 7200.0


class StepReader:
    def __init__(self, progress, cwd):
        self.pattern = None
        self.group = 1  # the pattern's step group
        self.epochs = False  # the pattern has an epoch group: a line's place is (epoch, step)
        if progress.get("pattern") is not None:
            import re

            self.pattern = re.compile(progress["pattern"].encode(errors="surrogateescape"))
            self.group = step_group(self.pattern)
            self.epochs = "epoch" in self.pattern.groupindex
        known = progress.get("epochs") or {}  # an earlier attempt's (the launcher's record)
        self.first_epoch = known.get("first")  # the first epoch read in the job
        self.epoch_steps = known.get("steps") or 0  # the most steps a finished epoch reached
        self.seen = None  # (epoch, step): the place of the latest line, and its epoch's highest step so far
        self.place = None  # (epoch, step) where the highest step was reached
        self.low = None  # a step below the highest, since the highest was reached: a fall, if it counts up
        self.fall = None  # the first fall: (the step it fell from, that step as shown, and where it fell to)
        self.fall_told = False
        self.file = os.path.join(cwd, progress["file"]) if progress.get("file") is not None else None
        self.file_due = 0.0  # when the file is read next (time.monotonic())
        self.file_seen = None  # its (mtime, size) when last read
        self.partial = b""  # the end of the output after its last line break
        self.step = None  # the highest step reached
        self.first = None  # the step of the first line that had one (a pattern's: a file is read now and then)
        self.first_told = False
        self.step_at = None  # when it was reached (epoch seconds)
        self.reported = None  # the step last reported
        self.report_due = 0.0  # when the next report may go (time.monotonic())
        self.samples = []  # the steps reported, with when each was reached: [T, S, T, S, ...] (add_sample)

    def feed(self, data):
        """Output of the run: the step of its last complete line that has one (with epochs, also how far the
        epoch before that line's went, where one ended in it)."""
        if self.pattern is None:
            return
        text = self.partial + data
        cut = max(text.rfind(b"\n"), text.rfind(b"\r"))
        if cut < 0:
            self.partial = text[-LONGEST_LINE:]
            return
        self.partial = text[cut + 1:][-LONGEST_LINE:]
        if self.first is None:
            self._first_of(text[:cut])
        last = None  # the last line with a step; with epochs, before it the last of an earlier epoch
        for line in reversed(text[:cut].splitlines()):  # the hot loop: _step_match inlined
            match = self.pattern.search(line)
            if match is None or not _number(match.group(self.group)) or \
                    self.epochs and not _number(match.group("epoch")):
                continue
            if not self.epochs:
                self._reached(match.group(self.group))
                return
            place = (int(match.group("epoch")), int(match.group(self.group)))
            if last is None:
                last = place
                if self.seen is not None and place[0] <= self.seen[0]:
                    break  # no epoch ended in this text: its last line is all it tells
            elif place[0] < last[0]:  # how far the epoch before the last line's went
                self._reached_place(*place)
                break
        if last is not None:
            self._reached_place(*last)

    def _step_match(self, line):
        """The pattern's match of a line that names a step (and with epochs, its epoch), else None."""
        match = self.pattern.search(line)
        if match is None or not _number(match.group(self.group)) or self.epochs and not _number(match.group("epoch")):
            return None
        return match

    def _first_of(self, text):
        """The step of the first line with one, counted as _reached_place counts it; the text is searched,
        not split: a first chunk of 64 KiB costs a search, not its lines."""
        at = 0
        while (found := self.pattern.search(text, at)) is not None:
            start = max(text.rfind(b"\n", 0, found.start()), text.rfind(b"\r", 0, found.start())) + 1
            end = min((index for index in (text.find(b"\n", found.end()), text.find(b"\r", found.end())) if index >= 0),
                      default=-1)
            match = self._step_match(text[start:end if end >= 0 else len(text)])
            if match is not None:
                step = int(match.group(self.group))
                self.first = self._running_count(int(match.group("epoch")), step) if self.epochs else step
                return
            if end < 0:
                return
            at = end + 1

    def first_untold(self):
        """The first line's step, once (None for a file, or before the first line)."""
        if self.first is None or self.first_told:
            return None
        self.first_told = True
        return self.first

    def read_file(self):
        """The file's step, when it changed since it was last read (at most every FILE_EVERY_S)."""
        if self.file is None or time.monotonic() < self.file_due:
            return
        self.file_due = time.monotonic() + FILE_EVERY_S
        try:
            info = os.stat(self.file)
            if (info.st_mtime, info.st_size) == self.file_seen:
                return
            self.file_seen = (info.st_mtime, info.st_size)
            with open(self.file, "rb") as handle:
                self._reached(handle.read(64))
        except OSError:
            pass  # not written yet, or being replaced

    def _reached(self, text):
        try:
            step = int(text.strip() if text is not None else b"")
        except ValueError:  # a group that matched no number
            return False
        if step < 0:
            return False
        self._count(step, None)
        return True

    def _reached_place(self, epoch, step):
        """A line at `step` of `epoch`: its running count (the module's docstring)."""
        if self.first_epoch is None:
            self.first_epoch = epoch
        if self.seen is not None and epoch > self.seen[0]:  # the epoch seen before ended
            self.epoch_steps = max(self.epoch_steps, self.seen[1])
        if self.seen is None or epoch != self.seen[0]:
            self.seen = (epoch, step)
        else:
            self.seen = (epoch, max(step, self.seen[1]))
        self._count(self._running_count(epoch, step), (epoch, step))

    def _running_count(self, epoch, step):
        """A line's place as a count through the epochs (the module's docstring); before any epoch was read,
        its own epoch is the first."""
        first = self.first_epoch if self.first_epoch is not None else epoch
        return max(0, epoch - first) * self.epoch_steps + step

    def _count(self, step, place):
        if self.step is None or step > self.step:
            self.step, self.step_at, self.place, self.low = step, time.time(), place, None
        elif step < self.step:
            if self.low is not None and self.low[0] < step and self.fall is None:
                self.fall = (self.step, self._shown(self.step, self.place), self._shown(*self.low))
            if self.low is None and step <= self.step // 2 or self.low is not None and step < self.low[0]:
                self.low = (step, place)

    def fell(self):
        """The first fall (the module's docstring), once: (the step it fell from, that step as shown, and the
        step it fell to, as shown), else None."""
        if self.fall is None or self.fall_told:
            return None
        self.fall_told = True
        return self.fall

    def fallen(self):
        """The first fall, while the step has not risen past where it fell from since: (from, to) as shown."""
        return self.fall[1:] if self.fall is not None and self.fall[0] == self.step else None

    @staticmethod
    def _shown(step, place):
        return str(step) if place is None else "%d (epoch %d step %d)" % (step, place[0], place[1])

    def due(self):
        """Seconds until report() or read_file() has something to do; None: nothing to wait for."""
        dues = []
        if self.step is not None and self.step != self.reported:
            dues.append(self.report_due - time.monotonic())
        if self.file is not None:
            dues.append(self.file_due - time.monotonic())
        return max(0.0, min(dues)) if dues else None

    def report(self, final=False):
        """(step, epoch seconds it was reached) once a step not yet reported may be (`final`: the run ended,
        it may now); else None."""
        self.read_file()
        if self.step is None or self.step == self.reported or (time.monotonic() < self.report_due and not final):
            return None
        self.reported = self.step
        self.report_due = time.monotonic() + REPORT_EVERY_S
        add_sample(self.samples, self.step_at, self.step)
        return self.step, self.step_at

    def epoch_fields(self):
        """With an epoch group: where the highest step was reached and what its count is made of, for the
        launcher's record (and a later attempt's `progress["epochs"]`); else {}."""
        if not self.epochs or self.place is None:
            return {}
        return {"epoch": self.place[0], "epoch_step": self.place[1], "first_epoch": self.first_epoch,
                "epoch_steps": self.epoch_steps}


def step_group(pattern):
    """The group of a compiled pattern that holds the step: the one named `step`, else the first that is
    not the one named `epoch`."""
    named = pattern.groupindex
    if "step" in named:
        return named["step"]
    return next((group for group in range(1, pattern.groups + 1) if group != named.get("epoch")), 1)


def _number(text):
    return text is not None and text.strip().isdigit()


def add_sample(samples, at, step):
    """Append (at, step) to a flat list of samples [T, S, T, S, ...], which keeps at most MAX_SAMPLES + 1
    pairs however long the run: past that, every other pair goes (the first and the latest stay), so a
    week-long run keeps its shape at a coarser grain."""
    samples += [round(at, 3), step]
    if len(samples) > 2 * MAX_SAMPLES:
        pairs = [samples[index:index + 2] for index in range(0, len(samples), 2)]
        kept = pairs[::2] + ([pairs[-1]] if len(pairs) % 2 == 0 else [])
        samples[:] = [number for pair in kept for number in pair]


def auto_bound(advances, multiple=AUTO_MULTIPLE, floor_s=AUTO_FLOOR_S, cap_s=AUTO_CAP_S):
    """`stall: auto`'s bound in seconds, from the job's advances [(seconds, step), ...] in order (an advance
    may span several steps: steps are reported at most every REPORT_EVERY_S): `multiple` times the median
    time per step over the last AUTO_WINDOW advances, within [floor_s, cap_s]; cap_s until AUTO_STEPS_NEEDED
    steps after the first were timed."""
    recent = advances[-(AUTO_WINDOW + 1):]
    spans = [(at - before_at, step - before) for (before_at, before), (at, step) in zip(recent, recent[1:])
             if step > before]
    if sum(steps for _, steps in spans) < AUTO_STEPS_NEEDED:
        return cap_s
    per_step = sorted(seconds / steps for seconds, steps in spans)
    middle = len(per_step) // 2
    median = per_step[middle] if len(per_step) % 2 else (per_step[middle - 1] + per_step[middle]) / 2
    return min(cap_s, max(floor_s, multiple * median))
