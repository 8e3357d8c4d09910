"""The everyday commands stay light: no torch, cloud client, SSH library, or even the spec parser."""

from __future__ import annotations

import pytest

from helpers import modules_imported_by

# the first five are never imported by exec either; the rest cost `podrun jobs` ~27 ms together
HEAVY = ("torch", "google", "paramiko", "asyncssh", "fabric", "pydantic", "yaml", "pathspec",
         "dataclasses", "inspect", "typing", "datetime", "pathlib", "shutil", "signal")


@pytest.mark.parametrize("args", [["--help"], ["jobs"], ["logs"], ["jobs", "--json"]])
def test_everyday_commands_import_nothing_heavy(home, args):
    assert modules_imported_by(args, HEAVY) == []


def test_exec_never_imports_torch_or_ssh_libraries(home, job_file):
    spec = job_file("run: echo hi")
    assert modules_imported_by(["exec", spec], HEAVY[:5]) == []
