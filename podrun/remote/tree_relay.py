"""podrun's control-tree relay: on a relay worker, it opens the SSH connections to its share of the other
workers and carries their commands' streams to the launcher over its one channel (transport/tree.py).

Started like every worker-side script (transport/base.py's start_python), never installed: standard library
only, Python 3.8+. A connection is an OpenSSH master (`ssh -M`); each command a session the relay asks of
it over its control socket, as `ssh -S` would (MuxSession), so each worker behind the relay has one SSH
connection per job, as a directly connected one has. The masters sign in with the agent the launcher
forwarded (SSH_AUTH_SOCK, through AgentProxy) and check host keys against the lines the launcher sends,
as its own connections would.

stdin/stdout  frames (tree_frames.py). From the launcher:
  OPEN    child  {argv: ssh's options and destination, known: known-hosts lines, check: "yes",
                  "accept-new" or "no"}: connect
  START   chan   {child, command}: run a command on the child's connection
  INPUT   chan   bytes for its stdin;  EOF chan: its stdin ends
  CLOSE   child  close the connection (its commands end with it)
To the launcher:
  OPENED  child  the known-hosts lines the connection added (a host seen for the first time), or nothing
  FAILED  child  why it could not connect (ssh's last words)
  LOST    child  why the connection ended under its commands
  STDOUT / STDERR  chan  bytes;  EXIT chan  its exit code, in decimal
End of stdin: every connection is closed, then the relay exits.
"""

import array
import asyncio
import collections
import marshal
import os
import shutil
import socket
import struct
import sys
import tempfile

try:  # on a worker: sent ahead of this file (transport/base.py)
    tree_frames = sys.modules["podrun_remote_tree_frames"]
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import tree_frames

CONNECTED = b"podrun-connected"
# a command's ssh client that exits 255 may have lost its master: the master's own exit is awaited this long,
# so that the launcher hears of a lost connection, not of a command that exited 255
MASTER_EXIT_WAIT_S = 2.0
INPUT_HELD_MAX = 1 << 20  # bytes held for one command's stdin before the relay waits for it to take them
# what the master runs: it says it is up once the connection (and so its control socket) is, then ends when
# its stdin does, so that a relay killed outright leaves no master behind
HELD_OPEN = "echo %s; exec cat >/dev/null" % CONNECTED.decode()
IDENTITIES_REQUEST = b"\x0b"  # ssh-agent's SSH_AGENTC_REQUEST_IDENTITIES
# the key exchanges the launcher's own connections make (asyncssh's, curve25519 first): OpenSSH 9's default
# (sntrup761x25519) cost its client 63 ms of CPU per connection here, against 9 ms for curve25519-sha256
KEX = "curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,diffie-hellman-group14-sha256"


class Command:
    """A command's session on its master (MuxSession), and what came for its stdin before it started."""

    def __init__(self):
        self.process = None
        self.pending = []
        self.ended = False

    def started(self, process):
        self.process = process
        for data in self.pending:
            process.stdin.write(data)
        self.pending = []
        if self.ended:
            process.stdin.close()

    async def write(self, data):
        if self.process is None:
            self.pending.append(data)
        elif not self.process.stdin.is_closing():
            self.process.stdin.write(data)
            if self.process.stdin.transport.get_write_buffer_size() > INPUT_HELD_MAX:
                try:
                    await self.process.stdin.drain()
                except ConnectionError:
                    pass

    def end(self):
        self.ended = True
        if self.process is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()


class AgentProxy:
    """The agent the masters sign in with: one connection to the agent the launcher forwarded, shared by every
    master (each asking over the forwarded agent would open a channel to the launcher per connection). The
    masters' requests are pipelined on it, their replies taken in order (an agent answers a connection's
    requests in turn), so that 32 handshakes wait for one round trip to the launcher, not 32 in a row; the
    list of identities is asked once."""

    def __init__(self, upstream, path):
        self.upstream, self.path = upstream, path
        self.connection = None
        self.waiting = collections.deque()  # a future per request sent, for its reply
        self.identities = None

    async def start(self):
        await asyncio.start_unix_server(self.serve, self.path)

    async def serve(self, reader, writer):
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                writer.write(await self.ask(await reader.readexactly(size)))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            writer.close()

    async def ask(self, request):
        """The agent's whole reply (length included) to one request."""
        if request == IDENTITIES_REQUEST and self.identities:
            return self.identities
        if self.connection is None:
            self.connection = asyncio.ensure_future(self._connect())
        upstream = await self.connection
        reply = asyncio.get_running_loop().create_future()
        self.waiting.append(reply)
        upstream.write(len(request).to_bytes(4, "big") + request)
        reply = await reply
        if request == IDENTITIES_REQUEST:
            self.identities = reply
        return reply

    async def _connect(self):
        reader, writer = await asyncio.open_unix_connection(self.upstream)
        asyncio.ensure_future(self._replies(reader))
        return writer

    async def _replies(self, reader):
        try:
            while True:
                size = await reader.readexactly(4)
                self.waiting.popleft().set_result(size + await reader.readexactly(int.from_bytes(size, "big")))
        except (asyncio.IncompleteReadError, ConnectionError, OSError, IndexError) as error:
            while self.waiting:
                self.waiting.popleft().set_exception(ConnectionError("the forwarded agent went away: %s" % error))


class MuxSession:
    """A command on a master's connection, asked for over its control socket as `ssh -S` asks (OpenSSH's
    PROTOCOL.mux), without a process of its own: the shape of an asyncio subprocess (stdin, stdout,
    stderr, wait()), its exit code the one the master reports (255 where the session ended without one)."""

    def __init__(self, sock, stdin, stdout, stderr):
        self.sock, self.stdin, self.stdout, self.stderr = sock, stdin, stdout, stderr
        self.ended = asyncio.ensure_future(self._exit_code())

    @classmethod
    async def open(cls, path, command):
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, path)
            await loop.sock_sendall(sock, _mux_packet(MUX_HELLO, _u32(MUX_VERSION)))
            await _mux_read(sock)  # the master's hello
            no_flags = _u32(0) * 4  # tty, X11, agent, subsystem
            await loop.sock_sendall(sock, _mux_packet(MUX_NEW_SESSION, _u32(1) + _mux_string(b"") + no_flags
                                                      + _u32(NO_ESCAPE) + _mux_string(b"") + _mux_string(command)))
            ends = [os.pipe() for _ in range(3)]
            for fd in (ends[0][0], ends[1][1], ends[2][1]):  # its stdin's read end, its outputs' write ends
                sock.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
                os.close(fd)
            kind, _ = await _mux_read(sock)
            if kind != MUX_SESSION_OPENED:
                raise OSError("the master refused the session (%#x)" % kind)
        except BaseException:
            sock.close()
            raise
        stdin = await _pipe_writer(ends[0][1])
        return cls(sock, stdin, await _pipe_reader(ends[1][0]), await _pipe_reader(ends[2][0]))

    async def _exit_code(self):
        try:
            while True:
                kind, body = await _mux_read(self.sock)
                if kind == MUX_EXIT_MESSAGE:
                    return int.from_bytes(body[4:8], "big")
        except (OSError, EOFError):
            return 255
        finally:
            self.sock.close()

    async def wait(self):
        return await self.ended


MUX_HELLO, MUX_VERSION, MUX_NEW_SESSION = 0x1, 4, 0x10000002
MUX_SESSION_OPENED, MUX_EXIT_MESSAGE = 0x80000006, 0x80000004
NO_ESCAPE = 0xFFFFFFFF


def _u32(value):
    return struct.pack(">I", value)


def _mux_string(data):
    return _u32(len(data)) + data


def _mux_packet(kind, body):
    return _u32(4 + len(body)) + _u32(kind) + body


async def _mux_read(sock):
    """The next message from a master's control socket: (its type, its body)."""
    size = int.from_bytes(await _mux_exactly(sock, 4), "big")
    message = await _mux_exactly(sock, size)
    return int.from_bytes(message[:4], "big"), message[4:]


async def _mux_exactly(sock, size):
    data = b""
    while len(data) < size:
        more = await asyncio.get_running_loop().sock_recv(sock, size - len(data))
        if not more:
            raise EOFError("the master closed its control socket")
        data += more
    return data


async def _pipe_reader(fd):
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
    return reader


async def _pipe_writer(fd):
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(fd, "wb", 0))
    return asyncio.StreamWriter(transport, protocol, None, loop)


class Relay:
    def __init__(self, writer, directory):
        self.writer = writer
        self.directory = directory
        self.masters = {}  # child -> its ssh master process
        self.options = {}  # child -> the ssh options and destination its commands use
        self.lost = set()  # children whose connection ended
        self.commands = {}  # channel -> its ssh client process
        self.tasks = set()

    def send(self, kind, ident, payload=b""):
        self.writer.write(tree_frames.frame(kind, ident, payload))

    def spawn(self, coroutine):
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def handle(self, kind, ident, payload):
        if kind == tree_frames.OPEN:
            self.spawn(self.open(ident, marshal.loads(payload)))
        elif kind == tree_frames.START:
            self.commands[ident] = Command()  # its input may come before its process is up
            self.spawn(self.start(ident, marshal.loads(payload)))
        elif kind == tree_frames.INPUT:
            command = self.commands.get(ident)
            if command:
                await command.write(payload)
        elif kind == tree_frames.EOF:
            command = self.commands.get(ident)
            if command:
                command.end()
        elif kind == tree_frames.CLOSE:
            self.close(ident)

    async def open(self, child, request):
        if not os.environ.get("SSH_AUTH_SOCK"):
            self.send(tree_frames.FAILED, child, b"the relay's sshd did not forward podrun's ssh-agent "
                                                b"(AllowAgentForwarding no there?)")
            return
        known = os.path.join(self.directory, "known-%d" % child)
        with open(known, "w") as handle:
            handle.write(request["known"])
        check = request["check"]
        options = ["-F", "none", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=5",
                   "-o", "ServerAliveCountMax=2", "-o", "LogLevel=ERROR", "-o", "GlobalKnownHostsFile=/dev/null",
                   "-o", "UserKnownHostsFile=" + (known if check != "no" else "/dev/null"),
                   "-o", "StrictHostKeyChecking=" + check, "-o", "HashKnownHosts=no", "-o", "CheckHostIP=no",
                   "-o", "IdentityAgent=" + os.path.join(self.directory, "agent"), "-o", "KexAlgorithms=" + KEX,
                   "-S", self.control_path(child)] + request["argv"]
        self.options[child] = options
        master = await asyncio.create_subprocess_exec(
            "ssh", "-M", "-o", "ControlPersist=no", *options, HELD_OPEN,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self.masters[child] = master
        said = b"-"
        while said and said.strip() != CONNECTED:  # a login's own words (a ~/.bashrc that echoes) come first
            said = await master.stdout.readline()
        if not said:
            await master.wait()
            self.masters.pop(child, None)
            self.send(tree_frames.FAILED, child, _last_words(await master.stderr.read(), master.returncode))
            return
        with open(known) as handle:
            added = handle.read()[len(request["known"]):]
        self.send(tree_frames.OPENED, child, added.encode() if check == "accept-new" else b"")
        await master.wait()
        if child in self.masters:  # not closed by the launcher: lost under its commands
            del self.masters[child]
            self.lost.add(child)
            self.send(tree_frames.LOST, child, _last_words(await master.stderr.read(), master.returncode))

    async def start(self, channel, request):
        child = request["child"]
        if child not in self.masters:
            del self.commands[channel]
            self.send(tree_frames.LOST, child, b"the connection is closed")
            return
        try:
            process = await MuxSession.open(self.control_path(child), request["command"].encode())
        except (OSError, EOFError):  # its master is going away, or refused it: as ssh -S, 255
            del self.commands[channel]
            code = 255
        else:
            self.commands[channel].started(process)
            await asyncio.gather(self.pump(process.stdout, tree_frames.STDOUT, channel),
                                 self.pump(process.stderr, tree_frames.STDERR, channel))
            code = await process.wait()
            del self.commands[channel]
        if code == 255 and child in self.masters:
            try:
                await asyncio.wait_for(asyncio.shield(self.masters[child].wait()), MASTER_EXIT_WAIT_S)
            except asyncio.TimeoutError:
                pass
        if child in self.lost or self.masters.get(child, None) is None:
            return  # LOST tells of it
        self.send(tree_frames.EXIT, channel, b"%d" % code)

    def control_path(self, child):
        return os.path.join(self.directory, "c%d" % child)

    async def pump(self, stream, kind, channel):
        while True:
            data = await stream.read(65536)
            if not data:
                return
            self.send(kind, channel, data)
            await self.writer.drain()

    def close(self, child):
        master = self.masters.pop(child, None)
        if master and master.returncode is None:
            master.terminate()

    def close_all(self):
        """Every connection closed; returns their masters, to wait for."""
        masters = list(self.masters.values())
        for child in list(self.masters):
            self.close(child)
        return masters


def _last_words(stderr, code):
    """ssh's last line, without its "ssh: connect to host H port P: " (the launcher names the host)."""
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        return ("ssh exited with code %s" % code).encode()
    last = lines[-1]
    if last.startswith("ssh: connect to host ") and ": " in last[len("ssh: "):]:
        last = last[len("ssh: "):].split(": ", 1)[1]
    return last.encode()


async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=tree_frames.MAX_PAYLOAD + tree_frames.HEADER.size)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", 0))
    writer = await _pipe_writer(1)
    directory = tempfile.mkdtemp(prefix="podrun-tree-")
    relay = Relay(writer, directory)
    if os.environ.get("SSH_AUTH_SOCK"):
        await AgentProxy(os.environ["SSH_AUTH_SOCK"], os.path.join(directory, "agent")).start()
    try:
        while True:
            try:
                header = await reader.readexactly(tree_frames.HEADER.size)
            except asyncio.IncompleteReadError:
                return
            kind, ident, size = tree_frames.HEADER.unpack(header)
            await relay.handle(kind, ident, await reader.readexactly(size) if size else b"")
    finally:
        for master in relay.close_all():
            await master.wait()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
