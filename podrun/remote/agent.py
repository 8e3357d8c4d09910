"""podrun's worker-side agent: runs one step of a job on this worker and stays with it to the end.

It is sent over the channel's stdin for every step (see transport.agent_command), never installed,
so it uses the standard library only and runs on the worker's own python3 (3.8 or newer). It starts
on every worker for every step, so it imports only built-in modules: json, subprocess, shutil and
selectors would double its start-up (they pull in re, collections and more), and even `signal`
costs 4.5 ms of a 7 ms Python start (it builds enums), so the agent uses its C core, `_signal`.

Protocol
  stdin   the step: a decimal byte count, a newline, then that many bytes of marshal format 4 (readable
          by every Python 3.4+) holding {job_id, worker, step, cwd, command, env, grace, heartbeat,
          detach} and, for a job's first step, "probe"; then control lines: "stop" asks for a
          graceful stop; any line is a heartbeat. End of input, or no line for `heartbeat` seconds (a
          link that died silently), means the launcher is gone: the job stops too.
  probe   {code_dir, and on a TPU VM accelerator_files (glob patterns, colon-separated), kill_stale,
          stale_grace}: before starting anything the agent reports {"event": "probe", "code": 1 if
          code_dir exists else 0, "holders": "pid TAB file TAB command" lines of the processes that
          hold the TPU (killed first with kill_stale)}, then waits for the line "go" (the launcher
          ships the code and checks every worker meanwhile); "stop" or end of input instead: it exits.
          So one channel per worker does what would otherwise take three.
  stdout  the command's output, stdout and stderr merged, byte for byte.
  stderr  JSON event lines: {"event": "started", "pid": P}, {"event": "exited", "code": C,
          "signal": NAME or null}, {"event": "error", "message": M}.
Files, under ~/.podrun/jobs/<job_id>/ (mode 0700), so that output survives the launcher:
  output.log (every byte of every step), <step>.pid (the step's process group), <step>.agent (the
  agent's pid: SIGTERM to it stops the step cleanly), <step>.exit (JSON).
With "detach": true the agent reports {"event": "detached", "pid": P} and carries on in a session
of its own, without stdin or stdout, until the step ends or it receives SIGTERM.

Stopping sends SIGTERM to the step's process group and to every process that still carries this
job's PODRUN_JOB_ID and PODRUN_WORKER in its environment (which catches children that left the
group with setsid), then SIGKILL after the grace period. The same sweep runs after a normal exit,
so nothing the step started outlives it.
"""

import os
import select
import sys
import time

try:
    framing = sys.modules["podrun_remote_framing"]  # on a worker: sent ahead of this file (transport/base.py)
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import framing

try:
    import _signal as signal  # what `signal` wraps in enums: the same functions and constants
except ImportError:  # not CPython
    import signal

SPAWN_FAILED = 127
# signal numbers by name, without the aliases Linux also defines for SIGCHLD, SIGABRT and SIGIO
SIGNAL_NAMES = {getattr(signal, name): name for name in dir(signal)
                if name.startswith("SIG") and "_" not in name and name not in ("SIGCLD", "SIGIOT", "SIGPOLL")}
JSON_ESCAPES = {**{code: "\\u%04x" % code for code in range(32)}, ord('"'): '\\"', ord("\\"): "\\\\"}


def main():
    control = ControlInput()
    config = framing.read_message(control)
    job_dir = os.path.abspath(os.path.join(".podrun", "jobs", config["job_id"]))
    for directory in (".podrun", os.path.join(".podrun", "jobs"), job_dir):  # each private, not just the last
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    step = Step(config, job_dir)
    probe = config.get("probe")
    if probe is not None:
        holders = tpu_holders(probe) if probe.get("accelerator_files") else []
        emit(event="probe", code=int(os.path.isdir(probe["code_dir"])),
             holders="\n".join("%d\t%s\t%s" % holder for holder in holders))
        if not control.wait_for("go", step.heartbeat):
            os._exit(0)  # the launcher decided not to start the job, or is gone
    report = detach() if config.get("detach") else None
    try:
        step.start()
    except OSError as error:
        emit(event="error", message="cannot start %r in %s: %s" % (config["command"], config["cwd"], error))
        os._exit(SPAWN_FAILED)
    emit(event="started", pid=step.pid)
    if report is not None:
        os.write(report, b"started")
        os.dup2(os.open(os.devnull, os.O_RDWR), 2)  # closes the last copy of the report pipe
        os.close(report)
        control = None
    code, signal_name = step.supervise(control)
    emit(event="exited", code=code, signal=signal_name)
    # everything went out through os.write: skipping the interpreter's teardown saves ~1 ms of CPU
    # on every worker for every step
    os._exit(code)


def detach():
    """Go on in a session of our own, away from the launcher's channel; returns the descriptor on
    which to tell the waiting original process that the step started. That process relays it as
    {"event": "detached"} (or the step's start error, which the detached agent emits to it) and exits."""
    read_end, write_end = os.pipe()
    if os.fork():
        os.close(write_end)
        relayed = b""
        chunk = os.read(read_end, 65536)
        while chunk:
            relayed += chunk
            chunk = os.read(read_end, 65536)
        pid, _, rest = relayed.partition(b"\n")
        if rest.endswith(b"started"):
            emit(event="detached", pid=int(pid))
            os._exit(0)
        _write_all(2, rest)  # the detached agent's error event
        os._exit(SPAWN_FAILED)
    os.close(read_end)
    os.setsid()
    if os.fork():
        os._exit(0)  # the grandchild can never get the launcher's terminal back
    os.write(write_end, b"%d\n" % os.getpid())
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    os.dup2(write_end, 2)  # until the step starts, events (an error) go to the waiting parent
    return write_end


def emit(**event):
    try:
        os.write(2, (to_json(event) + "\n").encode())
    except OSError:
        pass  # the launcher is gone; the files in the job directory tell the story


def to_json(flat):
    """A flat dict of str, int and None as JSON."""
    def value(item):
        if item is None:
            return "null"
        if isinstance(item, str):
            return '"%s"' % item.translate(JSON_ESCAPES)
        return str(int(item))
    return "{%s}" % ", ".join("%s: %s" % (value(key), value(item)) for key, item in flat.items())


class ControlInput:
    """Unbuffered lines from fd 0, so it can be watched with select next to the output pipe."""

    def __init__(self):
        self.pending = b""

    def read_line(self):
        while b"\n" not in self.pending:
            self._read_more()
        line, self.pending = self.pending.split(b"\n", 1)
        return line

    def read_exactly(self, size):
        while len(self.pending) < size:
            self._read_more()
        data, self.pending = self.pending[:size], self.pending[size:]
        return data

    def _read_more(self):
        chunk = os.read(0, 65536)
        if not chunk:
            raise SystemExit("podrun agent: no step description on stdin")
        self.pending += chunk

    def wait_for(self, word, timeout):
        """Whether the line `word` arrives before "stop", the end of input, or `timeout` seconds
        without any line. Lines behind it stay buffered."""
        while True:
            while b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                command = line.strip().decode(errors="replace")
                if command in (word, "stop"):
                    return command == word
            if not select.select([0], [], [], timeout)[0]:
                return False
            chunk = os.read(0, 4096)
            if not chunk:
                return False
            self.pending += chunk

    def read_commands(self):
        """The complete lines available now, or None at end of input."""
        chunk = os.read(0, 4096)
        if not chunk:
            return None
        self.pending += chunk
        return self.buffered_commands()

    def buffered_commands(self):
        """The complete lines already read but not yet handled: a "stop" sent right behind the step
        arrives in the same read as it, and poll will not report it again."""
        *lines, self.pending = self.pending.split(b"\n")
        return [line.strip().decode(errors="replace") for line in lines]


class Step:
    def __init__(self, config, job_dir):
        self.config = config
        self.job_dir = job_dir
        self.grace = float(config.get("grace", 5))
        self.heartbeat = float(config.get("heartbeat", 20))
        self.pid = None
        self.stop_reason = None

    def start(self):
        env = dict(os.environ)
        env.update(self.config["env"])
        read_end, write_end = os.pipe()
        try:
            self.pid = spawn([_shell(), "-c", self.config["command"]], self.config["cwd"], env, write_end)
        finally:
            os.close(write_end)
        self.output = read_end
        self.log = os.open(os.path.join(self.job_dir, "output.log"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._write_file(self.config["step"] + ".pid", str(self.pid))
        self._write_file(self.config["step"] + ".agent", str(os.getpid()))

    def supervise(self, control):
        """Pump output until the step and everything it started are gone; returns (code, signal name)."""
        poller = Poller()
        poller.register(self.output, "output")
        attached = control is not None
        if attached:
            poller.register(0, "control")
        wakeup = self._watch_signals()
        poller.register(wakeup, "signal")
        exit_watch = _pidfd(self.pid)
        if exit_watch is not None:
            poller.register(exit_watch, "exit")
        stdout_open, output_open = attached, True
        status = None
        ending = Ending(self.grace, self._signal_job)
        heard_at = time.monotonic()
        if attached and "stop" in control.buffered_commands():
            self.request_stop("stop requested")
        while output_open or status is None:
            timeout = ending.timeout(poll=exit_watch is None)
            if attached and not self.stop_reason:
                until_silence = max(0.0, heard_at + self.heartbeat - time.monotonic())
                timeout = until_silence if timeout is None else min(timeout, until_silence)
            for ready in poller.poll(timeout):
                if ready == "output":
                    data = os.read(self.output, 65536)
                    if not data:
                        output_open = False
                        poller.unregister(self.output)
                        continue
                    _write_all(self.log, data)
                    if stdout_open and not _try_write_all(1, data):
                        stdout_open = False
                        self.request_stop("the launcher stopped reading")
                elif ready == "control":
                    heard_at = time.monotonic()
                    commands = control.read_commands()
                    if commands is None:
                        poller.unregister(0)
                        self.request_stop("the launcher is gone")
                    elif "stop" in commands:
                        self.request_stop("stop requested")
                elif ready == "signal":
                    os.read(wakeup, 512)
                elif ready == "exit":
                    poller.unregister(exit_watch)
            if attached and time.monotonic() - heard_at > self.heartbeat:
                self.request_stop("no word from the launcher for %gs" % self.heartbeat)
            if status is None:
                status = _exited(self.pid)
            # once the step exits, whatever it left behind goes too
            if self.stop_reason or status is not None:
                if ending.advance() == Ending.ABANDONED:
                    break  # a process we cannot kill holds the output pipe; stop waiting for it
        os.waitpid(self.pid, 0)  # reap only now: until here the pid, and so the group id, stayed ours
        code, signal_name = status
        self._write_file(self.config["step"] + ".exit",
                         to_json({"code": code, "signal": signal_name, "stop_reason": self.stop_reason}))
        return code, signal_name

    def request_stop(self, reason):
        if self.stop_reason is None:
            self.stop_reason = reason

    def _watch_signals(self):
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda signum, frame: self.request_stop(SIGNAL_NAMES[signum]))
        return wake_read

    def _signal_job(self, signum):
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in _processes_with_env(self._marker()):
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _marker(self):
        return {"PODRUN_JOB_ID": self.config["job_id"], "PODRUN_WORKER": str(self.config["worker"])}

    def _write_file(self, name, text):
        path = os.path.join(self.job_dir, name)
        with open(path + ".tmp", "w") as handle:
            handle.write(text)
        os.replace(path + ".tmp", path)


class Poller:
    """select.poll keyed by names: the selectors module would cost the agent's start-up more."""

    def __init__(self):
        self.poll_object = select.poll()
        self.names = {}

    def register(self, fd, name):
        self.poll_object.register(fd, select.POLLIN)
        self.names[fd] = name

    def unregister(self, fd):
        self.poll_object.unregister(fd)

    def poll(self, timeout):
        """Names of the descriptors ready to read (or closed); timeout in seconds, None: no limit."""
        events = self.poll_object.poll(None if timeout is None else timeout * 1000)
        return [self.names[fd] for fd, _ in events]


class Ending:
    """TERM now, KILL after the grace period, give up on the output one second after that."""

    TERMINATED, KILLED, ABANDONED = 1, 2, 3

    def __init__(self, grace, send):
        self.grace = grace
        self.send = send
        self.phase = None
        self.next_at = None

    def advance(self):
        now = time.monotonic()
        if self.phase is None:
            self.send(signal.SIGTERM)
            self.phase, self.next_at = self.TERMINATED, now + self.grace
        elif now >= self.next_at and self.phase == self.TERMINATED:
            self.send(signal.SIGKILL)
            self.phase, self.next_at = self.KILLED, now + 1.0
        elif now >= self.next_at and self.phase == self.KILLED:
            self.phase = self.ABANDONED
        return self.phase

    def timeout(self, poll):
        """How long select may sleep: until the next phase, and briefly when exits are polled."""
        timeout = 0.1 if poll else None
        if self.next_at is not None:
            remaining = max(0.0, self.next_at - time.monotonic())
            timeout = remaining if timeout is None else min(timeout, remaining)
        return timeout


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


def _shell():
    for directory in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        candidate = os.path.join(directory, "bash")
        if os.access(candidate, os.X_OK):
            return candidate
    return "/bin/sh"


def _pidfd(pid):
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python < 3.9 or Linux < 5.3: poll instead
        return None


def _exited(pid):
    """(code, signal name) once the child has exited, without reaping it; None while it runs."""
    result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if result is None or result.si_pid == 0:
        return None
    if result.si_code == os.CLD_EXITED:
        return result.si_status, None
    return 128 + result.si_status, SIGNAL_NAMES.get(result.si_status, "signal %d" % result.si_status)


def _processes_with_env(marker):
    """Pids of this user's processes whose environment holds every key=value of marker."""
    wanted = {("%s=%s" % item).encode() for item in marker.items()}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                environ = set(handle.read().split(b"\0"))
        except OSError:
            continue
        if wanted <= environ:
            found.append(int(entry))
    return found


def tpu_holders(probe):
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


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _try_write_all(fd, data):
    try:
        _write_all(fd, data)
        return True
    except OSError:
        return False


if __name__ == "__main__":
    main()
