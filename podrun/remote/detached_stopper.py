"""Stop a detached job's run on one worker: SIGTERM to its agent, which stops the step's whole
tree as on any stop and then writes run.exit.

stdin: JOB_DIR, WAIT_S, JOB_ID and WORKER, a line each (not argv, which `ps` shows to everyone).
Exits 0 once run.exit exists, 1 if it does not within WAIT_S.
run.agent holds the agent's pid and its kernel start time ("PID START"): a process with that pid
but another start time is a stranger that got the pid after the agent ended, and is left alone.
The agent is then found as the parent of the step's process group leader (run.pid), known as the
job's by the PODRUN_JOB_ID and PODRUN_WORKER in its environment and this user's (stacks.marked), as
the agent's own sweep knows the job's processes (and by its command line, the agent's); with no agent
left, those processes get the SIGTERM themselves. What was not ours is said on stderr, one line each.
"""

import os
import signal
import sys
import time

try:  # on a worker, sent ahead of this file (transport/base.py, script_modules)
    stacks = sys.modules["podrun_remote_stacks"]
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import stacks


FORKED = b"podrun's fork server of local workers"  # forkserver.COMMAND_MARK (not sent to workers with this)


def main():
    job_dir, wait_s, job_id, worker = sys.stdin.read().splitlines()[:4]
    deadline = time.monotonic() + float(wait_s)
    for pid in _to_signal(job_dir, job_id, worker):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass  # already gone
    exit_file = os.path.join(job_dir, "run.exit")
    while not os.path.exists(exit_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(0 if os.path.exists(exit_file) else 1)


def _to_signal(job_dir, job_id, worker):
    """The agent's pid, proven ours; else the job's own processes, found by their environment."""
    recorded = _read_words(os.path.join(job_dir, "run.agent"))
    if not recorded:
        return []  # the step never started here
    pid = int(recorded[0])
    if not os.path.isdir("/proc"):
        return [pid]  # no start time to tell it by (not Linux): as recorded
    start = stacks.start_of(pid)
    if start is not None and start == (recorded[1:] or [None])[0]:
        return [pid]
    if start is not None:
        sys.stderr.write("run.agent names pid %d, which is not this job's agent (another process got the pid): "
                         "left alone\n" % pid)
    job = stacks.marked(job_id, worker)
    leader = int((_read_words(os.path.join(job_dir, "run.pid")) or ["0"])[0])
    agent = int(stacks.field_of(leader, "PPid:") or 0) if leader in job else 0
    if agent > 1 and agent not in job and _is_agent(agent):
        if start is not None:
            sys.stderr.write("stopping the job's agent, pid %d, found as the parent of its processes\n" % agent)
        return [agent]
    if job:
        sys.stderr.write("no agent of the job is left: SIGTERM to its %d processes\n" % len(job))
    return sorted(job)


def _is_agent(pid):
    """Whether pid runs podrun's agent (transport/base.py's BOOTSTRAP names the script it compiles; a local
    worker's agent keeps the command line of the fork server it was forked from, whose children are
    podrun's scripts, and of those only an agent has a job's processes as its children): a leader whose
    agent died has another parent now, a subreaper that must not get the SIGTERM."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            command = handle.read()
    except OSError:
        return False
    return b"c('agent-" in command or FORKED in command


def _read_words(path):
    try:
        with open(path) as handle:
            return handle.read().split()
    except (OSError, ValueError):
        return []


if __name__ == "__main__":
    main()
