"""The job's step on this worker (the spec's `progress`), read by its agent: from the run's output lines
(the pattern's first group), or from a file the job writes its step into, read every FILE_EVERY_S.
Standard library only, Python 3.8+; nothing done at import (re is imported only by jobs with a pattern).

A worker's step is the highest it reached: a line whose step is lower (another rank behind, a log line
that quotes an old step) changes nothing, so the step must grow through the run (a global step, not one
that starts over each epoch). A step reached is reported at most every REPORT_EVERY_S, with the time it
was reached: a job of ten steps a second costs one message a second per worker, and the time is exact.

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
        if progress.get("pattern") is not None:
            import re

            self.pattern = re.compile(progress["pattern"].encode(errors="surrogateescape"))
        self.file = os.path.join(cwd, progress["file"]) if progress.get("file") is not None else None
        self.file_due = 0.0  # when the file is read next (time.monotonic())
        self.file_seen = None  # its (mtime, size) when last read
        self.partial = b""  # the end of the output after its last line break
        self.step = None  # the highest step reached
        self.step_at = None  # when it was reached (epoch seconds)
        self.reported = None  # the step last reported
        self.report_due = 0.0  # when the next report may go (time.monotonic())
        self.samples = []  # the steps reported, with when each was reached: [T, S, T, S, ...] (add_sample)

    def feed(self, data):
        """Output of the run: the step of its last complete line that has one."""
        if self.pattern is None:
            return
        text = self.partial + data
        cut = max(text.rfind(b"\n"), text.rfind(b"\r"))
        if cut < 0:
            self.partial = text[-LONGEST_LINE:]
            return
        self.partial = text[cut + 1:][-LONGEST_LINE:]
        for line in reversed(text[:cut].splitlines()):
            match = self.pattern.search(line)
            if match is not None and self._reached(match.group(1)):
                return

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
        if self.step is None or step > self.step:
            self.step, self.step_at = step, time.time()
        return True

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
