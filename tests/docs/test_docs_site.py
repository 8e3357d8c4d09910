"""The documentation site builds as CI builds it, `mkdocs build --strict`: no broken link or anchor, and
the references it generates from the code (the command line from the parser, the spec from its schema)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from podrun.cli import build_parser

from helpers import REPO


@pytest.mark.mkdocs
def test_the_site_builds_strict_with_every_command_and_spec_field(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)], cwd=REPO,
        capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr
    cli = (tmp_path / "reference" / "cli" / "index.html").read_text()
    _, every_command = build_parser([])
    assert all(f"usage: podrun {name}" in cli for name in every_command), "a command without its --help"
    spec = (tmp_path / "reference" / "spec" / "index.html").read_text()
    assert "<code>stop_grace</code>" in spec and "<code>proxy_jump</code>" in spec
    assert 'id="quick-start"' in (tmp_path / "index.html").read_text()  # the README is the front page
