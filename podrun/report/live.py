"""`podrun report --serve`: the report page of a running (or ended) job, served on 127.0.0.1 by the podrun
process (http.server) and redrawn as the job goes.

The page (page.py's, with LIVE_SCRIPT) asks `/parts` every POLL_S for its content; the server reads the
job's record again as `podrun report` does (the job's handle: a supervised job's from its supervisor host,
a detached job's from its workers), at most once a CACHE_S however many pages ask, and not at all once
the job has ended. A request whose Host is not this machine's loopback name is refused: a web page
elsewhere cannot read the report through a name of its own that resolves here (DNS rebinding).
"""

from __future__ import annotations

import errno
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from podrun import jobstore
from podrun.errors import PodrunError
from podrun.handles import handle_for
from podrun.output import say
from podrun.report.analysis import Analysis
from podrun.report.goodput import Goodput
from podrun.report.page import content, page

ADDRESS = "127.0.0.1"
CACHE_S = 1.0
POLL_S = 2
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
# nothing the page shows may reach elsewhere, even text that escaped its escaping
POLICY = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'"

LIVE_SCRIPT = """
(function () {
  var every = %d;
  function say(text) { document.getElementById('live').textContent = text; }
  function redraw(parts) {
    var open = [];
    document.querySelectorAll('#content details[open]').forEach(function (block) { open.push(block.id); });
    document.getElementById('content').innerHTML = parts.html;
    open.forEach(function (id) { var block = document.getElementById(id); if (block) block.open = true; });
    markDrawn();
    var at = new Date(parts.read_at * 1000).toLocaleTimeString();
    say(parts.running ? 'live, as of ' + at + (parts.problem ? ': ' + parts.problem : '')
                      : 'the job has ended; as of ' + at);
  }
  function poll() {
    fetch('parts', {cache: 'no-store'}).then(function (answer) {
      if (!answer.ok) throw new Error('HTTP ' + answer.status);
      return answer.json();
    }).then(function (parts) {
      redraw(parts);
      if (parts.running) setTimeout(poll, every);
    }, function () {
      say('podrun report --serve does not answer: the job as last read');
      setTimeout(poll, every);
    });
  }
  window.addEventListener('load', function () {
    var line = document.createElement('p');
    line.id = 'live';
    document.body.insertBefore(line, document.body.firstChild);
    say('live, every ' + every / 1000 + ' s');
    setTimeout(poll, every);
  });
})();
""" % (POLL_S * 1000)


class LiveReport:
    """The job's page and its content, read where the job is kept; the first read's error is raised (the job
    cannot be read), a later one's shown on the page beside what was read last."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        self._lock = threading.Lock()
        self._problem: str | None = None
        self._read()

    def _read(self) -> None:
        handle = handle_for(jobstore.load(self.job_id))
        handle.reread()
        self._analysis = Analysis(handle.record)
        self._split = Goodput(self._analysis)
        self._read_at = time.monotonic()
        self._content = content(self._analysis, self._split)
        # as of this read: asked again later, an attached job's record read before its end would say
        # lost once its launcher has exited, with its end unread
        self._running = handle.record.current_state() == jobstore.RUNNING

    def _fresh(self) -> None:
        """Read again, if the job may have changed since the last read, CACHE_S ago or more (the lock held)."""
        if self._running and time.monotonic() - self._read_at >= CACHE_S:
            try:
                self._read()
                self._problem = None
            except PodrunError as error:
                self._problem = f"the job could not be read again ({error})"
                self._read_at = time.monotonic()

    def page(self) -> bytes:
        with self._lock:
            self._fresh()
            return page(self._analysis, self._split, LIVE_SCRIPT).encode()

    def parts(self) -> bytes:
        """The page's content as a JSON object: html, running, read_at (epoch seconds), problem."""
        with self._lock:
            self._fresh()
            return json.dumps({"html": self._content, "running": self._running, "read_at": self._analysis.now,
                               "problem": self._problem}).encode()


def serve(live: LiveReport, port: int) -> int:
    """Serve the page until Ctrl-C; `port` 0: a free one."""
    try:
        server = ThreadingHTTPServer((ADDRESS, port), _handler(live))
    except OSError as error:
        why = "another program listens there" if error.errno == errno.EADDRINUSE else error.strerror
        raise PodrunError(f"--port {port}: cannot listen on {ADDRESS}:{port}: {why}") from None
    print(f"job {live.job_id}'s report, live: http://{ADDRESS}:{server.server_address[1]}/ (Ctrl-C stops)",
          flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        say(f"stopped serving job {live.job_id}'s report")
    finally:
        server.server_close()
    return 0


def _handler(live: LiveReport) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
            if host not in LOOPBACK_NAMES:
                self._answer(403, "text/plain", b"podrun serves its report to this machine's browsers only\n")
            elif path == "/":
                self._answer(200, "text/html; charset=utf-8", live.page())
            elif path == "/parts":
                self._answer(200, "application/json", live.parts())
            else:
                self._answer(404, "text/plain", b"not found\n")

        def _answer(self, status: int, kind: str, body: bytes) -> None:
            try:
                self.send_response(status)
                for name, value in (("Content-Type", kind), ("Content-Length", str(len(body))),
                                    ("Cache-Control", "no-store"), ("Content-Security-Policy", POLICY)):
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)
            except ConnectionError:  # the browser went away mid-answer
                pass

        def log_message(self, format: str, *args) -> None:  # each request on stderr: noise at a terminal
            pass

    return Handler
