"""podrun's worker-side code receiver: unpacks one shipment of the workdir and passes it on.

Started like the agent, from the worker's cache or with its source on stdin (transport/base.py), never
installed: standard library only, any Python 3.8+. Every worker that lacks the code runs one. The
launcher feeds the root of a tree (shipping/relay.py draws it) and each receiver forwards the frames, as
they arrive, to its children over the workers' own network, so the launcher's uplink carries the code once.

A shipment is a stream of frames (framing.py). The payloads of the frames before the end, unpacked, are one
tar archive, packed while it is sent; the end frame's payload is its sha256 (hex), which must match
before the tree is renamed into place, after its record (code_record.py: each file's sha256).

stdin   two messages (framing.py):
          1. {code_dir, token, listen, record, copies}: with listen, open a TCP port for the parent and
             answer "port N" on stdout (0 without listen); with record (code), write its record
             (code_record.py); copies: the code directories of the local workers that share this
             disk (absolute), where a copy of the tree goes, each with its record, before "ok";
          2. {children: [[ip, port], ...]}: where to forward.
        Then a root's frames. For the others, end of stdin before the parent connected means the
        parent will not: give up.
stdout  "port N"; "receiving" at most once a second while frames arrive (the launcher gives up on
        a receiver that says nothing for a while); "delivered IP:PORT" per child that was sent
        every frame; "ok" once in place.
stderr  why it failed (exit code 1); a line "not copied to DIR: why" per copy that failed.

Every wait is bounded, so a receiver never outlives its shipment by long, and tar's warnings are
read as they come: a tree whose mtimes are in this host's future makes one per file, more than a
pipe holds.
"""

import collections
import hashlib
import hmac
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

try:  # on a worker: sent ahead of this file (transport/base.py)
    framing, code_record = sys.modules["podrun_remote_framing"], sys.modules["podrun_remote_code_record"]
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import code_record, framing

STALL_TIMEOUT_S = 30  # no byte moving on a relay connection, or into tar, for this long: the peer is gone
# the launcher feeds the roots of a round in step and gives up on a stalled one after 60 s
# (relay.RECEIVER_STALL_S): the others wait longer than that before giving up on the launcher
LAUNCHER_SILENCE_S = 90
CONNECT_TIMEOUT_S = 5
PARENT_PROVES_S = 5  # a connection that has not presented the token by then is not the parent
STRANGERS_KEPT = 16  # connections waited on at once: the oldest goes
PROGRESS_INTERVAL_S = 1
TAR_LINES_SHOWN = 3
NOT_COPIED = "not copied to "  # on stderr, before a code directory this receiver failed to copy into
HEADER = struct.Struct(framing.FRAME_HEADER)


def main():
    try:
        receive_and_forward()
    except EOFError as error:
        fail(str(error))
    except OSError as error:
        fail("receiving the code failed: %s" % (error.strerror or error))


def receive_and_forward():
    stdin = Stream(sys.stdin, "the launcher", LAUNCHER_SILENCE_S)
    config = framing.read_message(stdin)
    server = None
    if config["listen"]:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("0.0.0.0", 0))
        server.listen(STRANGERS_KEPT)  # the parent must not find the backlog full of strangers
    say("port %d" % (server.getsockname()[1] if server else 0))
    children = [connect_child(tuple(address), config["token"]) for address in framing.read_message(stdin)["children"]]
    source = stdin if server is None else accept_parent(server, stdin, config["token"])
    tmp = "%s.tmp.%d" % (config["code_dir"], os.getpid())
    os.makedirs(tmp, 0o700)
    if config["record"]:  # code, not a `podrun cp` upload
        code_record.make_private(config["code_dir"])
    try:
        receive(source, children, tmp)
        # the record first: a version in place is never without one (it holds no inode yet, so that
        # of two receivers of the same tree, either's record fits the tree that stays)
        entries = code_record.create(tmp, config["code_dir"] + code_record.SUFFIX) if config["record"] else None
        copy_to(config.get("copies", []), tmp, entries)
        put_in_place(tmp, config["code_dir"])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for address, connection in children:
        if connection is not None:
            say("delivered %s:%d" % address)
    say("ok")


def put_in_place(tmp, code_dir):
    try:
        os.rename(tmp, code_dir)
    except OSError:  # another job put the same tree (same hash, same content) in place first
        shutil.rmtree(tmp, ignore_errors=True)


def copy_to(code_dirs, tmp, entries):
    """Local workers, whose directories are on this disk: a copy of the unpacked tree for each, with its
    record (entries: each file's sha256, from the tree's own record) and in place as its own would be.
    Copies, not links: a job that writes into one worker's code must not change another's. A copy that
    fails is said on stderr ("not copied to DIR: why"), and the launcher ships to that worker again."""
    said_at = time.monotonic()
    for code_dir in code_dirs:
        copy = "%s.tmp.%d" % (code_dir, os.getpid())
        try:
            os.makedirs(os.path.dirname(code_dir), 0o700, exist_ok=True)
            copy_tree(tmp, copy)
            if entries is not None:
                code_record.make_private(code_dir)
                code_record.write_new(code_dir + code_record.SUFFIX, entries)
            put_in_place(copy, code_dir)
        except OSError as error:
            shutil.rmtree(copy, ignore_errors=True)
            sys.stderr.write("%s%s: %s\n" % (NOT_COPIED, code_dir, error.strerror or error))
        if time.monotonic() - said_at >= PROGRESS_INTERVAL_S:  # the launcher waits on a silent receiver only so long
            say("receiving")
            said_at = time.monotonic()


def copy_tree(source, target):
    """A new directory target with what source holds: files (read-only ones stay so), symbolic links
    (not followed) and folders; the first error raised."""
    os.mkdir(target, 0o700)
    with os.scandir(source) as entries:
        for entry in entries:
            path = os.path.join(target, entry.name)
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), path)
            elif entry.is_dir():
                copy_tree(entry.path, path)
            else:
                shutil.copy2(entry.path, path)
    shutil.copystat(source, target)


class Stream:
    """Reads a pipe or a socket; nothing from it for `patience` seconds means its sender is gone."""

    def __init__(self, handle, sender, patience):
        self.handle = handle  # kept here: a socket closes when dropped
        self.sender = sender
        self.patience = patience
        self.buffer = bytearray()

    def read_line(self):
        while b"\n" not in self.buffer:
            self.fill(1)
        return self.read_exactly(self.buffer.index(b"\n") + 1)

    def read_exactly(self, size):
        while len(self.buffer) < size:
            self.fill(size - len(self.buffer))
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def fill(self, wanted):
        if not select.select([self.handle], [], [], self.patience)[0]:
            raise EOFError("nothing from %s for %ds" % (self.sender, self.patience))
        data = os.read(self.handle.fileno(), max(wanted, 1 << 16))
        if not data:
            raise EOFError("the shipment ended early")
        self.buffer += data


def connect_child(address, token):
    try:
        connection = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
        connection.settimeout(STALL_TIMEOUT_S)
        connection.sendall(token.encode())
        return address, connection
    except OSError as error:
        sys.stderr.write("cannot reach %s:%d to relay to it: %s\n" % (address[0], address[1], error))
        return address, None


def accept_parent(server, stdin, token):
    """The first connection that presents the token; stdin's end first means no parent is coming.
    Anyone who reaches this port may connect: each connection gets PARENT_PROVES_S to present the
    token, the oldest is dropped beyond STRANGERS_KEPT, and none holds up the others."""
    expected = token.encode()
    candidates = {}  # connection: [accepted at, the bytes it sent so far], oldest first
    give_up_at = time.monotonic() + STALL_TIMEOUT_S
    launcher_done = False
    while True:
        now = time.monotonic()
        for connection in [c for c, (since, _) in candidates.items() if now - since >= PARENT_PROVES_S]:
            candidates.pop(connection)
            connection.close()
        if launcher_done and not candidates:
            fail("the worker relaying the code to this one never connected")
        if now >= give_up_at:
            fail("no relay connection for %ds" % STALL_TIMEOUT_S)
        due = min([give_up_at] + [since + PARENT_PROVES_S for since, _ in candidates.values()])
        watched = [server] + ([] if launcher_done else [stdin.handle]) + list(candidates)
        readable = select.select(watched, [], [], max(0.0, due - now))[0]
        if server in readable:  # before stdin: a parent that connected and finished leaves both ready
            try:
                connection, _ = server.accept()
            except OSError as error:  # out of descriptors: make room, if strangers hold it
                if not candidates:
                    fail("cannot take the relay connection: %s" % (error.strerror or error))
                drop_oldest(candidates)
                continue
            candidates[connection] = [time.monotonic(), b""]
            if len(candidates) > STRANGERS_KEPT:
                drop_oldest(candidates)
            continue
        for connection in [c for c in readable if c in candidates]:
            try:
                data = connection.recv(len(expected) - len(candidates[connection][1]))
            except OSError:
                data = b""
            candidates[connection][1] += data
            presented = candidates[connection][1]
            if data and len(presented) < len(expected):
                continue
            del candidates[connection]
            if data and hmac.compare_digest(presented, expected):
                for other in candidates:
                    other.close()
                server.close()
                return Stream(connection, "the worker relaying the code", STALL_TIMEOUT_S)
            connection.close()  # not our parent
        launcher_done = launcher_done or stdin.handle in readable


def drop_oldest(candidates):
    oldest = next(iter(candidates))
    del candidates[oldest]
    oldest.close()


def receive(source, children, tmp):
    """Forward every frame to the children, unpack into tmp with tar, check the archive's sha256."""
    tar = Tar(tmp)
    archive_hash = hashlib.sha256()
    said_at = 0.0
    try:
        while True:
            header = source.read_exactly(HEADER.size)
            kind, size = HEADER.unpack(header)
            payload = source.read_exactly(size)
            forward(children, header + payload)
            if kind == b"e":
                expected_hash = payload.decode()
                break
            data = zlib.decompress(payload) if kind == b"z" else payload
            archive_hash.update(data)
            tar.write(data)
            if time.monotonic() - said_at >= PROGRESS_INTERVAL_S:
                say("receiving")
                said_at = time.monotonic()
        tar.finish()
    except BaseException:
        tar.kill()
        raise
    finally:
        for _, connection in children:
            if connection is not None:
                connection.close()
    if archive_hash.hexdigest() != expected_hash:
        fail("the code arrived damaged (sha256 mismatch)")


def forward(children, frame):
    for position, (address, connection) in enumerate(children):
        if connection is not None:
            try:
                connection.sendall(frame)
            except OSError as error:
                sys.stderr.write("relaying to %s:%d failed: %s\n" % (address[0], address[1], error))
                children[position] = (address, None)


class Tar:
    """`tar -x` into a directory, fed through a non-blocking pipe so that no write waits unbounded,
    its stderr read by a thread as it comes, the last lines kept to say why it failed."""

    def __init__(self, directory):
        # as root, tar would keep the launcher's uid (or its user's, by name) and setuid bits: what
        # arrives belongs to the login user, with its umask, as for any other user
        self.process = subprocess.Popen(["tar", "-x", "--no-same-owner", "--no-same-permissions", "-f", "-",
                                         "-C", directory], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        os.set_blocking(self.process.stdin.fileno(), False)
        self.last_lines = collections.deque(maxlen=TAR_LINES_SHOWN)
        self.reader = threading.Thread(target=self.read_stderr, daemon=True)
        self.reader.start()

    def read_stderr(self):
        for line in self.process.stderr:
            self.last_lines.append(line.decode(errors="replace").strip())

    def write(self, data):
        view = memoryview(data)
        while view:
            if not select.select([], [self.process.stdin], [], STALL_TIMEOUT_S)[1]:
                fail("tar took no data for %ds" % STALL_TIMEOUT_S)
            try:
                view = view[os.write(self.process.stdin.fileno(), view):]
            except BrokenPipeError:  # tar stopped reading: its exit says why
                self.finish()
                raise

    def finish(self):
        """Warnings alone (exit code 0) are no failure."""
        self.process.stdin.close()
        try:
            code = self.process.wait(STALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            fail("tar did not finish within %ds of the last data" % STALL_TIMEOUT_S)
        self.reader.join(STALL_TIMEOUT_S)
        if code != 0:
            fail("tar could not unpack the code: %s" % ("; ".join(self.last_lines) or "exit code %d" % code))

    def kill(self):
        """Before the partial tree is removed: a tar still writing into it would leave some behind."""
        self.process.kill()
        self.process.wait()


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def fail(reason):
    sys.stderr.write(reason + "\n")
    sys.exit(1)


if __name__ == "__main__":
    main()
