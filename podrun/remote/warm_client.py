"""A podrun command on a supervisor host, run by its warm podrun (supervisor/warm.py) when one serves
this podrun there, else by that podrun itself (and a warm one started for the next command).

    python3 -I -S -c SOURCE VERSION IDLE_S PODRUN ARG...

The warm podrun listens on PODRUN_HOME/warm/KEY.sock, KEY naming VERSION and PODRUN. This process
hands it its stdin, stdout and stderr (SCM_RIGHTS) with its argv, environment, directory and umask;
the warm podrun forks `podrun ARG...` on them, and this process exits with that command's exit code.
Until the warm podrun said `go` nothing ran: on any failure before it, PODRUN runs the command.
Its imports are the cheapest that do it (os and _socket: ~8 ms of Python start where json, socket
and hashlib took 20): it runs before every command.
"""

import _socket
import os
import sys

LINE_LIMIT = 1 << 10
LOST = 255  # the warm podrun's command ended without saying its exit code (it was killed)


def main():
    version, idle_s, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    path = socket_path(version, argv[0])
    if len(path.encode()) < 100:  # sun_path holds 108 bytes
        code = through(path, request(version, argv))
        if code is not None:
            os._exit(code)
        spawn(path, idle_s, version, argv[0])
    os.execvp(argv[0], argv)


def socket_path(version, podrun):
    """Where the warm podrun of `podrun` at `version` listens: a name by FNV-1a of both (the warm podrun
    checks the version again, and that the podrun's file is the one it loaded)."""
    key = 0xCBF29CE484222325
    for byte in (version + "\0" + podrun).encode():
        key = ((key ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    home = os.path.expanduser(os.environ.get("PODRUN_HOME") or "~/.podrun")
    return os.path.join(home, "warm", "%016x.sock" % key)


def request(version, argv):
    """NUL-separated: the version, the umask, the directory, the count of argv, argv, then the environment."""
    umask = os.umask(0)
    os.umask(umask)
    fields = "\0".join([version, str(umask), os.getcwd(), str(len(argv)), *argv])
    return fields.encode(errors="surrogateescape") + b"\0" + environment()


def environment():
    """NAME=VALUE for each variable, NUL-separated."""
    return b"\0".join(name + b"=" + value for name, value in os.environb.items())


def through(path, asked):
    """The command's exit code, run by the warm podrun at `path`; None if it did not take the command."""
    connection = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    answer = b""
    try:
        connection.connect(path)
        stdio = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
        connection.sendmsg([b"F"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, stdio)])
        while asked:
            asked = asked[connection.send(asked):]
        connection.shutdown(_socket.SHUT_WR)
        while answer.count(b"\n") < 2 and len(answer) < LINE_LIMIT:  # `go`, then the exit code
            chunk = connection.recv(LINE_LIMIT)
            if not chunk:
                break
            answer += chunk
    except OSError:  # after `go`, the command is the warm podrun's whatever happens here
        pass
    if not answer.startswith(b"go\n"):  # none there, or one of another version or whose podrun changed
        return None
    said = answer[3:].split(b"\n")[0]
    return int(said[5:]) if said.startswith(b"exit ") and said[5:].isdigit() else LOST


def spawn(path, idle_s, version, podrun):
    """`podrun _warm PATH IDLE_S VERSION PODRUN`, in a session of its own: it outlives this SSH session. On
    its stdin, this environment: what PODRUN (a wrapper script) changes in it, the warm podrun changes in
    each command's."""
    if os.fork() == 0:
        try:
            os.setsid()
            read, write = os.pipe()
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(read, 0)
                for fd in (1, 2):
                    os.dup2(null, fd)
                os.execvp(podrun, [podrun, "_warm", path, idle_s, version, podrun])
            os.close(read)
            os.write(write, environment())  # all of it, or it failed: the warm podrun then serves none
        finally:
            os._exit(0)
    os.wait()


if __name__ == "__main__":
    main()
