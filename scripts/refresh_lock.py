"""Write the lock the suite runs against: .ci/constraints.txt, the exact version of every package that
.ci/suite-packages.txt and .ci/suite-packages-built-here.txt bring, as pip resolves them today in a new
virtualenv (the second with --no-build-isolation, as .ci/run installs it).

    python scripts/refresh_lock.py          # then run the suite against it, and commit both

`pip freeze` of a clean virtualenv, not pip-compile or uv: what it writes is what was installed and then
proven by the suite, torch's local CPU build (`+cpu`, from a file on these machines, which uv does not
look at) included, and it needs nothing that the machine's pip does not already have.
"""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / ".ci" / "constraints.txt"
PACKAGES = REPO / ".ci" / "suite-packages.txt"
BUILT_HERE = REPO / ".ci" / "suite-packages-built-here.txt"  # sdists whose build imports the suite's torch


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="podrun-lock-") as scratch:
        venv = Path(scratch) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        subprocess.run([*pip, "install", "-q", "--no-cache-dir", "-r", str(PACKAGES)], check=True, cwd=REPO)
        subprocess.run([*pip, "install", "-q", "--no-cache-dir", "--no-build-isolation", "-r", str(BUILT_HERE)],
                       check=True, cwd=REPO)
        frozen = subprocess.run([*pip, "freeze", "--exclude", "podrun"], check=True, capture_output=True, text=True,
                                cwd=REPO).stdout
    pins = sorted((line for line in frozen.splitlines() if "==" in line), key=str.lower)
    header = (f"# The lock: every package of .ci/suite-packages.txt at the version last proven by the suite.\n"
              f"# Written by scripts/refresh_lock.py on {datetime.date.today()}, Python {platform.python_version()}"
              f" on {platform.machine()}; .ci/run installs with it (docs/testing.md, the lock).\n")
    LOCK.write_text(header + "\n".join(pins) + "\n")
    print(f"refresh_lock: {len(pins)} packages in {LOCK.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
