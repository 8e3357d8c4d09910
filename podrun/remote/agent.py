"""podrun's worker-side agent: runs one step of a job on this worker and stays with it to the end.

It is sent over the channel's stdin for every step (see transport.agent_command), never installed,
so it uses the standard library only and runs on the worker's own python3 (3.8 or newer). It starts
on every worker for every step, so it imports only built-in modules: json, subprocess, shutil and
selectors would double its start-up (they pull in re, collections and more), and even `signal`
costs 4.5 ms of a 7 ms Python start (it builds enums), so the agent uses its C core, `_signal`.

Protocol
  stdin   the step: a decimal byte count, a newline, then that many bytes of marshal format 4 (readable
          by every Python 3.4+) holding {job_id, job_dir (where its files go, relative to the root: one
          per attempt of a restarted job), worker, step, cwd (the run directory), code_dir (the
          code version checked out into cwd before the step starts: checkout.py), command, env,
          grace, heartbeat, detach, job_files (name: text, written into the job's directory first: the
          workers' IPs, and for run under torchrun rank_output.py), file_env (variable: the name of a
          job file, set to its path)}, for run {container, term ("leader" or "group")}, for a job's
          first step "probe", for a watched run "watch", for a run on a TPU VM "vm_notices" (true: the
          VM's own notice of its preemption stops the job at once, vm_notice.py); then control lines: "stop" asks for a
          graceful stop; any line is a heartbeat. End of input, or no line for `heartbeat` seconds (a
          link that died silently), means the launcher is gone: the job stops too.
  probe   (reported first: {"event": "hello"}, before any of its checks, which may wait for a lock)
          {code_dir, and on a TPU VM accelerator_files (glob patterns, colon-separated), kill_stale,
          stale_grace, and on several hosts route_to (MASTER_ADDR)}: before starting anything the
          agent reports {"event": "probe", "code": 1 if code_dir is here as shipped else 0
          (checkout.verify), "changed" (newline-separated) and "changed_count": the first few and the count
          of the files a job changed in this worker's copy (removed: it is shipped again), "holders": "pid TAB
          file TAB command" lines of the processes that hold the TPU (killed first with kill_stale),
          and with route_to hostname, resolves_to, interface, interface_set (interfaces.py: the
          variables it set in the step's env)}, then waits for the line "go" (the launcher
          ships the code and checks every worker meanwhile); "stop" or end of input instead: it exits.
          So one channel per worker does what would otherwise take three.
  watch   {token, worker, hub_worker, workers, bind, stall, alive_every}: a detached run (on several
          workers, or with a stall limit), whose agents stop each other's steps when one fails, with no
          launcher left (Hub, HubLink). The hub_worker's agent listens on `bind` (its internal
          address) and reports {"event": "hub", "port": P} first; every agent waits for
          "go HOST:PORT" (the hub's address) before it starts.
          With stall (seconds), the hub also stops the job when no worker printed anything for that
          long: each agent first saves its job's stacks as run.stacks (stacks.py).
  stdout  the command's output, stdout and stderr merged, byte for byte.
  stderr  JSON event lines: {"event": "started", "pid": P}, {"event": "exited", "code": C,
          "signal": NAME or null, "rank": R or null (torchrun: the rank whose code C is), "killed": true
          when a stop's SIGKILL ended it after the grace period},
          {"event": "error", "message": M}, {"event": "notice", "reason": R} (the VM announced it goes away).
Files, under job_dir, ~/.podrun/jobs/<job_id>[.attempt-K]/ (mode 0700), so that output survives the launcher:
  output.log (every byte of every step), <step>.pid (the step's process group and session), <step>.agent (the
  agent's pid and kernel start time, "PID START": SIGTERM to it stops the step cleanly), <step>.py-spy (the
  py-spy on the step's PATH as it started, or nothing: what its stacks are dumped with), <step>.container
  (a docker: job's container name, whose processes its stacks include), <step>.exit
  (JSON: code, signal, stop_reason, ended_at, rank, cause_worker/cause_code when another worker's failure stopped this one,
  stalled: how long this worker had been silent when a stall stopped it, and killed: whether SIGKILL
  ended it after the grace period), run.stacks (on a stall); each file 0600.
With "detach": true the agent reports {"event": "detached", "pid": P} and carries on in a session
of its own, without stdin or stdout, until the step ends or it receives SIGTERM.

Stopping sends SIGTERM, once per process, to the step's process group (to its leader alone with
"term": "leader": torchrun passes it on to its ranks) and to every other process that still
carries this job's PODRUN_JOB_ID and PODRUN_WORKER in its environment and is this user's (which catches
children that left the group with setsid), then SIGKILL after the grace period. A container is stopped by name
(docker stop -t GRACE, then docker kill), and the step ends only once it is gone. The same sweep
runs after a normal exit, so nothing the step started outlives it.
"""

import os
import select
import sys
import time

try:  # on a worker, each was sent ahead of this file (transport/base.py, script_modules)
    framing, checkout, interfaces, stacks, vm_notice = (
        sys.modules["podrun_remote_" + name] for name in ("framing", "checkout", "interfaces", "stacks", "vm_notice"))
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import checkout, framing, interfaces, stacks, vm_notice
try:  # hmac.compare_digest, without the 6.7 ms of imports (_hashlib) that hmac brings
    from _operator import _compare_digest as same_secret
except ImportError:  # not CPython
    from hmac import compare_digest as same_secret  # type: ignore[no-redef]
try:
    import _signal as signal  # what `signal` wraps in enums: the same functions and constants
except ImportError:  # not CPython
    import signal

SPAWN_FAILED = 127
CHANGED_NAMED = 3  # of the code files a job changed, those the probe names
LOST = 255  # the code of a worker whose agent is gone (as podrun.exits.LOST)
# signal numbers by name, without the aliases Linux also defines for SIGCHLD, SIGABRT and SIGIO
SIGNAL_NAMES = {getattr(signal, name): name for name in dir(signal)
                if name.startswith("SIG") and "_" not in name and name not in ("SIGCLD", "SIGIOT", "SIGPOLL")}
JSON_ESCAPES = {**{code: "\\u%04x" % code for code in range(32)}, ord('"'): '\\"', ord("\\"): "\\\\"}


def main():
    control = ControlInput()
    config = framing.read_message(control)
    job_dir = os.path.abspath(config["job_dir"])  # .podrun/jobs/<job_id>, one per attempt (paths.remote_job_dir)
    jobs_dir = os.path.abspath(os.path.join(".podrun", "jobs"))
    # each private, not just the last; in a shared home, .podrun/jobs/<job_id>/w<i>: the job's own directory first
    job_parent = [] if os.path.dirname(job_dir) == jobs_dir else [os.path.dirname(job_dir)]
    for directory in [".podrun", jobs_dir] + job_parent + [job_dir]:
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    step = Step(config, job_dir)
    watch = prepare(config, control, step)
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
    code, signal_name = step.supervise(control, watch)
    emit(event="exited", code=code, signal=signal_name, rank=step.rank, killed=step.killed)
    if watch is not None:
        watch.step_ended(code)
        watch.serve(step)
    # everything went out through os.write: skipping the interpreter's teardown saves ~1 ms of CPU
    # on every worker for every step
    os._exit(code)


def prepare(config, control, step):
    """Everything before the step starts: the probe and the launcher's "go", the checkout into the
    run directory, and a watched job's line between agents (returns its Hub or HubLink, else None)."""
    watch_config = config.get("watch")
    hub = None
    if watch_config and watch_config["worker"] == watch_config["hub_worker"]:
        try:
            hub = Hub(watch_config)
        except OSError as error:  # the internal address is not one of this host's own (NAT)
            emit(event="error", message="cannot listen on %s, this worker's internal address, for the other "
                 "workers' agents to watch the job: %s" % (watch_config["bind"], error.strerror or error))
            os._exit(SPAWN_FAILED)
    if hub is not None:
        emit(event="hub", port=hub.port)
    probe = config.get("probe")
    if probe is not None:
        emit(event="hello")  # the launcher's first contact: the worker's login let a command through
        holders = tpu_holders(probe) if probe.get("accelerator_files") else []
        network = interfaces.check(probe["route_to"], config["env"]) if probe.get("route_to") else {}
        try:
            present, changed = checkout.verify(probe["code_dir"]) if probe["code_dir"] else (False, [])
        except checkout.CheckoutError as error:
            emit(event="error", message=str(error))
            os._exit(1)
        emit(event="probe", code=int(present), changed="\n".join(changed[:CHANGED_NAMED]), changed_count=len(changed),
             holders="\n".join("%d\t%s\t%s" % holder for holder in holders), **network)
    hub_address = ""
    if probe is not None or watch_config:
        hub_address = control.wait_for_go(step.heartbeat)
        if hub_address is None:
            os._exit(0)  # the launcher decided not to start the job, or is gone
    if config.get("code_dir"):  # the code is in place now: the job runs in its run directory
        try:
            checkout.check_out(config["code_dir"], config["cwd"], config["job_id"])
        except checkout.CheckoutError as error:
            emit(event="error", message=str(error))
            os._exit(1)
    if not watch_config or hub is not None:
        return hub
    try:
        return HubLink(hub_address, watch_config)
    except (OSError, ValueError) as error:  # ValueError: no address (that agent ended first)
        emit(event="error", message="cannot reach worker %d's agent at %s to watch the job: %s"
             % (watch_config["hub_worker"], hub_address, error))
        os._exit(SPAWN_FAILED)


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
        # a file name that is not UTF-8 (os.fsdecode's surrogates) goes out as its own bytes
        os.write(2, (to_json(event) + "\n").encode(errors="surrogateescape"))
    except OSError:
        pass  # the launcher is gone; the files in the job directory tell the story


def to_json(flat):
    """A flat dict of str, int, float, bool and None as JSON."""
    def value(item):
        if item is None:
            return "null"
        if isinstance(item, bool):
            return "true" if item else "false"
        if isinstance(item, str):
            return '"%s"' % item.translate(JSON_ESCAPES)
        if isinstance(item, float):
            return repr(item)
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

    def wait_for_go(self, timeout):
        """What follows "go" on its line (worker 0's watch address, or nothing), once it arrives;
        None on "stop", the end of input, or `timeout` seconds without any line. Lines behind it
        stay buffered."""
        while True:
            while b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                command, _, argument = line.strip().decode(errors="replace").partition(" ")
                if command in ("go", "stop"):
                    return argument if command == "go" else None
            if not select.select([0], [], [], timeout)[0]:
                emit(event="error", message="no word from the launcher for %gs while waiting to start" % timeout)
                return None
            chunk = os.read(0, 4096)
            if not chunk:
                return None
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
        self.grace = float(config.get("grace", 30))
        self.heartbeat = float(config.get("heartbeat", 20))
        self.container = config.get("container")  # the run's docker container, stopped by name
        self.pid = None
        self.status = None  # (code, signal name) once the step's process has exited
        self.stop_reason = None
        self.cause = None  # (worker, code) of the worker whose failure stopped this one (a watched job)
        self.stalled = None  # seconds this worker had been silent when the job stalled (a watched job)
        self.rank = None  # under torchrun: the rank that failed first, whose exit code the step's is
        self.killed = False  # a stop's SIGKILL ended it, after the grace period
        self.helpers = []  # docker commands started to stop the container: reaped at the end
        self.py_spy = ""  # the py-spy on the job's PATH as the step started (stacks.py), or ""

    def start(self):
        env = dict(os.environ)
        env.update(self.config["env"])
        env["PODRUN_JOB_DIR"] = self.job_dir
        for name, text in self.config.get("job_files", {}).items():  # the workers' IPs; rank_output.py for torchrun
            self._write_file(name, text)
        for key, name in self.config.get("file_env", {}).items():
            env[key] = os.path.join(self.job_dir, name)
        # the py-spy for the step's stacks, fixed now: a process's own PATH later may be anyone's choosing
        self.py_spy = stacks.find_py_spy(env.get("PATH", ""), self.config["cwd"])
        self._write_file(self.config["step"] + ".py-spy", self.py_spy)
        if self.container:  # its processes are the daemon's children, not ours: stacks.py finds them by its name
            self._write_file(self.config["step"] + ".container", self.container)
        read_end, write_end = os.pipe()
        try:
            self.pid = spawn([_shell(), "-c", self.config["command"]], self.config["cwd"], env, write_end)
        finally:
            os.close(write_end)
        self.output = read_end
        self.log = os.open(os.path.join(self.job_dir, "output.log"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._write_file(self.config["step"] + ".pid", str(self.pid))
        start = stacks.start_of(os.getpid())  # with the pid, who the agent is: `podrun stop` checks it
        self._write_file(self.config["step"] + ".agent", "%d %s" % (os.getpid(), start) if start else str(os.getpid()))

    def supervise(self, control, watch):
        """Pump output until the step and everything it started are gone; returns (code, signal name)."""
        poller = Poller()
        poller.register(self.output, "output")
        attached = control is not None
        if attached:
            poller.register(0, "control")
        self.wakeup = wakeup = self._watch_signals()
        poller.register(wakeup, "signal")
        if watch is not None:
            watch.attach(poller, self.stop_for_failure, self.stop_for_stall)
        notices = vm_notice.Notices(self.config["env"]) if self.config.get("vm_notices") else None
        if notices is not None:
            notices.attach(poller)
        exit_watch = _pidfd(self.pid)
        if exit_watch is not None:
            poller.register(exit_watch, "exit")
        stdout_open, output_open = attached, True
        # docker stop sends the container its own KILL after the grace period: ours comes just after
        ending = Ending(self.grace + (2 if self.container else 0), self._signal_job)
        heard_at = time.monotonic()
        if attached and "stop" in control.buffered_commands():
            self.request_stop("stop requested")
        while output_open or self.status is None:
            timeout = ending.timeout(poll=exit_watch is None)
            if attached and not self.stop_reason:
                until_silence = max(0.0, heard_at + self.heartbeat - time.monotonic())
                timeout = until_silence if timeout is None else min(timeout, until_silence)
            watching_stall = not self.stop_reason
            until_due = watch.until_due(watching_stall) if watch is not None else None
            if until_due is not None:
                timeout = until_due if timeout is None else min(timeout, until_due)
            for ready, fd in poller.poll(timeout):
                if ready == "output":
                    data = os.read(self.output, 65536)
                    if not data:
                        output_open = False
                        poller.unregister(self.output)
                        continue
                    _write_all(self.log, data)
                    if watch is not None:
                        watch.heard()
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
                elif ready == "watch":
                    watch.ready(fd)
                elif ready == "notice":
                    reason = notices.ready(fd)
                    if reason and not self.stop_reason:
                        emit(event="notice", reason=reason)
                        self.request_stop(reason)
            if attached and time.monotonic() - heard_at > self.heartbeat:
                self.request_stop("no word from the launcher for %gs" % self.heartbeat)
            if watch is not None:
                watch.tick(watching_stall)
            if self.status is None:
                self.status = _exited(self.pid)
                # it ended only once the grace period was over and SIGKILL sent: not a failure of its own
                self.killed = self.status is not None and self.status[0] != 0 and ending.phase == Ending.KILLED
            # once the step exits, whatever it left behind goes too
            if self.stop_reason or self.status is not None:
                if ending.advance() == Ending.ABANDONED:
                    break  # a process we cannot kill holds the output pipe; stop waiting for it
        if self.container:
            self._until_container_gone(time.monotonic() + self.grace + 5)
        os.waitpid(self.pid, 0)  # reap only now: until here the pid, and so the group id, stayed ours
        for helper in self.helpers:
            os.waitpid(helper, 0)
        code, signal_name = self.status
        if code and self.config.get("term") == "leader" and not self.stop_reason:
            # torchrun exits 1 whatever its rank did: the rank's own code is the step's
            self.rank, code = torchrun_root_cause(_tail(os.path.join(self.job_dir, "output.log"))) or (None, code)
        cause_worker, cause_code = self.cause or (None, None)
        self._write_file(self.config["step"] + ".exit", to_json({
            "code": code, "signal": signal_name, "stop_reason": self.stop_reason, "ended_at": time.time(),
            "cause_worker": cause_worker, "cause_code": cause_code, "rank": self.rank, "stalled": self.stalled,
            "killed": self.killed}))
        return code, signal_name

    def stop_for_failure(self, worker, code):
        """Another worker of a watched job failed (or its agent is gone): stop this one too."""
        if self.stop_reason is None:
            self.cause = (worker, code)
            self.request_stop("worker %d failed with code %d" % (worker, code))

    def stop_for_stall(self, silent_s):
        """No worker of a watched job printed anything for its stall limit: save this worker's stacks
        (before anything is stopped), then stop."""
        if self.stop_reason is None and self.status is None:
            self._write_file("run.stacks", stacks.text(os.getpid(), self.pid, self.py_spy or None, self.container))
            self.stalled = silent_s
            self.request_stop("stalled: silent for %.1fs" % silent_s)

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
        """Each process of the job gets the signal once: SIGTERM lets it save its state, so a second
        one (a checkpoint handler started twice) must not follow. A container is stopped by name;
        its docker client would otherwise pass our SIGTERM on to the container a second time. With
        the config's "term": "leader" (torchrun), only the leader and what is not its descendant get
        SIGTERM while it runs: torchrun stops its ranks itself (each in a session of its own), and a
        SIGTERM from us too would reach each of them twice."""
        running = self.status is None
        if signum == signal.SIGTERM and running and self.container:
            self._docker("stop", "-t", str(int(self.grace + 0.999)), self.container)
            return
        if signum == signal.SIGKILL and self.container:
            self._docker("kill", self.container)
        leader_only = signum == signal.SIGTERM and running and self.config.get("term") == "leader"
        try:
            if leader_only:
                os.kill(self.pid, signum)
            else:
                os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in stacks.marked(self.config["job_id"], self.config["worker"]):
            if _group_of(pid) == self.pid or (leader_only and _descends_from(pid, self.pid)):
                continue  # signalled above, or the leader's to stop
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _docker(self, *args):
        docker = _which("docker")
        if docker is None:
            return None
        with open(os.devnull, "wb") as null:
            pid = spawn([docker] + list(args), ".", dict(os.environ), null.fileno())
        self.helpers.append(pid)
        return pid

    def _until_container_gone(self, deadline):
        """Wait until the container is gone, so "stopped" means stopped (docker run --rm removes it
        once it ends; a client killed before then leaves that to the daemon)."""
        while time.monotonic() < deadline:
            inspect = self._docker("container", "inspect", self.container)
            if inspect is None:
                return
            self.helpers.remove(inspect)
            _, status = os.waitpid(inspect, 0)
            if status != 0:
                return  # no such container
            time.sleep(0.1)

    def _write_file(self, name, text):
        path = os.path.join(self.job_dir, name)
        with open(os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
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
        """(name, descriptor) of those ready to read (or closed); timeout in seconds, None: no limit."""
        events = self.poll_object.poll(None if timeout is None else timeout * 1000)
        return [(self.names[fd], fd) for fd, _ in events]


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


class Hub:
    """Worker 0's side of a watched job (a detached run on several workers, where no launcher
    stays to fail fast): every other worker's agent connects here, says hello with the job's token
    and, when its step ends, its exit code. The first failure (a non-zero code, or a connection
    that breaks before its code arrived: an agent killed, a host gone) is sent to every agent as
    "stop WORKER CODE", and this worker stops too. Worker 0 stays until every other agent is done.

    Anyone who reaches worker 0's internal address may connect: a connection that has not said
    hello with the token within HELLO_WITHIN_S, or sends a longer line than Link.LONGEST_LINE, is
    dropped; beyond STRANGERS_KEPT such connections (and one per agent still to come) the oldest
    goes; an accept() that fails (out of descriptors) halves that number for good and pauses
    accepting for ACCEPT_PAUSE_S. So
    strangers cost a bounded number of descriptors, never the agent, and never keep it waiting."""

    HELLO_WAIT_S = 30  # how long a finished worker 0 waits for agents that never said hello
    HELLO_WITHIN_S = 5  # an agent says hello as soon as it connected
    STRANGERS_KEPT = 16
    ACCEPT_PAUSE_S = 1.0

    def __init__(self, config):
        import socket  # only watched jobs pay for it (it imports enum)

        self.token = config["token"].encode()
        self.worker = config["worker"]
        self.workers = config["workers"]
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # the internal address only: the watch is for the workers' network, not every interface
        self.listener.bind((config["bind"], 0))
        self.listener.listen(self.workers)
        self.port = self.listener.getsockname()[1]
        self.links = {}  # descriptor: Link of an agent that said hello
        self.strangers = {}  # descriptor: Link of a connection that has not yet, oldest first
        self.accepting_at = None  # when accepting resumes, after accept() failed
        self.strangers_kept = self.workers + self.STRANGERS_KEPT  # fewer once descriptors ran out
        self.ended = set()  # workers whose step ended (their code arrived)
        self.failure = None
        self.poller = None
        self.on_failure = None
        self.on_stall = None
        self.hello_deadline = None
        self.stall = config.get("stall")  # seconds without output from any worker that stop the job
        self.stalled = False
        self.started_at = None  # when the step started: the stall clock's start
        self.heard_at = {}  # each worker's last output (time.monotonic()), as far as the hub knows

    def attach(self, poller, on_failure, on_stall):
        self.poller, self.on_failure, self.on_stall = poller, on_failure, on_stall
        if self.started_at is None:
            self.started_at = self.heard_at[self.worker] = time.monotonic()
        if self.accepting_at is None:
            poller.register(self.listener.fileno(), "watch")
        for fd in (*self.links, *self.strangers):
            poller.register(fd, "watch")

    def ready(self, fd):
        if fd == self.listener.fileno():
            self._accept()
            return
        link = self.links.get(fd) or self.strangers.get(fd)
        if link is None:
            return  # dropped earlier in the same round of events
        lines = link.read_lines()
        for words in (line.split() for line in lines or ()):
            if link.worker is None:
                if len(words) != 3 or words[0] != "hello" or not words[2].isdigit() \
                        or not same_secret(words[1].encode(), self.token):
                    lines = None  # not one of the job's agents: hang up
                    break
                link.worker = int(words[2])
                self.links[fd] = self.strangers.pop(fd)
                self.heard_at.setdefault(link.worker, self.started_at)
            elif words == ["alive"]:
                self.heard_at[link.worker] = time.monotonic()
            elif len(words) == 2 and words[0] == "exit":
                self.ended.add(link.worker)
                if int(words[1]) != 0:
                    self.fail(link.worker, int(words[1]))
        if lines is None:
            self._hang_up(fd)

    def _accept(self):
        try:
            connection, _ = self.listener.accept()
            _keep_alive(connection)
        except OSError:  # out of descriptors (EMFILE, ENFILE), or the connection already reset
            # keep half as many strangers from now on: the job's own files must still open
            self.strangers_kept = max(1, len(self.strangers) // 2)
            while len(self.strangers) > self.strangers_kept:
                self._hang_up(next(iter(self.strangers)))
            self.poller.unregister(self.listener.fileno())
            self.accepting_at = time.monotonic() + self.ACCEPT_PAUSE_S
            return
        self.strangers[connection.fileno()] = Link(connection)
        self.poller.register(connection.fileno(), "watch")
        if len(self.strangers) > min(self.strangers_kept, self.STRANGERS_KEPT + self.workers - 1 - len(self.links)):
            self._hang_up(next(iter(self.strangers)))

    def _hang_up(self, fd):
        link = self.links.pop(fd, None) or self.strangers.pop(fd)
        self.poller.unregister(fd)
        link.connection.close()
        if link.worker is not None and link.worker not in self.ended:
            self.fail(link.worker, LOST)

    def fail(self, worker, code):
        if self.failure is not None or self.stalled:
            return
        self.failure = (worker, code)
        for link in self.links.values():
            link.send("stop %d %d\n" % (worker, code))
        if worker != self.worker:
            self.on_failure(worker, code)

    def heard(self):
        self.heard_at[self.worker] = time.monotonic()

    def until_due(self, stall):
        """Seconds until tick() has something to do (None: nothing to wait for): a stranger's hello
        overdue, accepting again, and with `stall` the job's stall."""
        dues = []
        if self.strangers:
            dues.append(next(iter(self.strangers.values())).since + self.HELLO_WITHIN_S - time.monotonic())
        if self.accepting_at is not None:
            dues.append(self.accepting_at - time.monotonic())
        until_stall = self.until_stall() if stall else None
        if until_stall is not None:
            dues.append(until_stall)
        return max(0.0, min(dues)) if dues else None

    def tick(self, stall):
        now = time.monotonic()
        while self.strangers and next(iter(self.strangers.values())).since + self.HELLO_WITHIN_S <= now:
            self._hang_up(next(iter(self.strangers)))
        if self.accepting_at is not None and self.accepting_at <= now:
            self.accepting_at = None
            self.poller.register(self.listener.fileno(), "watch")
        if stall:
            self.check_stall()

    def until_stall(self):
        """Seconds until the job counts as stalled (None: it is not watched for one, or already did)."""
        if not self.stall or self.stalled or self.failure is not None:
            return None
        return max(0.0, max(self.heard_at.values()) + self.stall - time.monotonic())

    def check_stall(self):
        """Once no worker printed anything for `stall`: every agent saves its stacks and stops."""
        if self.until_stall() != 0.0:
            return
        self.stalled = True
        now = time.monotonic()
        for link in self.links.values():
            link.send("stall %.3f\n" % (now - self.heard_at[link.worker]))
        self.on_stall(now - self.heard_at[self.worker])

    def step_ended(self, code):
        self.ended.add(self.worker)
        self.hello_deadline = time.monotonic() + self.HELLO_WAIT_S
        if code != 0:
            self.fail(self.worker, code)

    def serve(self, step):
        """Stay, after worker 0's own step, until every other agent is done (or podrun stop says so)."""
        self.attach(Poller(), lambda worker, code: None, lambda silent_s: None)
        self.poller.register(step.wakeup, "signal")
        while not step.stop_reason and self._waiting():
            timeout = None if self.links else max(0.0, self.hello_deadline - time.monotonic())
            until_due = self.until_due(stall=True)  # the other workers may still hang
            if until_due is not None:
                timeout = until_due if timeout is None else min(timeout, until_due)
            for ready, fd in self.poller.poll(timeout):
                if ready == "signal":
                    os.read(fd, 512)
                else:
                    self.ready(fd)
            self.tick(stall=True)

    def _waiting(self):
        """Whether an agent is still connected, or may yet connect (a stranger's connection is no reason)."""
        return bool(self.links) or (len(self.ended) < self.workers and time.monotonic() < self.hello_deadline)


class HubLink:
    """Any other worker's side of a watched job: its line to worker 0's agent (see Hub)."""

    def __init__(self, address, config):
        import socket

        host, _, port = address.rpartition(":")
        self.connection = socket.create_connection((host, int(port)), timeout=10)
        self.connection.settimeout(None)
        _keep_alive(self.connection)
        self.link = Link(self.connection)
        self.link.send("hello %s %d\n" % (config["token"], config["worker"]))
        self.hub_worker = config["hub_worker"]
        self.on_failure = None
        self.on_stall = None
        # output is told to the hub as "alive", at most this often: never a message per line
        self.alive_every = config.get("alive_every") if config.get("stall") else None
        self.alive_due = 0.0

    def attach(self, poller, on_failure, on_stall):
        self.poller, self.on_failure, self.on_stall = poller, on_failure, on_stall
        poller.register(self.connection.fileno(), "watch")

    def heard(self):
        if self.alive_every is not None and time.monotonic() >= self.alive_due:
            self.link.send("alive\n")
            self.alive_due = time.monotonic() + self.alive_every

    def until_due(self, stall):
        return None  # the hub watches for a stall

    def tick(self, stall):
        pass

    def ready(self, fd):
        lines = self.link.read_lines()
        for words in (line.split() for line in lines or ()):
            if len(words) == 3 and words[0] == "stop":
                self.on_failure(int(words[1]), int(words[2]))
            elif len(words) == 2 and words[0] == "stall":
                self.on_stall(float(words[1]))
        if lines is None:
            self.poller.unregister(fd)
            self.on_failure(self.hub_worker, LOST)  # its agent, or its host, is gone

    def step_ended(self, code):
        self.link.send("exit %d\n" % code)
        self.connection.close()

    def serve(self, step):
        pass


class Link:
    """One connection between agents of a watched job, in lines."""

    LONGEST_LINE = 1024  # agents send short lines ("hello TOKEN WORKER", "exit CODE"): more is no agent

    def __init__(self, connection):
        self.connection = connection
        self.worker = None
        self.since = time.monotonic()
        self.pending = b""

    def read_lines(self):
        """The complete lines that arrived, or None once the connection is closed or broken, or sent
        a line longer than LONGEST_LINE (so what is kept stays short, and splitting it stays linear)."""
        try:
            data = self.connection.recv(4096)
        except OSError:
            data = b""
        if not data:
            return None
        *lines, self.pending = (self.pending + data).split(b"\n")
        if len(self.pending) > self.LONGEST_LINE or any(len(line) > self.LONGEST_LINE for line in lines):
            return None
        return [line.decode(errors="replace") for line in lines]

    def send(self, text):
        try:
            self.connection.sendall(text.encode())
        except OSError:
            pass  # it is gone: reading says so


def _keep_alive(connection):
    """Notice a host that vanished without closing the connection within about 20 s."""
    import socket

    connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            connection.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


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
    return _which("bash") or "/bin/sh"


def _which(program):
    for directory in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        candidate = os.path.join(directory, program)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def torchrun_root_cause(text):
    """(rank, exit code) of the rank that torchrun's failure summary names first ("Root Cause (first
    observed failure):", then "  rank      : 3 (local_rank: 1)" and "  exitcode  : 3 (pid: 1234)");
    a rank killed by a signal (exitcode -15) gets 128 + its number, as a shell reports it. None if
    the text holds no summary."""
    start = text.rfind(b"Root Cause (first observed failure):")
    if start < 0:
        return None
    fields = {}
    for line in text[start:].splitlines()[1:]:
        name, _, value = line.partition(b":")
        if name.strip() in (b"rank", b"exitcode") and name.strip() not in fields:
            try:
                fields[name.strip()] = int(value.split()[0])
            except (ValueError, IndexError):
                pass
    if len(fields) < 2:
        return None
    code = fields[b"exitcode"]
    return fields[b"rank"], code if code >= 0 else 128 - code


def _tail(path, size=65536):
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - size))
            return handle.read()
    except OSError:
        return b""


def _descends_from(pid, ancestor):
    while pid > 1:
        try:
            with open("/proc/%d/stat" % pid) as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])  # the parent's pid, after the name
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
    return False


def _group_of(pid):
    try:
        return os.getpgid(pid)
    except OSError:
        return None


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
