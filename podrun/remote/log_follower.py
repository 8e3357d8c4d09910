"""A detached job's output on one worker, from an offset, and its exit once the run has ended.

stdin: JOB_DIR, OFFSET and FOLLOW (1: keep following output.log until run.exit exists), a line each
(not argv, which `ps` shows to everyone). Writes the log's bytes from OFFSET to stdout, then to stderr
one JSON line, {"exit": run.exit's JSON or null, "output_at": when output.log last grew (epoch seconds)
or null, "step": [the job's step on this worker, when it was reached] from run.step, or null (the spec's
progress: step.py), "samples": once the run ended, its steps over time from run.steps, [T, S, ...] or
null, "notified": notify.json's JSON (what worker 0's agent told of the job's end: agent.py) or null},
then the stacks a stall saved (run.stacks), if any.
"""

import os
import sys
import time

POLL_S = 0.2


def main():
    job_dir, offset, follow = sys.stdin.read().splitlines()[:3]
    offset, follow = int(offset), follow == "1"
    log, exit_file = os.path.join(job_dir, "output.log"), os.path.join(job_dir, "run.exit")
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


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


if __name__ == "__main__":
    main()
