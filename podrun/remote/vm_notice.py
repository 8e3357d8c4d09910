"""A TPU VM's own notice that it goes away, from the GCE metadata server: `instance/preempted` turns
TRUE, or `instance/maintenance-event` leaves NONE. Google gives a preempted VM about 30 s, so the
agent stops the job at once on the notice (its SIGTERM's grace period falls inside them) and reports
it, instead of waiting for the API to catch up.

Each value is read once, then long-polled (`wait_for_change=true&last_etag=...`), one socket each,
registered in the agent's poller. The server is GCE_METADATA_HOST (HOST or HOST:PORT), as Google's
libraries read it, else 169.254.169.254. Where no metadata server answers, the watch ends quietly.
Standard library only (`_socket`: `socket` costs the agent 17 ms), Python 3.8+, nothing done at import.
"""

import os

VALUES = {"preempted": "instance/preempted", "maintenance": "instance/maintenance-event"}
DEFAULT_HOST = "169.254.169.254"
CONNECT_TIMEOUT_S = 0.5  # the metadata server is on the VM's own host: it answers in a millisecond
LONG_POLL_S = 3600
MAX_RESPONSE = 65536  # a value is a word; more is no metadata server's answer
REASONS = {"preempted": "the VM announced its preemption", "maintenance": "the VM announced a maintenance event (%s)"}


def announced(stop_reason):
    """Whether an agent's stop reason is a VM's notice."""
    return bool(stop_reason) and stop_reason.startswith("the VM announced")


class Notices:
    """The metadata values watched, each on a socket of its own."""

    def __init__(self, env):
        self.host = env.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_HOST") or DEFAULT_HOST
        self.watches = {}

    def attach(self, poller):
        for name, path in VALUES.items():
            watch = _Watch(self.host, name, path)
            if watch.send():
                self.watches[watch.fd] = watch
                poller.register(watch.fd, "notice")
        self.poller = poller

    def ready(self, fd):
        """Read what came on `fd`; the reason to stop, once a value announces the VM goes away."""
        watch = self.watches[fd]
        outcome = watch.receive()
        if outcome is _Watch.WAITING:
            return None
        self.poller.unregister(fd)
        del self.watches[fd]
        watch.close()
        if outcome is _Watch.FAILED:
            return None
        if outcome is not None:
            return outcome
        if watch.send():  # unchanged: wait for the next change
            self.watches[watch.fd] = watch
            self.poller.register(watch.fd, "notice")
        return None


class _Watch:
    WAITING, FAILED = object(), object()

    def __init__(self, host, name, path):
        self.host, self.name, self.path = host, name, path
        self.etag = None
        self.sock = None
        self.fd = -1
        self.response = b""

    def send(self):
        """Ask for the value (after the first answer: for its next change); whether the request went out."""
        import _socket

        address, _, port = self.host.partition(":")
        query = "wait_for_change=true&timeout_sec=%d&last_etag=%s" % (LONG_POLL_S, self.etag) if self.etag else ""
        request = ("GET /computeMetadata/v1/%s%s HTTP/1.1\r\nHost: %s\r\nMetadata-Flavor: Google\r\n"
                   "Connection: close\r\n\r\n" % (self.path, "?" + query if query else "", self.host))
        try:
            self.sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            self.sock.settimeout(CONNECT_TIMEOUT_S)
            self.sock.connect((address, int(port or 80)))
            self.sock.sendall(request.encode())
            self.sock.setblocking(False)
        except (OSError, ValueError):
            self.close()
            return False
        self.fd, self.response = self.sock.fileno(), b""
        return True

    def receive(self):
        """WAITING for more; FAILED; the reason to stop; or None: the value says the VM stays."""
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return self.WAITING
        except OSError:
            return self.FAILED
        if data:
            self.response += data
            return self.WAITING if len(self.response) <= MAX_RESPONSE else self.FAILED
        head, _, body = self.response.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].startswith("HTTP/1.") or lines[0].split()[1:2] != ["200"]:
            return self.FAILED
        headers = dict(line.lower().split(":", 1) for line in lines[1:] if ":" in line)
        self.etag = headers.get("etag", "").strip() or self.etag
        if headers.get("transfer-encoding", "").strip() == "chunked":
            try:
                body = _unchunked(body)
            except ValueError:
                return self.FAILED
        value = body.decode("latin-1").strip()
        if self.name == "preempted" and value == "TRUE":
            return REASONS["preempted"]
        if self.name == "maintenance" and value and value != "NONE":
            return REASONS["maintenance"] % value
        if not self.etag:
            return self.FAILED  # cannot wait for a change
        return None

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _unchunked(body):
    """An HTTP/1.1 chunked body's data."""
    data = b""
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if not size:
            break
        data, body = data + body[:size], body[size + 2:]
    return data
