"""Stop a detached job's run on one worker: SIGTERM to its agent, which stops the step's whole
tree as on any stop and then writes run.exit.

argv: JOB_DIR WAIT_S. Exits 0 once run.exit exists, 1 if it does not within WAIT_S.
"""

import os
import signal
import sys
import time


def main():
    job_dir, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
    try:
        with open(os.path.join(job_dir, "run.agent")) as handle:
            os.kill(int(handle.read()), signal.SIGTERM)
    except (OSError, ValueError):
        pass  # already gone
    exit_file = os.path.join(job_dir, "run.exit")
    while not os.path.exists(exit_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(0 if os.path.exists(exit_file) else 1)


if __name__ == "__main__":
    main()
