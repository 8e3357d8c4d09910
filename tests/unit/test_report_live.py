"""The report page's steps, stall verdicts and stacks (report/page.py, report/stops.py), and `report --serve`'s
server (report/live.py): how often it reads the job, and whom it answers. The page in a browser, with real
jobs: tests/local/test_report_serve.py."""

from __future__ import annotations

import html
import json
import re
import threading
import time
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

from podrun import escapes, jobstore, progress, timeline
from podrun.launch import odd_ones, stacks
from podrun.report import live, stops
from podrun.report.analysis import Analysis
from podrun.report.goodput import Goodput
from podrun.report.page import content

from helpers import recorded_job


def running_job() -> jobstore.JobRecord:
    return jobstore.load(recorded_job("train", time.time() - 60, [None, None], state=jobstore.RUNNING, exit_code=None))


def shown(record: jobstore.JobRecord, now: float | None = None) -> str:
    analysis = Analysis(record, now)
    return content(analysis, Goodput(analysis))


def test_the_page_draws_each_attempts_steps_and_says_the_step_now(home):
    record = running_job()
    for step in (3, 5, 9):
        progress.advance(record, record.workers[0], step, record.started_at + step)
    record.finish(jobstore.FAILED, 3, "worker 1 exited with code 3", ended_at=record.started_at + 10)
    record.restart()
    progress.advance(record, record.workers[1], 4, record.started_at + 20)
    text = shown(record, now=record.started_at + 30)
    lines = re.findall(r'<polyline class="steps" points="([^"]+)"', text)
    assert [len(points.split()) for points in lines] == [3, 1]
    assert re.search(r'<p id="step">step 4 in attempt 1</p>', text)  # one sample: no rate yet


def test_the_stall_verdict_and_the_newest_stacks_are_shown_escaped_and_bounded(home):
    record = running_job()
    timeline.add(record, "stall", record.started_at + 5, record.started_at + 9, why="no output <i>for</i> 4s")
    stacks.save(record, {0: "old", 1: "old"})
    newest = {0: "Thread <b>main</b>\n", 1: "Thread <b>main</b>\n", 2: "\x1b[31mother"}
    stacks.save(record, newest)
    text = shown(record)
    said = odd_ones.summary(newest)
    assert said and all(f"<li>{html.escape(escapes.shown_text(line, colour=False))}</li>" in text for line in said)
    assert '<ul id="stalls"><li>attempt 0: no output &lt;i&gt;for&lt;/i&gt; 4s</li></ul>' in text
    assert "/stacks/2, saved " in text and "old" not in text
    assert "Thread &lt;b&gt;main&lt;/b&gt;" in text and "<b>" not in text
    assert "\x1b" not in text
    stacks.save(record, {worker: f"pid {worker}" for worker in range(stops.STACKS_SHOWN + 8)})
    many = shown(record)
    assert many.count('<details id="stacks-w') == stops.STACKS_SHOWN
    assert "the other 8 workers' stacks: in the folder" in many


def test_pages_asking_at_once_cost_a_read_a_second_and_an_ended_job_is_not_read_again(home, monkeypatch):
    record = running_job()
    reads = []
    load = jobstore.load
    monkeypatch.setattr(jobstore, "load", lambda job_id: reads.append(job_id) or load(job_id))
    started = time.monotonic()
    report = live.LiveReport(record.id)
    for _ in range(20):
        report.parts()
        report.page()
    if time.monotonic() - started < live.CACHE_S:  # a machine this slow would rightly read again
        assert len(reads) == 1
    monkeypatch.setattr(live, "CACHE_S", 0.0)
    report.parts()
    assert len(reads) == 2
    record.finish(jobstore.STALLED, 124, "no output from any worker for 2.0s")
    assert json.loads(report.parts())["running"] is False
    for _ in range(5):
        report.parts()
    assert len(reads) == 3


@pytest.fixture
def server(home):
    server = ThreadingHTTPServer((live.ADDRESS, 0), live._handler(live.LiveReport(running_job().id)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def fetched(port: int, path: str, host: str) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_server_answers_requests_that_name_this_machine_only(server):
    status, body = fetched(server, "/parts", f"localhost:{server}")
    assert status == 200 and json.loads(body)["running"] is True
    assert fetched(server, "/", f"127.0.0.1:{server}")[0] == 200
    assert fetched(server, "/", f"127.0.0.1:{server + 1}")[0] == 200  # a forwarded port
    assert fetched(server, "/parts", f"rebound.example:{server}") == (
        403, "podrun serves its report to this machine's browsers only\n")
    assert fetched(server, "/elsewhere", f"localhost:{server}")[0] == 404
