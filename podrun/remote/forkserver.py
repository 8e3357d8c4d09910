"""A Python that starts local workers' Python scripts by forking itself: what `python -I -S -c PROGRAM`
would run, without an interpreter's start-up each time (transport/local_spawner.py starts it, once per
launch, as `python -I -S -c`, this source on stdin, so its children are such interpreters).

A new interpreter costs each of 1,024 local workers' agents about 7 ms of CPU on the machine's shared
cores, and the launcher's event loop waited in every spawn for the child's exec; a fork of this small
process costs a fraction of that, and the launcher only sends a request (docs/benchmarks.md, Pod scale
to 1,024 workers).

The socket given as argv[1] (AF_UNIX, SOCK_SEQPACKET, one request or answer per packet), JSON:
  request  {"cwd": DIR, "program": PROGRAM, "args": [ARG, ...]} with three descriptors (SCM_RIGHTS): the
           child's stdin, stdout and stderr
  answers  {"pid": PID} or {"error": WHY}, one per request, in order; {"exited": PID, "code": CODE}
           (negative: the signal's number) once a child ended
The child runs in a session of its own, in cwd, with sys.argv ["-c", ARG, ...], as `python -c` runs its
program: SystemExit gives its code, any other exception its traceback and 1. The end of the socket
(the launcher ended) ends this process; its children carry on.

Standard library only, Python 3.8+.
"""

import json
import os
import select
import signal
import socket
import sys

# in its command line, which its children keep: how detached_stopper.py knows a forked agent
COMMAND_MARK = "podrun's fork server of local workers"
DESCRIPTORS = 3
PACKET_BYTES = 1 << 20


def main():
    control = socket.socket(fileno=int(sys.argv[1]))
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)  # its source came on stdin
    os.close(nothing)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda number, frame: None)
    poller = select.poll()  # not select(): the socket keeps the launcher's number for it, past 1,024 at scale
    for descriptor in (control.fileno(), wake_read):
        poller.register(descriptor, select.POLLIN)
    while True:
        ready = [descriptor for descriptor, _ in poller.poll()]
        if wake_read in ready:
            os.read(wake_read, 4096)
        reap(control)
        if control.fileno() in ready:
            data, descriptors = receive(control)
            if not data:
                return
            child = start(json.loads(data.decode()), descriptors, control, (wake_read, wake_write))
            if child is None:  # the child's own way out: run its program, then end as `python -c` would
                return
            for descriptor in descriptors:
                os.close(descriptor)
            control.send(json.dumps(child).encode())


def receive(control):
    data, ancillary, _, _ = control.recvmsg(PACKET_BYTES, socket.CMSG_SPACE(DESCRIPTORS * 4))
    descriptors = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            descriptors += [int.from_bytes(payload[i:i + 4], sys.byteorder) for i in range(0, len(payload) - 3, 4)]
    return data, descriptors


def start(request, descriptors, control, wakeup):
    """Fork: the parent gets its answer ({"pid"} or {"error"}); the child runs the program, and gets None
    once it did (sys.exit has its code by then)."""
    if len(descriptors) != DESCRIPTORS:
        return {"error": "expected %d descriptors, got %d" % (DESCRIPTORS, len(descriptors))}
    try:
        pid = os.fork()
    except OSError as error:
        return {"error": "cannot fork: %s" % error.strerror}
    if pid:
        return {"pid": pid}
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    control.close()
    for descriptor in wakeup:
        os.close(descriptor)
    os.setsid()
    for target, descriptor in enumerate(descriptors):
        os.dup2(descriptor, target)
        os.close(descriptor)
    try:
        os.chdir(request["cwd"])
    except OSError as error:
        sys.stderr.write("cannot enter %s: %s\n" % (request["cwd"], error.strerror))
        os._exit(127)
    sys.argv = ["-c"] + request["args"]
    program = compile(request["program"], "<string>", "exec")
    exec(program, {"__name__": "__main__", "__builtins__": __builtins__})  # errors: as `python -c` ends
    return None


def reap(control):
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        control.send(json.dumps({"exited": pid, "code": code}).encode())


if __name__ == "__main__":
    main()
