"""report.html in a real browser: headless Chromium (Debian's `chromium`, which .ci/run installs) loads
the page with no console error, and its script finds the timeline drawn (data-drawn: its bars)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from helpers import CHROMIUM, job_id_in, podrun, require_chromium

# Chromium's --enable-logging=stderr prints what the page's console says: `...:CONSOLE(12)] "Uncaught ..."`
CONSOLE_ERROR = re.compile(r"CONSOLE.*(Uncaught|Error)", re.IGNORECASE)


@pytest.fixture(autouse=True)
def chromium_needed():
    require_chromium()


def load(page: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """The page's DOM once loaded in headless Chromium, and the console errors it logged."""
    assert CHROMIUM
    result = subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr",
                             "--v=0", f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=5000",
                             "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout, [line for line in result.stderr.splitlines() if CONSOLE_ERROR.search(line)]


def test_the_console_check_catches_a_page_that_throws(tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>undefinedFunction()</script></body></html>")
    _, errors = load(broken, tmp_path)
    assert errors and "undefinedFunction" in errors[0]


def test_the_report_page_loads_without_console_errors_and_draws_its_timeline(home, job_file, monkeypatch, tmp_path):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0.2")
    spec = job_file("target: {local: {workers: 2}}\n"
                    "run: |\n"
                    "  echo \"attempt $PODRUN_ATTEMPT\"\n"
                    "  [ \"$PODRUN_ATTEMPT\" != 0 ] || { [ \"$PODRUN_WORKER\" = 1 ] && exit 3; exec sleep 600; }\n"
                    "restarts: {max: 1, on: [failure]}\n")
    job_id = job_id_in(podrun("exec", spec).stderr)
    assert podrun("report", job_id).returncode == 0
    dom, errors = load(home / "jobs" / job_id / "report.html", tmp_path)
    assert errors == []
    drawn = re.search(r'<body data-drawn="([^"]+)" data-parts="([^"]+)"', dom)
    # two workers, two attempts: connect and run each, and the stop of worker 0 in the first
    assert drawn and drawn[1].isdigit() and int(drawn[1]) >= 9, dom[:500]
    # the wall time's parts in one bar: run, connect, ship, the restart's wait at least
    assert drawn[2].isdigit() and int(drawn[2]) >= 4, dom[:500]
