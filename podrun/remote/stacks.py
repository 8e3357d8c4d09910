"""The stacks of one job's Python processes on this worker: what a stall and `podrun stacks` save.

The job's processes are its agent's descendants and the members of the session the agent made for the step
(which no other process can join): never processes known by what their environment says, which any local
user can copy. The Python ones among them (their executable is a python) each get a section: `py-spy dump
--pid P`, with the py-spy the agent found on the job's PATH when the step started (<step>.py-spy in the job's
directory, the job's user's and writable by no one else), else what the kernel shows (its state, wchan,
/proc/PID/stack where readable, the command line), with a note that py-spy would give the Python stack.
So where the job runs as root, no other user gets a program run as root, or their process dumped. A
section's header names the process, its parent and the RANK a launcher such as torchrun gave it, if any:
what launch/odd_ones.py compares the workers' processes by.

Run as a script (stdin: the job's directory on this worker, not on the command line, which `ps` shows to
everyone; the text goes to stdout), or by the agent of a watched job on a stall (text()). The detached
stopper tells a process by its start time here (start_of), and finds the processes still marked as the
job's where no agent is left (marked). Standard library only, Python 3.8+, nothing done at import: the agent loads
it at every start (transport/base.py), and imports subprocess only when it dumps.
"""

import os
import sys

PY_SPY_TIMEOUT_S = 20  # a process that cannot be paused (D state, ptrace refused) must not hold the rest
STEPS = ("run", "setup")  # the step whose agent is alive is dumped; run, once it started


def text(agent, session, py_spy, container=None):
    """Every Python process of the job under `agent` (its descendants, the members of the step's
    `session`, and the processes of its docker `container`), each with its stacks by the program
    `py_spy` (None: the kernel's view), as one text."""
    processes = job_processes(agent, session, container_pid(container) if container else 0)
    pythons = [pid for pid in processes if _is_python(pid)]
    if not pythons:
        others = "".join("  %d %s\n" % (pid, _command(pid)) for pid in processes) or "  none\n"
        return "no Python process of the job on this worker; its processes:\n%s" % others
    dumps = [(pid, _start_py_spy(py_spy, pid)) for pid in pythons]  # all at once: each pauses one
    return "\n".join(_section(pid, dump) for pid, dump in dumps)


def text_of_job_dir(job_dir):
    """text() of the job whose step's files are in job_dir (the step's agent, proven by its start time)."""
    for step in STEPS:
        recorded = _read(os.path.join(job_dir, step + ".agent")).split()
        if recorded:
            break
    else:
        return "the job has not started on this worker yet: no process of it to dump\n"
    agent, start = int(recorded[0]), start_of(int(recorded[0]))
    if start is None or start != (recorded[1:] or [None])[0]:
        return "the job's agent on this worker has ended: no process of it is left to dump\n"
    session = int(_read(os.path.join(job_dir, step + ".pid")) or 0)
    container = _read(os.path.join(job_dir, step + ".container")) or None
    return text(agent, session, recorded_py_spy(os.path.join(job_dir, step + ".py-spy")), container)


def container_pid(name):
    """The pid of the docker container `name`'s first process, as docker's daemon says (0: none). The
    daemon starts a container's processes, not the agent, and a name is the container's alone while it exists."""
    import subprocess

    try:
        found = subprocess.run(["docker", "container", "inspect", "--format", "{{.State.Pid}}", name],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=PY_SPY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    answer = found.stdout.decode(errors="replace").strip()
    return int(answer) if found.returncode == 0 and answer.isdigit() else 0


def job_processes(agent, session, container=0):
    """Pids of agent's and container's descendants (container's own too) and of session's members, but
    for the agent itself, this process and zombies: from every process's parent and session in
    /proc/PID/stat, which the kernel alone writes."""
    children, members = {}, []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except (OSError, IndexError):
            continue
        if fields[0] == "Z":
            continue
        pid, parent = int(entry), int(fields[1])
        children.setdefault(parent, []).append(pid)
        if session and int(fields[3]) == session:
            members.append(pid)
    roots = [agent, container] if container else [agent]  # pid 0's children are init and kthreadd: never a root
    # a member's descendants too: torchrun starts each rank in a session of its own
    found, waiting = set(members) | set(roots[1:]), roots + members
    while waiting:
        for child in children.get(waiting.pop(), ()):
            if child not in found:
                found.add(child)
                waiting.append(child)
    return sorted(found - {agent, os.getpid()})


def find_py_spy(path, cwd):
    """The absolute path of the py-spy that a command started in cwd with this PATH would run, or "": found
    once, as the step starts, and used for its stacks whatever PATH a process of the job has later."""
    for directory in path.split(os.pathsep):
        candidate = os.path.join(cwd, directory, "py-spy")
        if directory and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return ""


def recorded_py_spy(path):
    """The py-spy the agent recorded in path (find_py_spy), or None: none was found, or the record is not
    this user's own, writable by no one else."""
    try:
        with open(path) as handle:
            info = os.fstat(handle.fileno())
            program = handle.read().strip()
    except OSError:
        return None
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        return None
    return program or None


def marked(job_id, worker):
    """Pids of this user's processes whose environment holds the job's PODRUN_JOB_ID and PODRUN_WORKER
    (as the job's processes inherit them): the agent's sweep, and the detached stopper where no agent is
    left. Only ever signalled: a process of another user that copies the variables is not this user's."""
    wanted = {b"PODRUN_JOB_ID=" + job_id.encode(), b"PODRUN_WORKER=" + str(worker).encode()}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat("/proc/" + entry).st_uid != os.getuid():
                continue
            with open("/proc/%s/environ" % entry, "rb") as handle:
                variables = set(handle.read().split(b"\0"))
        except OSError:
            continue
        if wanted <= variables:
            found.append(int(entry))
    return sorted(found)


def start_of(pid):
    """The kernel's start time of process pid (clock ticks after boot, as text): with the pid, who it
    is, as a reused pid is another process; None for no such process, or a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except (OSError, IndexError):
        return None
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def field_of(pid, name):
    """A `Name:` line's value in /proc/PID/status ("PPid:"), or ""."""
    return _read("/proc/%d/status" % pid, name)


def _is_python(pid):
    try:
        name = os.path.basename(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        name = os.path.basename(_command(pid).split(" ", 1)[0])
    return name.startswith("python") or name.startswith("pypy")


def _start_py_spy(py_spy, pid):
    """The py-spy dump of pid under way (a Popen), or None without a py-spy."""
    if py_spy is None:
        return None
    import subprocess

    return subprocess.Popen([py_spy, "dump", "--pid", str(pid)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _section(pid, dump):
    rank = _rank(pid)
    header = "=== pid %d (parent %s%s): %s ===\n" % (pid, field_of(pid, "PPid:") or "?",
                                                   ", rank " + rank if rank else "", _command(pid))
    if dump is not None:
        import subprocess

        try:
            output, _ = dump.communicate(timeout=PY_SPY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            dump.kill()
            output, _ = dump.communicate()
            output += b"\npy-spy gave no dump within %ds\n" % PY_SPY_TIMEOUT_S
        if dump.returncode == 0:
            return header + "py-spy dump --pid %d:\n%s" % (pid, output.decode(errors="replace"))
        note = "py-spy dump --pid %d failed (exit %s):\n%s\n" % (pid, dump.returncode, output.decode(errors="replace"))
    else:
        note = ("py-spy is not on the job's PATH (as its step started): with it (pip install py-spy) this shows "
                "the Python stack\n")
    return header + note + _kernel_view(pid)


def _rank(pid):
    """The RANK that torchrun (or a launcher like it) gave the process, or "": what names it in the summary."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            variables = handle.read().split(b"\0")
    except OSError:
        return ""
    found = [entry[5:].decode(errors="replace") for entry in variables if entry.startswith(b"RANK=")]
    return found[0] if found and found[0].isdigit() else ""


def _kernel_view(pid):
    lines = ["state: %s, wchan: %s" % (_read("/proc/%d/status" % pid, "State:") or "?",
                                       _read("/proc/%d/wchan" % pid) or "?")]
    for task in sorted(os.listdir("/proc/%d/task" % pid) if os.path.isdir("/proc/%d/task" % pid) else [], key=int):
        stack = _read("/proc/%d/task/%s/stack" % (pid, task))
        wchan = _read("/proc/%d/task/%s/wchan" % (pid, task)) or "?"
        lines.append("thread %s: wchan %s" % (task, wchan))
        if stack:
            lines.extend("  " + frame for frame in stack.splitlines())
    return "\n".join(lines) + "\n"


def _read(path, field=None):
    """A /proc file's text (or the value of one of its `Name:` lines); "" if unreadable."""
    try:
        with open(path, errors="replace") as handle:
            content = handle.read()
    except OSError:
        return ""
    if field is None:
        return content.strip()
    for line in content.splitlines():
        if line.startswith(field):
            return line[len(field):].strip()
    return ""


def _command(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return " ".join(handle.read().replace(b"\0", b" ").decode(errors="replace").split()) or "?"
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.stdout.write(text_of_job_dir(sys.stdin.read().splitlines()[0]))
