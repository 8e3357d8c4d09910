"""A detached job's output on one worker, from an offset, and its exit once the run has ended.

argv: JOB_DIR OFFSET FOLLOW (1: keep following output.log until run.exit exists). Writes the log's
bytes from OFFSET to stdout, then run.exit's JSON, if there is one, to stderr.
"""

import os
import sys
import time

POLL_S = 0.2


def main():
    job_dir, offset, follow = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
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
    if os.path.exists(exit_file):
        with open(exit_file) as handle:
            sys.stderr.write(handle.read())


if __name__ == "__main__":
    main()
