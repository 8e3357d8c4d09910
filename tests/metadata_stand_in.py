"""A stand-in for the GCE metadata server's `instance/preempted` and `instance/maintenance-event`, as
a TPU VM's processes see them (https://cloud.google.com/compute/docs/metadata/querying-metadata):
`GET /computeMetadata/v1/instance/<key>` needs the header `Metadata-Flavor: Google` (else 403),
answers text/plain with an `ETag`; with `wait_for_change=true` it holds the request until the value
differs from `last_etag` (at once if it differs already; without one, until the next change) or
`timeout_sec` passes. One value for all the VMs it serves; on the lab's bridge, where every lab host
reaches it (GCE_METADATA_HOST=ADDRESS:PORT).

`instance/service-accounts/default/token` gives the VM's service account's access token as Google's
server does (application/json: `access_token`, `expires_in`, `token_type`): `token` (VM_TOKEN), which
the TPU stand-in (tests/tpu_stand_in.py) accepts as it accepts any bearer token, unless told that its
account lacks a permission (`TpuStandIn.deny`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PREFIX = "/computeMetadata/v1/instance/"
TOKEN_KEY = "service-accounts/default/token"
VM_TOKEN = "ya29.stand-in-vm-service-account"  # the VMs' service account's access token


class MetadataStandIn:
    def __init__(self):
        self.values = {"preempted": "FALSE", "maintenance-event": "NONE"}
        self.token = VM_TOKEN
        self.tokens_given = 0
        self.changed = threading.Condition()
        self.waiting = 0  # requests held for a change now
        self.server: ThreadingHTTPServer | None = None

    def set(self, key: str, value: str) -> None:
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def serve(self, address: str) -> str:
        """Start serving on `address`; returns HOST:PORT for GCE_METADATA_HOST."""
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                url = urlsplit(self.path)
                key = url.path.removeprefix(PREFIX)
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self._answer(403, "Missing required header: Metadata-Flavor", "")
                if key == TOKEN_KEY:
                    with stand_in.changed:
                        stand_in.tokens_given += 1
                    token = {"access_token": stand_in.token, "expires_in": 3599, "token_type": "Bearer"}
                    return self._answer(200, json.dumps(token), "", "application/json")
                if not url.path.startswith(PREFIX) or key not in stand_in.values:
                    return self._answer(404, "Not Found", "")
                query = parse_qs(url.query)
                value = stand_in.value(key, query.get("wait_for_change") == ["true"],
                                       query.get("last_etag", [None])[0], float(query.get("timeout_sec", ["3600"])[0]))
                self._answer(200, value, _etag(value))

            def _answer(self, status: int, text: str, etag: str, content_type: str = "text/plain") -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Metadata-Flavor", "Google")
                if etag:
                    self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"{address}:{self.server.server_address[1]}"

    def value(self, key: str, wait: bool, last_etag: str | None, timeout: float) -> str:
        with self.changed:
            current = self.values[key]
            if not wait or (last_etag is not None and last_etag != _etag(current)):
                return current
            self.waiting += 1
            self.changed.notify_all()
            try:
                self.changed.wait_for(lambda: self.values[key] != current, timeout)
            finally:
                self.waiting -= 1
            return self.values[key]

    def shutdown(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()


def _etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]
