"""Connect to the rendezvous endpoint on worker 0, as torchrun will.

argv: IP PORT TIMEOUT_S. Exits 0 once connected, else prints why and exits 1.
"""

import socket
import sys


def main():
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    except OSError as error:
        print(error.strerror or "timed out", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
