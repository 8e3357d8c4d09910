"""A library's warnings stay off the user's terminal (podrun/third_party.py), a user who asks for warnings
gets them, and the warnings of anything else still show."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from helpers import REPO, job_id_in, podrun

LIBRARY = """
import warnings
warnings.warn("fakelib is deprecated on import", FutureWarning)
warnings.warn("fakelib says something else", UserWarning)
"""
USES_LIBRARY = """
import warnings
from podrun.third_party import ignore_warnings_of
ignore_warnings_of("fakelib", FutureWarning)
import fakelib, fakelib_extra
warnings.warn("the caller's own", FutureWarning)
"""


def python(code: str, *options: str, path: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path) if path else "", str(REPO)]))
    return subprocess.run([sys.executable, *options, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**environment, **env})


@pytest.fixture
def libraries(tmp_path: Path) -> Path:
    for name in ("fakelib", "fakelib_extra"):  # the second only shares the first's name as a prefix
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(LIBRARY.replace("fakelib", name))
    return tmp_path


def test_a_librarys_warning_of_that_category_is_ignored_and_nothing_else(libraries):
    stderr = python(USES_LIBRARY, path=libraries).stderr
    assert "fakelib is deprecated on import" not in stderr
    assert "fakelib says something else" in stderr  # another category of the same library
    assert "fakelib_extra is deprecated on import" in stderr  # another library
    assert "the caller's own" in stderr


@pytest.mark.parametrize("asks", [("-W", "default"), ("-X", "dev"), ("PYTHONWARNINGS", "always")])
def test_a_user_who_asks_for_warnings_gets_the_librarys(libraries, asks):
    option, value = asks
    if option == "PYTHONWARNINGS":
        result = python(USES_LIBRARY, path=libraries, PYTHONWARNINGS=value)
    else:
        result = python(USES_LIBRARY, option, value, path=libraries)
    assert "fakelib is deprecated on import" in result.stderr


def test_google_api_cores_python_version_warning_is_ignored_once_podrun_loads_the_cloud_client():
    """Google's own check, on the day it finds this Python unserved (3.10 from 2026-10-11): FutureWarning."""
    check = ("import datetime; import podrun.cloud.tpu_api; from google.api_core import check_python_version; "
             "check_python_version('google.cloud.tpu_v2', today=datetime.date(2099, 1, 1))")
    assert python(check).stderr == ""
    assert "FutureWarning" in python(check, PYTHONWARNINGS="default").stderr


def test_exec_on_an_unreachable_host_prints_podruns_lines_and_no_others(home):
    """asyncssh loads (and with cryptography 51, warns about DSA ten times) before the connection is refused:
    the user reads podrun's two lines. A user who asks for warnings reads what `import asyncssh` warns."""
    quiet = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}
    result = podrun("exec", "--hosts", "127.0.0.9", "--", "true", env=quiet)
    job_id = job_id_in(result.stderr)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"podrun: job {job_id}: 1 SSH host; logs in {home}/jobs/{job_id}",
        "podrun: error: 127.0.0.9: cannot connect: Connection refused"]
    asyncssh_warns = python("import asyncssh", "-W", "always").stderr
    asked = podrun("exec", "--hosts", "127.0.0.9", "--", "true", env={**os.environ, "PYTHONWARNINGS": "always"})
    assert asyncssh_warns in asked.stderr


def test_a_warning_from_podruns_own_code_fails_the_test_that_meets_it():
    """pyproject.toml's filterwarnings: podrun's own warnings are errors in the suite, a library's are not."""
    with pytest.raises(UserWarning):
        warnings.warn_explicit("podrun's own", UserWarning, "podrun/launch/launcher.py", 1, module="podrun.launch.launcher")
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn_explicit("a library's", UserWarning, "asyncssh/misc.py", 1, module="asyncssh.misc")
    assert [str(warning.message) for warning in caught] == ["a library's"]
