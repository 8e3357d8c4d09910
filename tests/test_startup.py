"""The everyday commands stay light: no torch, cloud client, SSH library, or even the spec parser."""

from __future__ import annotations

import subprocess
import sys

import pytest

# the first five are never imported by exec either; the rest cost `podrun jobs` ~27 ms together
HEAVY = ("torch", "google", "paramiko", "asyncssh", "fabric", "pydantic", "yaml", "pathspec",
         "dataclasses", "inspect", "typing", "datetime", "pathlib", "shutil", "signal")
PROBE = """
import sys
sys.argv = ["podrun", *{args!r}]
from podrun.cli import main
try:
    main()
except SystemExit:
    pass
heavy = sorted(name for name in sys.modules if name.split(".")[0] in {heavy!r})
print("HEAVY", heavy, file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--help"], ["jobs"], ["logs"], ["jobs", "--json"]])
def test_everyday_commands_import_nothing_heavy(home, args):
    probe = subprocess.run([sys.executable, "-c", PROBE.format(args=args, heavy=HEAVY)],
                           capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in probe.stderr, probe.stderr


def test_exec_never_imports_torch_or_ssh_libraries(home, job_file):
    spec = job_file("run: echo hi")
    probe = subprocess.run([sys.executable, "-c", PROBE.format(args=["exec", str(spec)], heavy=HEAVY[:5])],
                           capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in probe.stderr, probe.stderr
