"""podrun's worker-side code receiver: unpacks one shipment of the workdir and passes it on.

Sent over stdin like the agent (transport.script_command), never installed: standard library only,
any Python 3.8+. Every worker that lacks the code runs one. The launcher feeds the root of a tree
(relay.py draws it) and each receiver forwards the frames, as they arrive, to its children over the
workers' own network, so the launcher's uplink carries the code once.

A shipment is a stream of frames: a kind byte (b"z" zlib-compressed, b"r" raw, b"e" the end), a
4-byte big-endian payload length, the payload. The payloads, unpacked, are one tar archive; its
sha256 must match the launcher's before the tree is renamed into place.

stdin   two messages, each a decimal byte count, a newline and that many bytes of marshal:
          1. {code_dir, digest, token, listen}: with listen, open a TCP port for the parent and
             answer "port N" on stdout (0 without listen);
          2. {children: [[ip, port], ...]}: where to forward.
        Then a root's frames. For the others, end of stdin before the parent connected means the
        parent will not: give up.
stdout  "port N"; "delivered IP:PORT" per child that was sent every frame; "ok" once in place.
stderr  why it failed (exit code 1).
"""

import hashlib
import marshal
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import zlib

STALL_TIMEOUT_S = 30  # no byte moving on a relay connection for this long: the peer is gone
CONNECT_TIMEOUT_S = 5
HEADER = struct.Struct(">cI")


def main():
    try:
        receive_and_forward()
    except EOFError as error:
        fail(str(error))
    except OSError as error:
        fail("receiving the code failed: %s" % (error.strerror or error))


def receive_and_forward():
    stdin = os.fdopen(0, "rb")
    config = read_message(stdin)
    server = None
    if config["listen"]:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind(("0.0.0.0", 0))
        server.listen(1)
    say("port %d" % (server.getsockname()[1] if server else 0))
    children = [connect_child(tuple(address), config["token"]) for address in read_message(stdin)["children"]]
    source = stdin if server is None else accept_parent(server, stdin, config["token"])
    tmp = "%s.tmp.%d" % (config["code_dir"], os.getpid())
    os.makedirs(tmp)
    try:
        receive(source, children, tmp, config["digest"])
        try:
            os.rename(tmp, config["code_dir"])
        except OSError:  # another job put the same tree (same hash, same content) in place first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for address, connection in children:
        if connection is not None:
            say("delivered %s:%d" % address)
    say("ok")


def read_message(stdin):
    size = int(read_line(stdin))
    return marshal.loads(read_exactly(stdin, size))


def read_line(stream):
    line = stream.readline()
    if not line.endswith(b"\n"):
        raise EOFError("the launcher ended the shipment early")
    return line


def read_exactly(stream, size):
    data = stream.read(size)  # buffered: short only at the end of the stream
    if len(data) < size:
        raise EOFError("the shipment ended early")
    return data


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
    """The first connection that presents the token; stdin's end first means no parent is coming."""
    while True:
        readable, _, _ = select.select([server, stdin], [], [], STALL_TIMEOUT_S)
        if server in readable:  # before stdin: a parent that connected and finished leaves both ready
            connection, _ = server.accept()
            connection.settimeout(STALL_TIMEOUT_S)
            reader = connection.makefile("rb")  # one reader: its buffer may already hold frames
            try:
                if read_exactly(reader, len(token)) == token.encode():
                    server.close()
                    return reader
            except (OSError, EOFError):
                pass
            connection.close()  # not our parent
        elif readable:
            fail("the worker relaying the code to this one never connected")
        else:
            fail("no relay connection for %ds" % STALL_TIMEOUT_S)


def receive(source, children, tmp, digest):
    """Forward every frame to the children, unpack into tmp with tar, check the archive's sha256."""
    tar = subprocess.Popen(["tar", "-x", "-f", "-", "-C", tmp], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    archive_hash = hashlib.sha256()
    try:
        while True:
            header = read_exactly(source, HEADER.size)
            kind, size = HEADER.unpack(header)
            payload = read_exactly(source, size)
            for position, (address, connection) in enumerate(children):
                if connection is not None:
                    try:
                        connection.sendall(header + payload)
                    except OSError as error:
                        sys.stderr.write("relaying to %s:%d failed: %s\n" % (address[0], address[1], error))
                        children[position] = (address, None)
            if kind == b"e":
                break
            data = zlib.decompress(payload) if kind == b"z" else payload
            archive_hash.update(data)
            tar.stdin.write(data)
    except (EOFError, OSError):
        tar.kill()
        raise
    finally:
        for _, connection in children:
            if connection is not None:
                connection.close()
    tar.stdin.close()
    errors = tar.stderr.read().decode(errors="replace").strip().splitlines()
    if tar.wait() != 0:
        fail("tar could not unpack the code: %s" % (errors[-1] if errors else "exit code %d" % tar.returncode))
    if archive_hash.hexdigest() != digest:
        fail("the code arrived damaged (sha256 mismatch)")


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def fail(reason):
    sys.stderr.write(reason + "\n")
    sys.exit(1)


main()
