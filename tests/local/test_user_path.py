"""scripts/user_path.py, CI's first step: it fails on a Python warning on podrun's stderr and names, in its last
line, the installed releases that differ from the lock (.ci/constraints.txt)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO

LOCK = REPO / ".ci" / "constraints.txt"
# a release that warns whenever Python starts with it installed, as a dependency's new release warns when podrun
# imports it
WARNS = {"sitecustomize.py": "import warnprobe\n",
         "warnprobe.py": "import warnings\nwarnings.warn('warnprobe 2.0 deprecates something', UserWarning)\n"}


def wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A real (tiny) wheel of `files`, for pip to install."""
    info = f"{name}-{version}.dist-info"
    contents = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: podrun-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    records = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
               f"{len(text.encode())}" for path, text in contents.items()]
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in contents.items():
            archive.writestr(member, text)
        archive.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")
    return path


def user_path(lock: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONWARNINGS", "PODRUN_HOME")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this virtualenv's podrun
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, str(REPO / "scripts" / "user_path.py"), "--lock", str(lock)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)


@pytest.mark.slow
def test_a_release_that_warns_fails_the_user_path_naming_it_and_both_its_versions(tmp_path):
    lock = tmp_path / "constraints.txt"
    lock.write_text(LOCK.read_text() + "warnprobe==1.0\n")  # the release last proven
    installed = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(installed),
                    str(wheel(tmp_path, "warnprobe", "2.0", WARNS))], check=True, capture_output=True, timeout=120)

    result = user_path(lock, pythonpath=installed)

    assert result.returncode == 1, result.stdout[-3000:]
    assert "a Python warning on stderr" in result.stdout
    assert "UserWarning: warnprobe 2.0 deprecates something" in result.stdout
    last = result.stdout.splitlines()[-1]
    assert last.startswith("user_path: ") and " problem(s); releases that differ from the lock " in last
    assert last.endswith(f"({lock}): warnprobe 2.0 (lock 1.0)"), last


@pytest.mark.slow
def test_the_user_path_passes_with_the_locks_releases():
    """This virtualenv holds the lock's releases (.ci/run installs the suite with it): no warning, no crash."""
    result = user_path(LOCK)
    assert result.returncode == 0, result.stdout[-3000:]
    assert result.stdout.splitlines()[-1].endswith("no crash, no warning, every exit code as expected")
