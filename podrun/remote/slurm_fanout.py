"""Slurm's one step for a whole job, run on the login node: ONE srun whose task on each node
(slurm_connector.py) connects back here, and every node's channel carried over this script's stdin
and stdout, the launcher's one SSH channel, as frames (tree_frames.py, the control tree's). Slurm's daemons fan the
start out to the nodes; the launcher still talks to each node's agent on a channel of its own.

stdin   a message (framing.py): {nodes (Slurm node names, in the launcher's slot order), srun (its
        argv, the task's included: slurm_connector.py from its bootstrap, then what each node runs),
        connector (the source srun gives every task on stdin),
        address (the host the nodes connect to, or null: this host's SSH_CONNECTION address, then
        its host name's)}; then frames for the nodes (INPUT, EOF; a frame's id is the node's slot). Its
        end: the launcher is gone, and every node's connection is closed, which ends each command's stdin.
stdout  frames: each node's OPENED (its connector reached this fanout), then its STDOUT, STDERR and EXIT
        as its connector sent them (LOST if its connection ends first); or FAILED (it reached no address
        of this host, or srun ended first: why, with srun's last lines): the launcher runs that node's
        command as a step of its own.
Ends once srun has ended and every node's connection has.

The nodes prove themselves with a token made here, given to srun's tasks in their environment (never
on a command line, never on disk). Standard library only.
"""

import hmac
import os
import select
import socket
import subprocess
import sys

try:  # on the login node: sent ahead of this file (transport/base.py)
    agent_io, framing, tree_frames = (sys.modules["podrun_remote_" + name]
                                      for name in ("agent_io", "framing", "tree_frames"))
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import agent_io, framing, tree_frames

UNREACHED_SAID = "podrun-unreached "  # slurm_connector.py's line for a node that reached no address
HELLO_MAX = 4096


def addresses(port, given):
    """Where the nodes try to reach this host: "HOST,HOST:PORT"."""
    hosts = [given] if given else []
    if not given:
        hosts += os.environ.get("SSH_CONNECTION", "").split()[2:3]
        try:
            hosts += socket.gethostbyname_ex(socket.gethostname())[2]
        except OSError:
            pass
        hosts = [host for host in dict.fromkeys(hosts) if not host.startswith("127.")] or ["127.0.0.1"]
    return "%s:%d" % (",".join(hosts), port)


class Fanout:
    def __init__(self, config):
        self.nodes = config["nodes"]
        self.slots = {node: slot for slot, node in enumerate(self.nodes)}
        self.token = os.urandom(16).hex()
        self.listener = socket.socket()
        self.listener.bind(("", 0))
        self.listener.listen(len(self.nodes) + 16)
        env = dict(os.environ, PODRUN_STEP_AT=addresses(self.listener.getsockname()[1], config.get("address")),
                   PODRUN_STEP_TOKEN=self.token)
        # a session of its own: nothing signals srun but Slurm (a second SIGINT within a second cancels the step)
        self.srun = subprocess.Popen(config["srun"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, start_new_session=True)
        try:  # the connector's source, which srun passes to every task
            self.srun.stdin.write(config["connector"])
            self.srun.stdin.close()
        except OSError:
            pass  # srun ended at once: what it said tells why
        # poll, not select: a step of thousands of nodes holds a connection each (select stops at 1,024)
        self.poller = select.poll()
        self.watched = {}  # descriptor -> what it is: 0 (the launcher), the listener, srun's streams, connections
        self.hellos = {}  # connection -> what it said so far, until its token and node name
        self.connections = {}  # slot -> connection
        self.slot_of = {}  # connection -> slot
        self.frames = {}  # connection -> tree_frames.Frames
        self.decided = set()  # slots told OPENED or FAILED: each is told one of them, once
        self.srun_lines = {self.srun.stdout: b"", self.srun.stderr: b""}
        self.said = []  # srun's last lines (what it said of a failure), for the nodes it never started

    def run(self, control):
        frames = tree_frames.Frames()
        frames.feed(control.pending)
        self.route(frames.take())
        for watched in (0, self.listener, *self.srun_lines):
            self.watch(watched)
        while self.srun_lines or self.connections or self.hellos:
            for fd, _ in self.poller.poll():
                ready = self.watched.get(fd)
                if ready == 0:
                    data = os.read(0, 262144)
                    if not data:  # the launcher is gone: so is every node's input
                        for connection in list(self.slot_of):
                            self.drop(connection)
                        return
                    frames.feed(data)
                    self.route(frames.take())
                elif ready is self.listener:
                    connection, _ = self.listener.accept()
                    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the node's end (connector)
                    self.hellos[connection] = b""
                    self.watch(connection)
                elif ready in self.srun_lines:
                    self.srun_said(ready)
                elif ready in self.hellos:
                    self.hello(ready)
                elif ready in self.slot_of:
                    self.carry(ready)

    def watch(self, watched):
        fd = watched if isinstance(watched, int) else watched.fileno()
        self.poller.register(fd, select.POLLIN)
        self.watched[fd] = watched

    def unwatch(self, watched):
        """Stop watching `watched` (a connection, before it is closed; a stream of srun's at its end)."""
        fd = watched.fileno()
        self.poller.unregister(fd)
        del self.watched[fd]

    def route(self, frames):
        for kind, slot, payload in frames:
            connection = self.connections.get(slot)
            if connection is not None:
                try:
                    connection.sendall(tree_frames.frame(kind, 0, payload))
                except OSError:
                    self.drop(connection, "its connection to the login node broke")

    def hello(self, connection):
        data = connection.recv(HELLO_MAX)
        said = self.hellos[connection] + data
        if b"\n" not in said:
            if data and len(said) < HELLO_MAX:
                self.hellos[connection] = said
                return
            del self.hellos[connection]
            self.unwatch(connection)
            connection.close()
            return
        del self.hellos[connection]
        hello, _, frames_behind = said.partition(b"\n")  # its command's first frames may come in the same read
        token, _, node = hello.decode(errors="replace").partition(" ")
        slot = self.slots.get(node)
        if not hmac.compare_digest(token.encode(), self.token.encode()) or slot is None or slot in self.decided:
            self.unwatch(connection)
            connection.close()  # not a task of this step, or a node twice
            return
        self.connections[slot], self.slot_of[connection] = connection, slot
        self.frames[connection] = tree_frames.Frames()
        self.decided.add(slot)
        self.tell(tree_frames.OPENED, slot)
        self.carried(connection, frames_behind)

    def carry(self, connection):
        try:
            data = connection.recv(262144)
        except OSError:
            data = b""
        if not data:
            self.drop(connection, "its connection to the login node ended before its exit code")
            return
        self.carried(connection, data)

    def carried(self, connection, data):
        """What came from a node: its frames, passed on."""
        slot = self.slot_of[connection]
        frames = self.frames[connection]
        frames.feed(data)
        for kind, _, payload in frames.take():
            self.tell(kind, slot, payload)
            if kind == tree_frames.EXIT:
                self.drop(connection)

    def drop(self, connection, lost=None):
        slot = self.slot_of.pop(connection)
        del self.connections[slot], self.frames[connection]
        self.unwatch(connection)
        connection.close()
        if lost:
            self.tell(tree_frames.LOST, slot, lost.encode())

    def srun_said(self, stream):
        data = os.read(stream.fileno(), 65536)
        if data:
            *lines, self.srun_lines[stream] = (self.srun_lines[stream] + data).split(b"\n")
        else:
            self.unwatch(stream)
            lines = [self.srun_lines.pop(stream)] if self.srun_lines[stream] else []
        for line in lines:
            text = line.decode(errors="replace").strip()
            node, _, why = text[len(UNREACHED_SAID):].partition(" ")
            if text.startswith(UNREACHED_SAID) and node in self.slots and self.slots[node] not in self.decided:
                self.decided.add(self.slots[node])
                self.tell(tree_frames.FAILED, self.slots[node], why.encode())
            elif text:
                self.said = (self.said + [text])[-3:]
        if not self.srun_lines:
            self.srun_ended()

    def srun_ended(self):
        """Every node whose task ended without reaching this fanout is told so, with what srun said."""
        code = self.srun.wait()
        why = "; ".join(self.said) or "srun ended (exit code %d) before its task connected" % code
        for slot in range(len(self.nodes)):
            if slot not in self.decided:
                self.decided.add(slot)
                self.tell(tree_frames.FAILED, slot, why.encode())
        for connection in list(self.hellos):
            self.unwatch(connection)
            connection.close()
        self.hellos.clear()

    def tell(self, kind, slot, payload=b""):
        view = memoryview(tree_frames.frame(kind, slot, payload))
        while view:
            view = view[os.write(1, view):]


def more_files(wanted):
    """The soft limit on open files raised towards the hard one, for a connection per node."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard == resource.RLIM_INFINITY else min(hard, wanted), hard))
    except (ImportError, ValueError, OSError):
        pass  # the limit stays: srun's tasks past it cannot connect, and run as steps of their own


def main():
    control = agent_io.ControlInput()  # the configuration, read as the agent reads its step
    config = framing.read_message(control)
    more_files(2 * len(config["nodes"]) + 64)
    Fanout(config).run(control)


if __name__ == "__main__":
    main()
