"""Hold torchrun's rendezvous port on worker 0 while the other workers connect to it.

argv: PORT. Prints "listening" once bound (the kernel completes the others' connections from the
backlog, so none needs accepting), or "busy REASON" and exits 1 if the port is taken; then waits
until the launcher ends its stdin.
"""

import socket
import sys


def main():
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(("", int(sys.argv[1])))
        server.listen(4096)
    except OSError as error:
        print("busy", error.strerror, flush=True)
        sys.exit(1)
    print("listening", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
