"""`podrun report --serve` with real local jobs, its page watched in headless Chromium (helpers.Browser): the
page redraws itself as the job goes (its steps, its stall verdict, the stacks of its stop), Ctrl-C stops the
server with exit 0, a port in use is one line."""

from __future__ import annotations

import re
import signal
import socket
import subprocess

import pytest

from podrun import jobstore

from helpers import Background, Browser, job_id_in, podrun, wait_until

STEP_SHOWN = "document.getElementById('step') && document.getElementById('step').textContent"
STEP_POINTS = "document.querySelector('#steps polyline.steps').getAttribute('points').split(' ').length"
LIVE_LINE = "document.getElementById('live') && document.getElementById('live').textContent"


@pytest.fixture
def browser(tmp_path):
    browser = Browser(tmp_path / "chromium")
    yield browser
    browser.close()


@pytest.fixture
def in_background():
    """Start podrun in the background (helpers.Background); whatever still runs at the test's end, passed or
    not, gets Ctrl-C (a job stops everywhere, a server stops) and is waited for."""
    started: list[Background] = []
    yield lambda *args: started.append(Background(*args)) or started[-1]
    for each in started:
        if each.process.poll() is None:
            each.process.send_signal(signal.SIGINT)
        try:
            each.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            each.process.kill()
            each.process.wait()


def started(in_background, spec) -> tuple[Background, str]:
    """`podrun exec spec` running in the background, once its run has begun (as its record says); its id."""
    job = in_background("exec", spec)
    job_id = job_id_in(job.wait_for(r"^podrun: job \S+: "))
    wait_until(lambda: any(entry["phase"] == "run" for entry in jobstore.load(job_id).phases), "the run", 60)
    return job, job_id


def shown_step(text: str) -> int:
    """The step in the page's `step 12 in attempt 0, ...`."""
    return int(re.match(r"step (\d+) in attempt 0", text)[1])


def serving(in_background, job_id: str) -> tuple[Background, str]:
    server = in_background("report", job_id, "--serve")
    return server, re.search(r"http://127\.0\.0\.1:\d+/", server.wait_for("http://"))[0]


def test_the_page_redraws_the_steps_as_the_job_advances_and_ctrl_c_stops_serving(home, job_file, browser,
                                                                                   in_background):
    job, job_id = started(in_background, job_file("target: {local: {workers: 2}}\n"
                                                  "progress: 'step (\\d+)'\n"
                                                  "run: |\n"
                                                  "  i=0; while :; do i=$((i+1)); echo \"step $i\"; sleep 0.2; done\n"))
    wait_until(lambda: jobstore.load(job_id).steps, "the job's first step in its record", 30)
    server, url = serving(in_background, job_id)
    browser.open(url)
    first = shown_step(browser.wait_for(STEP_SHOWN, "the step on the page"))
    points = browser.evaluate(STEP_POINTS)
    browser.evaluate("window.sameDocument = true")  # what a reload would lose
    later = browser.wait_for(f"Number((/^step (\\d+)/.exec({STEP_SHOWN}) || [0, 0])[1]) > {first} && {STEP_SHOWN}",
                             f"a step past {first} on the page")
    assert shown_step(later) > first and "steps/min" in later
    assert browser.evaluate(STEP_POINTS) > points
    assert browser.evaluate("window.sameDocument && document.body.getAttribute('data-drawn')").isdigit()
    assert browser.evaluate(LIVE_LINE).startswith("live, as of ")
    assert browser.errors == []

    server.process.send_signal(signal.SIGINT)
    assert server.finish() == 0
    assert server.lines[1:] == [f"podrun: stopped serving job {job_id}'s report"]
    browser.wait_for(f"({LIVE_LINE}).includes('does not answer')", "the page to say the server is gone")
    assert podrun("stop", job_id).returncode == 0
    job.finish()


def test_the_page_shows_the_stall_verdict_and_the_stacks_of_the_stop_escaped(home, job_file, browser, in_background):
    job, job_id = started(in_background, job_file("target: {local: {workers: 2}}\n"
                                                  "stall: 2s\n"
                                                  "run: |\n"
                                                  "  echo started\n"
                                                  "  exec python3 -c 'import time; time.sleep(600)' '<b>marked</b>'\n"))
    server, url = serving(in_background, job_id)
    browser.open(url)
    browser.wait_for(f"({LIVE_LINE}).startsWith('the job has ended')", "the page to see the job's end", 60)
    assert job.finish() == 124  # exits.STALLED
    verdict = browser.evaluate("document.getElementById('stalls').textContent")
    assert verdict.startswith("attempt 0: no output from any worker for 2"), verdict
    stacks = browser.evaluate("document.getElementById('stacks').textContent")
    assert "worker 0" in stacks and "worker 1" in stacks and "<b>marked</b>" in stacks, stacks
    assert browser.evaluate("document.querySelector('#stacks b') === null")
    assert browser.errors == []
    server.process.send_signal(signal.SIGINT)
    assert server.finish() == 0


def test_a_port_in_use_is_one_line_and_so_are_flags_that_do_not_go_together(home, job_file):
    job_id = job_id_in(podrun("exec", job_file("target: {local: {workers: 1}}\nrun: echo done\n")).stderr)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = podrun("report", job_id, "--serve", "--port", port)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"podrun: error: --port {port}: cannot listen on 127.0.0.1:{port}: another program listens there"]
    assert result.stdout == ""
    usage = podrun("report", job_id, "--port", "8000")
    assert (usage.returncode, usage.stderr.strip()) == (2, "podrun: error: --port: only with --serve")
    both = podrun("report", job_id, "--json", "--serve")
    assert both.returncode == 2 and both.stderr.splitlines()[-1].endswith(
        "error: argument --serve: not allowed with argument --json")
