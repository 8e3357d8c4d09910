"""The task of Slurm's one step on each node: connect back to the login node's fanout (slurm_fanout.py)
and run the worker's command (podrun's agent) with its stdin, stdout and stderr carried over that one
connection as frames (tree_frames.py).

argv: HOW WHAT: "shell" and a shell line, or "python" and the code of a `python3 -I -S -c` (podrun's
agent's bootstrap), run in a child forked from this process, not in a second interpreter. Environment,
removed before COMMAND starts: PODRUN_STEP_AT
("HOST,HOST,...:PORT", the fanout's addresses, tried in order) and PODRUN_STEP_TOKEN (the step's
secret, said first with the node's name: SLURMD_NODENAME). A node that reaches none prints
"podrun-unreached NODE WHY" on stdout, which srun passes to the fanout, and exits 0: the launcher
runs that node's command as a step of its own.

The connection's end (the launcher or its fanout gone) ends COMMAND's stdin: the agent stops its job,
as over SSH. Its exit code goes back as the EXIT frame once its stdout and stderr have ended.
Standard library only, run with `python3 -I -S -c`, tree_frames.py's source ahead of it; `_socket`, not
`socket`, whose enums and selectors cost each node's start 4-7 ms of CPU (remote/interfaces.py does the same).
"""

import _signal
import _socket
import os
import select
import sys

try:  # on a node: sent ahead of this file (transport/slurm_step.py)
    tree_frames = sys.modules["podrun_remote_tree_frames"]
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import tree_frames

ADDRESS, TOKEN = "PODRUN_STEP_AT", "PODRUN_STEP_TOKEN"
CONNECT_TIMEOUT_S = 5  # per address: a login node whose firewall drops the nodes' packets costs this once


def connect(node):
    """The connection to the fanout, the token and node name said; None when no address answers."""
    hosts, _, port = os.environ.pop(ADDRESS, "").rpartition(":")
    token = os.environ.pop(TOKEN, "")
    problems = []
    for host in hosts.split(","):
        try:
            connection = connected(host, int(port))
        except (OSError, ValueError) as error:
            problems.append("%s: %s" % (host, getattr(error, "strerror", None) or error or "timed out"))
            continue
        # frames go as they are written: with Nagle's algorithm the agent's probe, written just after its
        # hello, waited for the fanout's delayed ACK of that (40 ms)
        connection.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        connection.sendall(("%s %s\n" % (token, node)).encode())
        return connection
    print("podrun-unreached %s %s" % (node, "; ".join(problems) or "no address"), flush=True)
    return None


def connected(host, port):
    """A blocking TCP connection to the first of `host`'s addresses that answers within CONNECT_TIMEOUT_S,
    as socket.create_connection makes it; the last address's error where none does."""
    failed = OSError("no address")
    for family, kind, protocol, _, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        connection = _socket.socket(family, kind, protocol)
        try:
            connection.settimeout(CONNECT_TIMEOUT_S)
            connection.connect(address)
            connection.settimeout(None)
            return connection
        except OSError as error:
            connection.close()
            failed = error
    raise failed


def spawn(how, what, connection):
    """The command, with pipes for its stdin, stdout and stderr: (pid, stdin, stdout, stderr). `how` is
    "shell" (`what`: a line for /bin/sh) or "python" (`what`: the code of a `python3 -I -S -c`, which the
    forked child runs itself: a node's agent starts without a second interpreter)."""
    child_in, stdin = os.pipe()
    stdout, child_out = os.pipe()
    stderr, child_err = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd, target in ((child_in, 0), (child_out, 1), (child_err, 2)):
            os.dup2(fd, target)
        if how == "python":
            run_here(what, (child_in, stdin, stdout, child_out, stderr, child_err, connection.fileno()))
        try:  # the pipes and the connection are not inherited (PEP 446): exec closes them
            os.execv("/bin/sh", ["/bin/sh", "-c", what])
        finally:
            os._exit(127)
    # Slurm signals every process of the step (scancel, its time limit and the warning before it): the agent
    # stops its job on SIGTERM, and its last words and exit come over this connection; SIGKILL still ends it
    _signal.signal(_signal.SIGTERM, _signal.SIG_IGN)
    for fd in (child_in, child_out, child_err):
        os.close(fd)
    return pid, stdin, stdout, stderr


def run_here(code, inherited):
    """Run `code` as `python3 -I -S -c` would, in this forked child, and exit with its status."""
    for fd in inherited:
        os.close(fd)
    sys.argv = ["-c"]
    status = 1
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        status = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            status = stop.code or 0
        else:
            sys.stderr.write("%s\n" % stop.code)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(status & 0xFF)


def pump(connection, pid, stdin, stdout, stderr):
    """Carry the command's streams until its output has ended; its exit code."""
    frames = tree_frames.Frames()
    kinds = {stdout: tree_frames.STDOUT, stderr: tree_frames.STDERR}
    watched = [connection, stdout, stderr]
    open_ = True  # the connection: once it ends, the command's input ends and its output goes nowhere
    while stdout in watched or stderr in watched:
        for ready in select.select(watched, [], [])[0]:
            if ready is connection:
                try:
                    data = connection.recv(262144)
                except OSError:
                    data = b""
                frames.feed(data)
                for kind, _, payload in frames.take():
                    if kind == tree_frames.INPUT and stdin is not None:
                        write_all(stdin, payload)
                    elif kind == tree_frames.EOF:
                        stdin = close(stdin)
                if not data:  # the launcher is gone
                    watched.remove(connection)
                    open_, stdin = False, close(stdin)
                continue
            data = os.read(ready, 262144)
            if not data:
                watched.remove(ready)
                os.close(ready)
            elif open_:
                open_ = send(connection, tree_frames.frames(kinds[ready], 0, data))
    close(stdin)
    status = os.waitpid(pid, 0)[1]
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    if open_:
        send(connection, tree_frames.frame(tree_frames.EXIT, 0, str(code).encode()))
    return code


def send(connection, data):
    """Whether the connection took `data`."""
    try:
        connection.sendall(data)
        return True
    except OSError:
        return False


def close(fd):
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def write_all(fd, data):
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass  # the command no longer reads its input


def main():
    connection = connect(os.environ.get("SLURMD_NODENAME") or _socket.gethostname())
    if connection is None:
        return 0
    code = pump(connection, *spawn(sys.argv[1], sys.argv[2], connection))
    connection.close()
    return code & 0xFF if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
