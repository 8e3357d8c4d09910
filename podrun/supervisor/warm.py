"""A warm podrun on a supervisor host: one process with podrun loaded that forks `podrun ARG...` for each
command a laptop runs there (the handover's `_supervise`, and `logs`, `stop`, `stacks`, `jobs` of a
supervised job), so that the command begins at once instead of after a Python start and podrun's
imports (~0.15-0.2 s there, on the handover's path).

The laptop's command (`command`) runs remote/warm_client.py with the host's python3: it hands the
warm podrun its stdin, stdout and stderr and its environment, or, where none serves, runs the podrun
itself and starts one (`podrun _warm`) for the next command. So the first command to a host runs as
before, and nothing is installed or left behind that outlives IDLE_S without a command.

The warm podrun answers only its own user (SO_PEERCRED) on a socket in PODRUN_HOME/warm (0700).
Its command runs as that podrun would: in the command's environment, directory and umask, with only
its stdio of the command's (the socket and the warm podrun's lock closed in it). One whose podrun's
files changed since it loaded them (an upgrade of the same version, a checkout edited) refuses, and
ends: the client runs the podrun itself, and starts a new one.

PODRUN_SUPERVISOR_WARM (on the laptop): how long a warm podrun waits for a command, in seconds
(IDLE_S, 1800 by default), or `off`: each command then starts its own podrun, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import select
import shlex
import shutil
import socket
import struct
import sys
import time
from collections.abc import Callable

from podrun import paths
from podrun.errors import UsageError
from podrun.remote import forkserver
from podrun.supervisor import greeting

SETTING = "PODRUN_SUPERVISOR_WARM"
IDLE_S = 1800
REQUEST_LIMIT = 1 << 20
RECEIVE_TIMEOUT_S = 5  # for a command's request, once connected: a client that stops mid-way is dropped
# loaded before the first command: what `_supervise` and its launch use, and the verbs of remote.py
PRELOADED = ("podrun.supervisor.daemon", "podrun.launch.lifecycle", "podrun.transport.ssh",
             "podrun.commands.logs", "podrun.commands.stop", "podrun.commands.stacks", "podrun.commands.jobs")


def idle_s() -> int | None:
    """PODRUN_SUPERVISOR_WARM's seconds; None: `off`."""
    setting = os.environ.get(SETTING, "").strip()
    if setting == "off":
        return None
    if not setting:
        return IDLE_S
    if not setting.isdigit() or int(setting) == 0:
        raise UsageError(f"{SETTING}={setting}: expected a number of seconds a warm podrun waits for a "
                         f"command on a supervisor host, or off")
    return int(setting)


def command(podrun: str, argv: list[str]) -> str:
    """The shell command that runs `podrun ARGV` on a supervisor host, through its warm podrun."""
    from podrun.transport.base import remote_source

    direct = " ".join([shlex.quote(podrun), *map(shlex.quote, argv)])
    waits = idle_s()
    if waits is None:
        return f"exec {direct}"
    client = shlex.quote(remote_source("warm_client").decode())
    through = f"exec python3 -I -S -c {client} {shlex.quote(greeting.this_version())} {waits} {direct}"
    return f"if command -v python3 >/dev/null 2>&1; then {through}; else exec {direct}; fi"


def serve(argv: list[str], podrun: Callable[[list[str]], int]) -> int:
    """`podrun _warm PATH IDLE_S VERSION PODRUN`: serve commands of PODRUN on PATH until none came for IDLE_S
    seconds, each run by `podrun` (the CLI's main) in a process of its own; none if this podrun is not of
    VERSION."""
    started = time.time_ns()
    path, waits, version, command_path = argv[0], float(argv[1]), argv[2], argv[3]
    if version != greeting.this_version():
        return 0
    paths.make_private_dir(os.path.dirname(path))
    lock = os.open(path + ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another is starting or serving there
        return 0
    os.chdir("/")
    wrapper = Wrapper(_read_all(0))
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for name in PRELOADED:
        __import__(name)
    loaded = _sources(command_path)
    if any(identity and identity[2] > started for identity in loaded.values()):  # changed while this one loaded
        return 0
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    os.ftruncate(lock, 0)
    os.write(lock, b"%d\n" % os.getpid())  # which process serves there, for whoever looks
    gc.freeze()  # what is loaded stays: the forked commands share its pages
    try:
        while select.select([listener], [], [], waits)[0]:
            connection, _ = listener.accept()
            with connection:
                if not _take(connection, listener, lock, loaded, wrapper, podrun):
                    break
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return 0


def _take(connection: socket.socket, listener: socket.socket, lock: int, loaded: dict[str, tuple[int, ...]],
          wrapper: Wrapper, podrun: Callable[[list[str]], int]) -> bool:
    """Run the command a client asks for in a process of its own; False once this podrun's files changed."""
    _, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != os.getuid():
        return True
    connection.settimeout(RECEIVE_TIMEOUT_S)
    try:
        stdio, request = _request(connection)
    except (OSError, ValueError):
        return True
    try:
        if request.version != greeting.this_version():
            connection.sendall(b"other\n")
            return True
        if _sources(request.argv[0]) != loaded:
            connection.sendall(b"stale\n")
            return False
        connection.sendall(b"go\n")
        middle = os.fork()
        if middle == 0:  # the command's process is its grandchild: this one waits for nobody else's
            try:
                if os.fork() == 0:
                    listener.close()
                    os.close(lock)
                    _run(connection, stdio, wrapper.environment(request.environ), request, podrun)
            finally:
                os._exit(0)
        os.waitpid(middle, 0)
        return True
    except OSError:
        return True
    finally:
        for fd in stdio:
            os.close(fd)


class Request:
    """What the client asks (remote/warm_client.py's request): NUL-separated fields."""

    def __init__(self, text: bytes):
        fields = text.split(b"\0")
        version, umask, cwd, count = (field.decode(errors="surrogateescape") for field in fields[:4])
        self.version, self.cwd, self.umask = version, cwd, int(umask)
        self.argv = [field.decode(errors="surrogateescape") for field in fields[4:4 + int(count)]]
        self.environ = environ_of(fields[4 + int(count):])
        if len(self.argv) != int(count) or not self.argv:
            raise ValueError("a request without its command")


class Wrapper:
    """What the podrun command changed in the environment it was started with (a wrapper script's
    `PODRUN_HOME=... exec podrun`): changed again in each command's."""

    def __init__(self, started_with: bytes):
        before, after = environ_of(started_with.split(b"\0")), dict(os.environb)
        self.set = {name: value for name, value in after.items() if before.get(name) != value}
        self.unset = before.keys() - after.keys()

    def environment(self, environ: dict[bytes, bytes]) -> dict[bytes, bytes]:
        return {name: value for name, value in {**environ, **self.set}.items() if name not in self.unset}


def environ_of(fields: list[bytes]) -> dict[bytes, bytes]:
    return dict(field.partition(b"=")[::2] for field in fields if field)


def _read_all(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, REQUEST_LIMIT):
        data += chunk
    return data


def _request(connection: socket.socket) -> tuple[list[int], Request]:
    """The client's stdin, stdout and stderr, and its request, read to its end."""
    first, stdio = forkserver.receive(connection)  # the byte that carried the descriptors, and what came with it
    try:
        if len(stdio) != forkserver.DESCRIPTORS or not first.startswith(b"F"):
            raise ValueError("a request without stdio")
        text = first[1:]
        while chunk := connection.recv(REQUEST_LIMIT):
            text += chunk
            if len(text) > REQUEST_LIMIT:
                raise ValueError("a request over its limit")
        return stdio, Request(text)
    except (OSError, ValueError):
        for fd in stdio:
            os.close(fd)
        raise


def _run(connection: socket.socket, stdio: list[int], environ: dict[bytes, bytes], request: Request,
         podrun: Callable[[list[str]], int]) -> None:
    """The command, as `podrun ARGV` started in the client's place would run it; its exit code to the client."""
    connection.settimeout(None)
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
        os.close(fd)
    os.environb.clear()
    os.environb.update(environ)
    with contextlib.suppress(OSError):
        os.chdir(request.cwd)
    os.umask(request.umask)
    sys.argv = request.argv
    own = os.getpid()
    inherited = [connection]

    def close_in_child() -> None:  # a launcher the command forks must not hold the client's answer open
        while inherited:
            inherited.pop().close()

    os.register_at_fork(after_in_child=close_in_child)
    code = podrun(request.argv[1:])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BrokenPipeError, ValueError):
            stream.flush()
    if os.getpid() == own:
        with contextlib.suppress(OSError):
            connection.sendall(b"exit %d\n" % code)
    os._exit(code)


def _sources(command_path: str) -> dict[str, tuple[int, ...]]:
    """The podrun command's file and each of podrun's loaded modules' files, as they are now (inode, size,
    last change): a request for another podrun command, or one rewritten since (a wrapper script, an
    install), is not this one's."""
    files = [shutil.which(command_path) or command_path]
    files += [path for name, module in list(sys.modules.items())
              if name.split(".")[0] == "podrun" and (path := getattr(module, "__file__", None))]
    found: dict[str, tuple[int, ...]] = {}
    for path in files:
        try:
            status = os.stat(path)
            found[path] = (status.st_ino, status.st_size, status.st_mtime_ns)
        except OSError:
            found[path] = ()
    return found
