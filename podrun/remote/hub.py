"""The line between the agents of a watched job (agent.py's "watch"): worker 0's Hub, which every
other worker's agent reaches through its HubLink, so that a failure or a stall stops them all with no
launcher left. Standard library only, Python 3.8+, nothing done at import (only watched jobs import
socket).
"""

import os
import sys
import time

try:  # on a worker, sent ahead of this file (transport/base.py, script_modules)
    agent_io, self_delete, step_reader = (sys.modules["podrun_remote_" + name]
                                          for name in ("agent_io", "self_delete", "step_reader"))
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import agent_io, self_delete, step_reader
try:  # hmac.compare_digest, without the 6.7 ms of imports (_hashlib) that hmac brings
    from _operator import _compare_digest as same_secret
except ImportError:  # not CPython
    from hmac import compare_digest as same_secret  # type: ignore[no-redef]

LOST = 255  # the code of a worker whose agent is gone (as podrun.exits.LOST)
BEAT_FILE = "supervisor.beat"  # touched by a supervisor host's follower while it follows the job


class Hub:
    """Worker 0's side of a watched job (a detached run on several workers, where no launcher
    stays to fail fast): every other worker's agent connects here, says hello with the job's token
    and, when its step ends, its exit code (and a word when it did not end by itself: agent.end_word).
    The first failure (a non-zero code, or a connection that breaks before its code arrived: an agent
    killed, a host gone) is sent to every agent as "stop WORKER CODE", and this worker stops too.
    Worker 0 stays until every other agent is done: then it knows the job's end (agent.job_end).

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

    def __init__(self, config, job_dir):
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
        self.words = {}  # worker: how its step ended when not by itself (agent.end_word), as it said
        self.failure = None
        self.poller = None
        self.on_failure = None
        self.on_stall = None
        self.hello_deadline = None
        # seconds without output from any worker (with progress: without a step) that stop the job, or "auto"
        self.stall = config.get("stall")
        self.auto = config.get("auto") or {}  # stall: auto's multiple, floor_s and cap_s (step_reader.auto_bound)
        self.progress = bool(config.get("progress"))  # the stall clock runs on steps, not output
        self.stalled = False
        self.started_at = None  # when the step started: the stall clock's start
        self.heard_at = {}  # each worker's last output, or step (time.monotonic()), as far as the hub knows
        self.advances = []  # (time.monotonic(), step) each time the job's step rose, the last few: stall auto's
        # a job kept by a supervisor host: its follower touches this file (log_follower.py); once it is older
        # than away_s, the supervisor is gone and nothing would watch the job: it stops
        self.away_s = config.get("away_s")
        self.beat_file = os.path.join(job_dir, BEAT_FILE)
        self.watched_since = time.time()
        self.away = None  # how long the supervisor had been away when the job stopped for it
        self.delete = config.get("delete")  # the job's TPU, to delete then (self_delete.py)
        self.on_away = None

    def attach(self, poller, on_failure, on_stall, on_away):
        self.poller, self.on_failure, self.on_stall, self.on_away = poller, on_failure, on_stall, on_away
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
                if self.failure is not None:  # an agent that comes after the failure does not start its job
                    link.send("stop %d %d\n" % self.failure)
            elif words == ["alive"]:
                self.heard_at[link.worker] = time.monotonic()
            elif len(words) == 2 and words[0] == "step" and words[1].isdigit():
                self.stepped(int(words[1]), None, link.worker)
            elif len(words) in (2, 3) and words[0] == "exit":
                self.ended.add(link.worker)
                if len(words) == 3:
                    self.words[link.worker] = words[2]
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
        if self.failure is not None or self.stalled or self.away is not None:
            return
        self.failure = (worker, code)
        for link in self.links.values():
            link.send("stop %d %d\n" % (worker, code))
        if worker != self.worker:
            self.on_failure(worker, code)

    def heard(self):
        if not self.progress:
            self.heard_at[self.worker] = time.monotonic()

    def stepped(self, step, at, worker=None):
        """A worker (default: this one) reached `step`: the stall clock starts again."""
        now = time.monotonic()
        self.heard_at[self.worker if worker is None else worker] = now
        if not self.advances or step > self.advances[-1][1]:
            self.advances = self.advances[-step_reader.AUTO_WINDOW:] + [(now, step)]

    def bound(self):
        """The stall's bound now, in seconds."""
        if self.stall != "auto":
            return self.stall
        return step_reader.auto_bound(self.advances, **self.auto)

    def until_due(self, stall):
        """Seconds until tick() has something to do (None: nothing to wait for): a stranger's hello
        overdue, accepting again, and with `stall` the job's stall."""
        dues = []
        if self.strangers:
            dues.append(next(iter(self.strangers.values())).since + self.HELLO_WITHIN_S - time.monotonic())
        if self.accepting_at is not None:
            dues.append(self.accepting_at - time.monotonic())
        if stall:
            dues += [until for until in (self.until_stall(), self.until_away()) if until is not None]
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
            self.check_away()

    def until_stall(self):
        """Seconds until the job counts as stalled (None: it is not watched for one, or already did)."""
        if not self.stall or self.stalled or self.failure is not None:
            return None
        return max(0.0, max(self.heard_at.values()) + self.bound() - time.monotonic())

    def check_stall(self):
        """Once no worker printed anything for `stall`: every agent saves its stacks and stops."""
        if self.until_stall() != 0.0:
            return
        self.stalled = True
        now = time.monotonic()
        for link in self.links.values():
            link.send("stall %.3f\n" % (now - self.heard_at[link.worker]))
        self.on_stall(now - self.heard_at[self.worker])

    def until_away(self):
        """Seconds until the job's supervisor counts as gone (None: it has none, or the job stops already)."""
        if self.away_s is None or self.stalled or self.failure is not None or self.away is not None:
            return None
        try:
            beat_at = max(os.stat(self.beat_file).st_mtime, self.watched_since)
        except OSError:  # no follower came yet: the supervisor follows a run once it started
            beat_at = self.watched_since
        return max(0.0, beat_at + self.away_s - time.time())

    def check_away(self):
        """Once the supervisor has been away for away_s: every agent stops its job, as on a stall."""
        if self.until_away() != 0.0:
            return
        try:
            self.away = time.time() - max(os.stat(self.beat_file).st_mtime, self.watched_since)
        except OSError:
            self.away = time.time() - self.watched_since
        for link in self.links.values():
            link.send("away %.3f\n" % self.away)
        self.on_away(self.away)

    def delete_if_away(self):
        """Once the job stopped because its supervisor was away: delete its TPU if the job's spec asked for
        that (config's delete), with the VM's own credentials; what came of it, in a line (else None)."""
        if self.away is None or not self.delete:
            return None
        return self_delete.delete(self.delete)

    def step_ended(self, code, word=""):
        self.ended.add(self.worker)
        if word:
            self.words[self.worker] = word
        self.hello_deadline = time.monotonic() + self.HELLO_WAIT_S
        if code != 0:
            self.fail(self.worker, code)

    def serve(self, step):
        """Stay, after worker 0's own step, until every other agent is done (or podrun stop says so)."""
        self.attach(agent_io.Poller(), lambda worker, code: None, lambda silent_s: None, lambda away_s: None)
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
        self.on_away = None
        # output is told to the hub as "alive", at most this often: never a message per line; with progress,
        # only steps are (step.py reports one at most every second)
        self.alive_every = config.get("alive_every") if config.get("stall") and not config.get("progress") else None
        self.alive_due = 0.0

    def attach(self, poller, on_failure, on_stall, on_away):
        self.poller, self.on_failure, self.on_stall, self.on_away = poller, on_failure, on_stall, on_away
        poller.register(self.connection.fileno(), "watch")

    def heard(self):
        if self.alive_every is not None and time.monotonic() >= self.alive_due:
            self.link.send("alive\n")
            self.alive_due = time.monotonic() + self.alive_every

    def stepped(self, step, at):
        self.link.send("step %d\n" % step)

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
            elif len(words) == 2 and words[0] == "away":
                self.on_away(float(words[1]))
        if lines is None:
            self.poller.unregister(fd)
            self.on_failure(self.hub_worker, LOST)  # its agent, or its host, is gone

    def delete_if_away(self):
        return None  # worker 0's agent does it

    def step_ended(self, code, word=""):
        self.link.send("exit %d %s\n" % (code, word) if word else "exit %d\n" % code)
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
