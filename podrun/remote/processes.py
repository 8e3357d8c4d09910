"""The step's processes: starting one in a session of its own (spawn), whether it exited, and
who else belongs to the step (its process group, its ancestry in /proc, the tree below the agent as
a child subreaper). Standard library only, Python 3.8+, nothing done at import.
"""

import os

try:
    import _signal as signal  # what `signal` wraps in enums: the same functions and constants
except ImportError:  # not CPython
    import signal

SPAWN_FAILED = 127
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# signal numbers by name, without the aliases Linux also defines for SIGCHLD, SIGABRT and SIGIO
SIGNAL_NAMES = {getattr(signal, name): name for name in dir(signal)
                if name.startswith("SIG") and "_" not in name and name not in ("SIGCLD", "SIGIOT", "SIGPOLL")}


def spawn(argv, cwd, env, output):
    """Start argv in a session of its own (killpg then reaches its whole tree), stdin from /dev/null,
    stdout and stderr to `output`; returns its pid, or raises OSError saying why it could not start."""
    error_read, error_write = os.pipe()  # closed by a successful exec (descriptors are CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(error_read)
            os.setsid()
            os.chdir(cwd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(output, 1)
            os.dup2(output, 2)
            os.execve(argv[0], argv, env)
        except OSError as error:
            os.write(error_write, ("%d %s" % (error.errno or 0, error.strerror or error)).encode())
        finally:
            os._exit(SPAWN_FAILED)
    os.close(error_write)
    failure = os.read(error_read, 4096)
    os.close(error_read)
    if failure:
        os.waitpid(pid, 0)
        errno, _, message = failure.decode(errors="replace").partition(" ")
        raise OSError(int(errno), message)
    return pid


def shell():
    return which("bash") or "/bin/sh"


def which(program):
    for directory in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        candidate = os.path.join(directory, program)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def descends_from(pid, ancestor):
    while pid > 1:
        try:
            with open("/proc/%d/stat" % pid) as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])  # the parent's pid, after the name
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
    return False


def become_subreaper():
    """Make this process the reaper of its orphaned descendants (Linux 3.4+): a process the step started
    then stays below the agent once its parent is gone (setsid and a double fork included), where
    children() finds it. True if that holds here: the prctl worked and /proc lists children (Linux 3.5+,
    CONFIG_PROC_CHILDREN). prctl is reached through _ctypes, ctypes' C core: 0.5 ms to import, where
    ctypes itself costs 3 ms (CPython 3.8 to 3.13; `os` has no prctl). Not inherited by a fork: the
    agent calls it itself, after detaching."""
    if not os.path.exists("/proc/self/task/%d/children" % os.getpid()):
        return False
    try:
        import _ctypes
        prctl = _ctypes.dlsym(_ctypes.dlopen(None, os.RTLD_NOW), "prctl")
        return _ctypes.call_function(prctl, (PR_SET_CHILD_SUBREAPER, 1)) == 0
    except (ImportError, AttributeError, OSError):  # no _ctypes, no prctl in this libc
        return False


def children(pid):
    """The pids of pid's children, through each of its threads' /proc/PID/task/TID/children: reads only
    pid's own entries, never all of /proc."""
    found = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return found
    for task in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, task)) as handle:
                found.extend(int(child) for child in handle.read().split())
        except (OSError, ValueError):
            continue
    return found


def descendants(pids):
    """Every process below the given ones (not themselves), read from their children() downwards."""
    found = []
    pending = list(pids)
    while pending:
        below = children(pending.pop())
        found.extend(below)
        pending.extend(below)
    return found


def reap_adopted(ours):
    """Reap the exited orphans a subreaper adopted (nothing else waits for them), leaving the children
    in `ours` to whoever waits for each."""
    for pid in children(os.getpid()):
        if pid not in ours:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def group_of(pid):
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def pidfd(pid):
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python < 3.9 or Linux < 5.3: poll instead
        return None


def exited(pid):
    """(code, signal name) once the child has exited, without reaping it; None while it runs."""
    result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if result is None or result.si_pid == 0:
        return None
    if result.si_code == os.CLD_EXITED:
        return result.si_status, None
    return 128 + result.si_status, SIGNAL_NAMES.get(result.si_status, "signal %d" % result.si_status)
