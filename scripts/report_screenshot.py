#!/usr/bin/env python3
"""The README's picture of `podrun report`: a real job on 4 local workers that prints its step (setup, a
run that fails on worker 1 at step 12 in its first attempt and succeeds in its second, resumed from
step 8; worker 3 slow in setup, worker 2 quiet for a while), its report, and report.html as headless
Chromium draws it.

    python scripts/report_screenshot.py [--out docs/report.png]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = """\
name: train
target: {local: {workers: 4}}
workdir: code
setup: sleep 0.5; [ "$PODRUN_WORKER" != 3 ] || sleep 1
progress: 'step (\\d+)'
run: |
  first=1; [ "$PODRUN_ATTEMPT" = 0 ] || first=8
  for step in $(seq $first 20); do
    [ "$PODRUN_WORKER" = 2 ] && [ $step -gt 6 ] && [ $step -lt 14 ] || echo "step $step"
    sleep 0.15
    [ "$PODRUN_ATTEMPT" = 0 ] && [ "$PODRUN_WORKER" = 1 ] && [ $step = 12 ] && exit 3
  done
  true
restarts: {max: 1, on: [failure]}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "report.png"))
    args = parser.parse_args()
    chromium = shutil.which("chromium") or sys.exit("chromium is not on PATH: apt-get install chromium")
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "code").mkdir()
        (work / "code" / "train.py").write_text("print('training')\n")
        (work / "train.yaml").write_text(SPEC)
        env = {**os.environ, "PODRUN_HOME": str(work / "home"), "PODRUN_RESTART_BACKOFF": "0.5"}
        podrun = [sys.executable, "-m", "podrun"]
        subprocess.run([*podrun, "exec", str(work / "train.yaml")], env=env, cwd=REPO, capture_output=True, check=True)
        report = subprocess.run([*podrun, "report"], env=env, cwd=REPO, capture_output=True, text=True, check=True)
        print(report.stdout, end="")
        page = re.search(r"^timeline: (\S+)$", report.stdout, re.MULTILINE)
        assert page, report.stdout
        subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                        f"--user-data-dir={work / 'chromium'}", "--window-size=1130,800",
                        f"--screenshot={args.out}", Path(page[1]).as_uri()], capture_output=True, check=True, timeout=120)
    print(f"screenshot: {args.out} ({os.path.getsize(args.out) // 1024} KB)")


if __name__ == "__main__":
    main()
