"""The processes that hold a TPU VM's accelerator (a job's first step, agent.py's probe), stopped
first with kill_stale. Standard library only, Python 3.8+, nothing done at import.
"""

import os
import sys
import time

try:  # on a worker, sent ahead of this file (transport/base.py, script_modules)
    processes = sys.modules["podrun_remote_processes"]
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import processes

signal = processes.signal  # its C core (processes.py)


def find(probe):
    """(pid, file, command line) of the processes holding a file of accelerator_files; with
    kill_stale, they are stopped first (TERM, KILL after stale_grace). A file matches by identity,
    not by name: the same device (st_rdev), so a container's /dev/accel0 counts, or the same inode."""
    import glob  # only TPU VMs look: it costs 4.5 ms of start-up (through re)
    import stat

    def identity(info):
        return ("device", info.st_rdev) if stat.S_ISCHR(info.st_mode) else ("file", info.st_dev, info.st_ino)

    wanted = set()
    for pattern in probe["accelerator_files"].split(":"):
        for path in glob.glob(pattern):
            try:
                wanted.add(identity(os.stat(path)))
            except OSError:
                pass
    holders = {}
    for pid in filter(str.isdigit, os.listdir("/proc") if wanted else []):
        if int(pid) == os.getpid():
            continue
        try:
            descriptors = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            continue  # gone, or another user's (not ours to see)
        for fd in descriptors:
            try:
                if identity(os.stat("/proc/%s/fd/%s" % (pid, fd))) in wanted:
                    path = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                    with open("/proc/%s/cmdline" % pid, "rb") as handle:
                        command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
                    holders[int(pid)] = (path, command or "?")
                    break
            except OSError:
                continue
    if probe.get("kill_stale") and holders:
        for signum in (signal.SIGTERM, signal.SIGKILL):
            for pid in holders:
                try:
                    os.kill(pid, signum)
                except OSError:
                    pass
            deadline = time.monotonic() + float(probe.get("stale_grace", 3))
            while time.monotonic() < deadline and any(os.path.exists("/proc/%d" % pid) for pid in holders):
                time.sleep(0.05)
    return [(pid, path, command) for pid, (path, command) in sorted(holders.items())]


def encoded(holders):
    """find()'s holders as the probe reports them: "pid TAB file TAB command" lines, each newline, tab
    and backslash in a file or command shown as \\n, \\t, \\\\ (an argv may hold any of them)."""
    def one_line(text):
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")

    return "\n".join("%d\t%s\t%s" % (pid, one_line(path), one_line(command)) for pid, path, command in holders)
