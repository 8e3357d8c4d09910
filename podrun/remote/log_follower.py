"""A detached job's output on one worker, from an offset, and its exit once the run has ended.

stdin: JOB_DIR, OFFSET, FOLLOW (1: keep following output.log until run.exit exists) and BEAT (seconds, 0
for none: a supervisor host follows: touch supervisor.beat that often while following, which tells the
job's hub that it is there: hub.py), a line each (not argv, which `ps` shows to everyone). A follower whose reader is gone
(its SSH session ended: the supervisor was killed) stops following at once.

Writes the log's bytes from OFFSET to stdout; while following, to stderr a line "step S T" each time run.step
changes (at most once a STEP_EVERY_S: what `podrun jobs` shows of a followed job as it runs); then to stderr
one JSON line, {"exit": run.exit's JSON or
null, "output_at": when output.log last grew (epoch seconds) or null, "step": [the job's step on this
worker, when it was reached] from run.step, or null (the spec's progress: step.py), "samples": once the
run ended, its steps over time from run.steps, [T, S, ...] or null, "notified": notify.json's JSON (what
worker 0's agent told of the job's end: agent.py) or null},
then the stacks a stall saved (run.stacks), if any.
"""

import os
import sys
import time

POLL_S = 0.2
STEP_EVERY_S = 1.0
BEAT_FILE = "supervisor.beat"  # as hub.BEAT_FILE


def main():
    job_dir, offset, follow, beat = (sys.stdin.read().splitlines() + ["0"])[:4]
    offset, follow, beat_every = int(offset), follow == "1", float(beat)
    log, exit_file = os.path.join(job_dir, "output.log"), os.path.join(job_dir, "run.exit")
    beat_due = 0.0 if beat_every else None
    step_due, step_told = 0.0, ""
    reader = None
    if follow:
        import select

        reader = select.poll()
        reader.register(1, 0)  # reports only POLLERR and POLLHUP: the other end closed
    while True:
        done = os.path.exists(exit_file)  # looked at before reading: no tail is lost
        try:
            with open(log, "rb") as handle:
                handle.seek(offset)
                for chunk in iter(lambda: handle.read(65536), b""):
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()
                    offset += len(chunk)
        except FileNotFoundError:
            pass
        if done or not follow:
            break
        if reader.poll(0):
            return
        if time.monotonic() >= step_due:
            step_due, step_told = time.monotonic() + STEP_EVERY_S, _tell_step(job_dir, step_told)
        if beat_due is not None and time.monotonic() >= beat_due:
            _touch(os.path.join(job_dir, BEAT_FILE))
            beat_due = time.monotonic() + beat_every
        time.sleep(POLL_S)
    try:
        output_at = repr(os.path.getmtime(log))
    except OSError:
        output_at = "null"
    step = _read(os.path.join(job_dir, "run.step")).split()
    step = "[%s, %s]" % tuple(step) if len(step) == 2 else "null"
    samples = _read(os.path.join(job_dir, "run.steps")).split() if done else []
    samples = "[%s]" % ", ".join(samples) if samples else "null"
    notified = _read(os.path.join(job_dir, "notify.json")) or "null"
    sys.stderr.write('{"exit": %s, "output_at": %s, "step": %s, "samples": %s, "notified": %s}\n'
                     % (_read(exit_file) or "null", output_at, step, samples, notified))
    sys.stderr.write(_read(os.path.join(job_dir, "run.stacks")))


def _tell_step(job_dir, told):
    """run.step's "S T", on stderr if it is not what was told last; returns what has been told."""
    step = _read(os.path.join(job_dir, "run.step")).strip()
    if len(step.split()) == 2 and step != told:
        sys.stderr.write("step %s\n" % step)
        sys.stderr.flush()
        return step
    return told


def _touch(path):
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.utime(path)
    except OSError:
        pass


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


if __name__ == "__main__":
    main()
