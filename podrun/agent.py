"""podrun's worker-side agent: runs one step of a job on this worker and stays with it to the end.

It is sent over the channel's stdin for every step (see transport.agent_command), never installed,
so it uses the standard library only and runs on the worker's own python3 (3.8 or newer).

Protocol
  stdin   one JSON line: {job_id, worker, step, cwd, command, env, grace, heartbeat, detach}; then control
          lines: "stop" asks for a graceful stop; any line is a heartbeat. End of input, or no line
          for `heartbeat` seconds (a link that died silently), means the launcher is gone: the job
          stops too.
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

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time

SPAWN_FAILED = 127


def main():
    control = ControlInput()
    config = json.loads(control.read_line())
    job_dir = os.path.abspath(os.path.join(".podrun", "jobs", config["job_id"]))
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    step = Step(config, job_dir)
    report = detach() if config.get("detach") else None
    try:
        step.start()
    except OSError as error:
        emit(event="error", message="cannot start %r in %s: %s" % (config["command"], config["cwd"], error))
        sys.exit(SPAWN_FAILED)
    emit(event="started", pid=step.child.pid)
    if report is not None:
        os.write(report, b"started")
        os.dup2(os.open(os.devnull, os.O_RDWR), 2)  # closes the last copy of the report pipe
        os.close(report)
        control = None
    code, signal_name = step.supervise(control)
    emit(event="exited", code=code, signal=signal_name)
    sys.exit(code)


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
        os.write(2, (json.dumps(event) + "\n").encode())
    except OSError:
        pass  # the launcher is gone; the files in the job directory tell the story


class ControlInput:
    """Unbuffered lines from fd 0, so it can be watched with select next to the output pipe."""

    def __init__(self):
        self.pending = b""

    def read_line(self):
        while b"\n" not in self.pending:
            chunk = os.read(0, 65536)
            if not chunk:
                raise SystemExit("podrun agent: no step description on stdin")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line

    def read_commands(self):
        """The complete lines available now, or None at end of input."""
        chunk = os.read(0, 4096)
        if not chunk:
            return None
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        return [line.strip().decode(errors="replace") for line in lines]


class Step:
    def __init__(self, config, job_dir):
        self.config = config
        self.job_dir = job_dir
        self.grace = float(config.get("grace", 5))
        self.heartbeat = float(config.get("heartbeat", 20))
        self.child = None
        self.stop_reason = None

    def start(self):
        env = dict(os.environ)
        env.update(self.config["env"])
        shell = shutil.which("bash") or "/bin/sh"
        read_end, write_end = os.pipe()
        try:
            self.child = subprocess.Popen(
                [shell, "-c", self.config["command"]], cwd=self.config["cwd"], env=env,
                stdin=subprocess.DEVNULL, stdout=write_end, stderr=write_end,
                start_new_session=True)  # its own process group: killpg reaches the whole tree
        finally:
            os.close(write_end)
        self.output = read_end
        self.log = os.open(os.path.join(self.job_dir, "output.log"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._write_file(self.config["step"] + ".pid", str(self.child.pid))
        self._write_file(self.config["step"] + ".agent", str(os.getpid()))

    def supervise(self, control):
        """Pump output until the step and everything it started are gone; returns (code, signal name)."""
        selector = selectors.DefaultSelector()
        selector.register(self.output, selectors.EVENT_READ, "output")
        attached = control is not None
        if attached:
            selector.register(0, selectors.EVENT_READ, "control")
        wakeup = self._watch_signals()
        selector.register(wakeup, selectors.EVENT_READ, "signal")
        exit_watch = _pidfd(self.child.pid)
        if exit_watch is not None:
            selector.register(exit_watch, selectors.EVENT_READ, "exit")
        stdout_open, output_open = attached, True
        status = None
        ending = Ending(self.grace, self._signal_job)
        heard_at = time.monotonic()
        while output_open or status is None:
            timeout = ending.timeout(poll=exit_watch is None)
            if attached and not self.stop_reason:
                until_silence = max(0.0, heard_at + self.heartbeat - time.monotonic())
                timeout = until_silence if timeout is None else min(timeout, until_silence)
            for key, _ in selector.select(timeout):
                if key.data == "output":
                    data = os.read(self.output, 65536)
                    if not data:
                        output_open = False
                        selector.unregister(self.output)
                        continue
                    _write_all(self.log, data)
                    if stdout_open and not _try_write_all(1, data):
                        stdout_open = False
                        self.request_stop("the launcher stopped reading")
                elif key.data == "control":
                    heard_at = time.monotonic()
                    commands = control.read_commands()
                    if commands is None:
                        selector.unregister(0)
                        self.request_stop("the launcher is gone")
                    elif "stop" in commands:
                        self.request_stop("stop requested")
                elif key.data == "signal":
                    os.read(wakeup, 512)
                elif key.data == "exit":
                    selector.unregister(exit_watch)
            if attached and time.monotonic() - heard_at > self.heartbeat:
                self.request_stop("no word from the launcher for %gs" % self.heartbeat)
            if status is None:
                status = _exited(self.child.pid)
            # once the step exits, whatever it left behind goes too
            if self.stop_reason or status is not None:
                if ending.advance() == Ending.ABANDONED:
                    break  # a process we cannot kill holds the output pipe; stop waiting for it
        self.child.wait()  # reap only now: until here the pid, and so the group id, stayed ours
        code, signal_name = status
        self._write_file(self.config["step"] + ".exit",
                         json.dumps({"code": code, "signal": signal_name, "stop_reason": self.stop_reason}))
        return code, signal_name

    def request_stop(self, reason):
        if self.stop_reason is None:
            self.stop_reason = reason

    def _watch_signals(self):
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda signum, frame: self.request_stop(signal.Signals(signum).name))
        return wake_read

    def _signal_job(self, signum):
        try:
            os.killpg(self.child.pid, signum)
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
    try:
        name = signal.Signals(result.si_status).name
    except ValueError:
        name = "signal %d" % result.si_status
    return 128 + result.si_status, name


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


main()
