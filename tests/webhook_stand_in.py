"""A stand-in for a chat's incoming webhook (Slack's, Discord's): it takes POSTs of JSON on any path under
/hook/, keeps each body it got (`received`), and answers each with `status` (200 unless told). With
`silent`, it reads the request and never answers, as a host whose server hangs. Served on 127.0.0.1, or
on the lab's bridge, where every lab host reaches it (a supervisor host's launcher, lab workers).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_PATH = "/hook/T000/B000/secret-webhook-token"  # a webhook's URL holds its token, as Slack's does


class WebhookStandIn:
    def __init__(self, status: int = 200, silent: bool = False):
        self.status = status
        self.silent = silent
        self.received: list[dict] = []
        self.requests = 0  # every POST, answered or not
        self.arrived = threading.Condition()
        self.server: ThreadingHTTPServer | None = None
        self.release = threading.Event()  # ends the silent answers' wait, at shutdown

    def serve(self, address: str = "127.0.0.1") -> str:
        """Start serving on `address`; returns the webhook's URL."""
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with stand_in.arrived:
                    stand_in.requests += 1
                    if not stand_in.silent and stand_in.status < 300 and self.path == TOKEN_PATH:
                        stand_in.received.append(json.loads(body))
                    stand_in.arrived.notify_all()
                if stand_in.silent:
                    stand_in.release.wait()
                    return
                self.send_response(stand_in.status if self.path == TOKEN_PATH else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()  # a quick shutdown
        return f"http://{address}:{self.server.server_address[1]}{TOKEN_PATH}"

    def wait_for(self, count: int, timeout: float = 30) -> list[dict]:
        """The messages received, once there are `count` of them (fails after `timeout`)."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"{len(self.received)} of {count} notifications within {timeout}s: {self.received}"
                self.arrived.wait(left)
            return list(self.received)

    def events(self) -> list[tuple[str, int]]:
        """(event, attempt) of each message received, in order."""
        return [(message["event"], message["attempt"]) for message in self.received]

    def shutdown(self) -> None:
        self.release.set()
        if self.server:
            self.server.shutdown()
            self.server.server_close()
