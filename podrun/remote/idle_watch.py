"""`idle_delete` on a TPU VM's worker 0: a watcher, started detached by the launcher right after podrun
created the TPU (launch/idle_watch.py), that deletes the TPU with the VM's own credentials
(self_delete.py) once no job has run on this VM for `idle_s`. So the TPU goes even when the laptop
that made it is closed or gone.

stdin: one JSON line {idle_s, poll_s, delete (self_delete's config)}, not argv, which `ps` shows.
stdout: one line once it watches, "watching PID", then it carries on in a session of its own without
stdin, stdout or a terminal, until the TPU is deleted (its VM goes with it) or the deletion fails.

A job runs on this VM while a process of any user runs podrun's agent or relay node (a step, its
probe and setup, the code arriving): each is a BOOTSTRAP'd script whose command line names it
(transport/base.py). A process in another network namespace is on another machine as far as this
one is concerned (a host of the test lab, which shares this kernel); one whose namespace cannot be
read (another user's, to a user without the right to look) counts. Every `poll_s` the watcher looks;
the idle time counts from the last look that found one, or from its own start. The job directories
under ~/.podrun/jobs changing (an agent that just started or ended) count as a job then too.

One watcher per VM: a new one (a TPU created again under the same home, another `idle_delete`) stops
the one in ~/.podrun/idle_watch.pid, known by its pid and start time, and waits for its lock. What
came of the deletion goes to ~/.podrun/idle_delete.log, one line each: where the VM's service account
may not delete it, the TPU stays, labelled, and `podrun list --orphans` shows it. Standard library
only, Python 3.8+, nothing done at import; Linux.
"""

import os
import sys
import time

try:  # on a worker, each was sent ahead of this file (transport/base.py, script_modules)
    self_delete, stacks = (sys.modules["podrun_remote_" + name] for name in ("self_delete", "stacks"))
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import self_delete, stacks

HOME = ".podrun"
PID_FILE = os.path.join(HOME, "idle_watch.pid")
LOCK_FILE = os.path.join(HOME, "idle_watch.lock")
LOG_FILE = os.path.join(HOME, "idle_delete.log")
JOBS_DIR = os.path.join(HOME, "jobs")
SCRIPTS = ("agent", "relay_node")  # the worker-side scripts of a job: while one runs, the VM is in use
LOCK_WAIT_S = 15  # for the watcher it replaced to go
TRIES, RETRY_S = 5, 60  # a deletion that failed as a whole (no token, no answer) is tried again this often
ORPHANS = "the TPU stays, labelled: `podrun list --orphans` shows it and `podrun delete --orphans` deletes it"
GRANT = " (or give the VM's service account roles/tpu.admin)"


def main():
    import json

    config = json.loads(sys.stdin.readline())
    if not os.path.isdir(HOME):
        os.mkdir(HOME, 0o700)
    _stop_the_last()
    lock = _lock()
    if lock is None:
        sys.stdout.write("error: another idle watcher holds %s and did not stop within %ds\n" % (LOCK_FILE, LOCK_WAIT_S))
        sys.exit(1)
    _detach()
    with open(PID_FILE + ".new", "w") as handle:
        handle.write("%d %s" % (os.getpid(), stacks.start_of(os.getpid()) or ""))
    os.replace(PID_FILE + ".new", PID_FILE)
    _log("watching: deletes this TPU after %s with no job on it" % _duration(config["idle_s"]))
    idle_for(config["idle_s"], config["poll_s"])
    idle = "no job for %s: " % _duration(config["idle_s"])
    for left in range(TRIES - 1, -1, -1):
        line, outcome = self_delete.attempt(config["delete"])
        if outcome != "failed" or not left:
            break
        _log(idle + line + "; trying again in %ds" % RETRY_S)
        time.sleep(RETRY_S)
    _log(idle + line + ("" if outcome == "done" else "; " + ORPHANS + (GRANT if outcome == "denied" else "")))
    os.unlink(PID_FILE)


def idle_for(idle_s, poll_s):
    """Return once no job has run on this VM for idle_s seconds."""
    last_busy = time.time()
    while True:
        now = time.time()
        last_busy = now if in_use() else max(last_busy, min(now, _jobs_changed()))
        left = last_busy + idle_s - now
        if left <= 0:
            return
        time.sleep(min(poll_s, left))


def in_use():
    """Whether a process on this VM runs one of podrun's job scripts (any user's: the VM is shared)."""
    marks = [("c('%s-" % name).encode() for name in SCRIPTS]
    here = (_network_namespace("self"), None)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as handle:
                command = handle.read()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(mark in command for mark in marks) and _network_namespace(entry) in here:
            return True
    return False


def _network_namespace(process):
    try:
        return os.readlink("/proc/%s/ns/net" % process)
    except OSError:
        return None


def _jobs_changed():
    """When a job directory last changed (an agent made it, or wrote its pid or exit there); 0: never."""
    try:
        names = os.listdir(JOBS_DIR)
    except OSError:
        return 0
    times = [0.0]
    for name in names:
        try:
            times.append(os.stat(os.path.join(JOBS_DIR, name)).st_mtime)
        except OSError:
            pass
    return max(times)


def _stop_the_last():
    """SIGTERM the watcher PID_FILE names, if it is still that process (its start time matches)."""
    try:
        with open(PID_FILE) as handle:
            pid, _, start = handle.read().partition(" ")
    except OSError:
        return
    if pid.isdigit() and start and stacks.start_of(int(pid)) == start.strip():
        try:
            os.kill(int(pid), 15)
        except OSError:
            pass


def _lock():
    """The watchers' lock, held for this watcher's life (its descriptor stays open); None if it stays taken."""
    import fcntl

    descriptor = os.open(LOCK_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return descriptor
        except OSError:
            if time.monotonic() > deadline:
                os.close(descriptor)
                return None
            time.sleep(0.05)


def _detach():
    """Go on in a session of our own, with no stdin, stdout or stderr; the starter's process says
    "watching PID" and exits, which ends the launcher's command."""
    read_end, write_end = os.pipe()
    if os.fork():
        os.close(write_end)
        pid = os.read(read_end, 64).decode().strip()
        sys.stdout.write("watching %s\n" % pid if pid else "error: the watcher did not start\n")
        sys.stdout.flush()
        os._exit(0 if pid else 1)
    os.close(read_end)
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for descriptor in (0, 1, 2):
        os.dup2(null, descriptor)
    os.write(write_end, b"%d" % os.getpid())
    os.close(write_end)


def _log(text):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    descriptor = os.open(LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(descriptor, ("%s %s\n" % (stamp, text)).encode())
    finally:
        os.close(descriptor)


def _duration(seconds):
    """`2h`, `1h30m`, `45m`, `3s`."""
    hours, rest = divmod(int(round(seconds)), 3600)
    minutes, secs = divmod(rest, 60)
    text = "".join("%d%s" % (value, unit) for value, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if value)
    return text or "0s"


if __name__ == "__main__":
    main()
