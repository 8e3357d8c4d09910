"""The stacks of one job's Python processes on this worker: what a stall and `podrun stacks` save.

The job's processes are this user's processes whose environment holds the job's PODRUN_JOB_ID and
PODRUN_WORKER (as the agent's stop sweep finds them); the Python ones among them (their executable
is a python) each get a section: `py-spy dump --pid P` where py-spy is on that process's own PATH,
else what the kernel shows (its state, wchan, /proc/PID/stack where readable, the command line),
with a note that py-spy would give the Python stack.

Run as a script (argv: JOB_ID WORKER; the text goes to stdout), or by the agent of a watched job on
a stall (text()). The detached stopper finds the job's processes here too, and tells a process by
its start time (start_of). Standard library only, Python 3.8+, nothing done at import: the agent loads it at
every start (transport/base.py), and imports subprocess only when it dumps.
"""

import os
import sys

PY_SPY_TIMEOUT_S = 20  # a process that cannot be paused (D state, ptrace refused) must not hold the rest


def text(job_id, worker):
    """Every Python process of the job on this worker, each with its stacks, as one text."""
    processes = job_processes(job_id, worker)
    pythons = [(pid, environ) for pid, environ in processes if _is_python(pid)]
    if not pythons:
        others = "".join("  %d %s\n" % (pid, _command(pid)) for pid, _ in processes) or "  none\n"
        return "no Python process of job %s on worker %s; its processes:\n%s" % (job_id, worker, others)
    dumps = [(pid, _start_py_spy(pid, environ)) for pid, environ in pythons]  # all at once: each pauses one
    return "\n".join(_section(pid, dump) for pid, dump in dumps)


def job_processes(job_id, worker):
    """(pid, environment as a dict of bytes) of this user's processes of the job on this worker."""
    wanted = {b"PODRUN_JOB_ID=" + job_id.encode(), b"PODRUN_WORKER=" + str(worker).encode()}
    found = []
    for entry in sorted(os.listdir("/proc"), key=lambda name: (len(name), name)):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                variables = handle.read().split(b"\0")
        except OSError:
            continue
        if wanted.issubset(variables):
            found.append((int(entry), dict(variable.partition(b"=")[::2] for variable in variables)))
    return found


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


def _start_py_spy(pid, environ):
    """The py-spy dump of pid under way (a Popen), or None when py-spy is not on the process's PATH."""
    import subprocess

    py_spy = _which("py-spy", environ.get(b"PATH", b"").decode(errors="replace"))
    if py_spy is None:
        return None
    return subprocess.Popen([py_spy, "dump", "--pid", str(pid)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _section(pid, dump):
    header = "=== pid %d: %s ===\n" % (pid, _command(pid))
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
        note = "py-spy is not on the job's PATH: with it (pip install py-spy) this shows the Python stack\n"
    return header + note + _kernel_view(pid)


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


def _which(program, path):
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory, program)
        if directory and os.access(candidate, os.X_OK):
            return candidate
    return None


if __name__ == "__main__":
    sys.stdout.write(text(sys.argv[1], sys.argv[2]))
