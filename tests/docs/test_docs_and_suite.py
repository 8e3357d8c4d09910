"""The docs and the suite tell the truth: docs/design.md names every module and only hooks that exist,
no source cites a document the repository does not ship, the README's test commands and the docs' cleanup
are what CI and the code do, test modules share helpers through tests/helpers.py rather than importing each
other, and a test whose facility (root and sshd, docker, gcloud) is missing is skipped in one line."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap

from podrun.commands.disk import JOB_FILES_KEPT_S
from podrun.remote.checkout import KEPT_VERSIONS
from podrun.targets.base import Target

from helpers import DOC_PAGES, REPO, documentation, documented_section, section

PACKAGE = REPO / "podrun"
DESIGN = (REPO / "docs" / "design.md").read_text()
README = (REPO / "README.md").read_text()


def owning_something(path) -> bool:
    """A module with code; a package's __init__.py that is only a docstring owns nothing."""
    body = ast.parse(path.read_text()).body
    return path.name != "__init__.py" or not all(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def test_design_md_names_every_module_under_podrun_and_no_other():
    modules = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py") if owning_something(path)}
    rows = set(re.findall(r"^\| `([\w/]+\.py)` \|", section(DESIGN, "## Where things live"), re.MULTILINE))
    assert sorted(modules - rows) == [], "modules docs/design.md's table does not name"
    assert sorted(rows - modules) == [], "rows of docs/design.md's table for modules that do not exist"


def test_design_md_names_only_target_and_capacity_hooks_that_exist():
    from podrun.capacity.base import Capacity

    hooks = section(DESIGN, "## Targets").split("To add a target")[0]
    named = {*re.findall(r"^- `(\w+)", hooks, re.MULTILINE), *re.findall(r"`(\w+)\(", hooks)}
    missing = [name for name in named
               if not (hasattr(Target, name) or name in Target.__annotations__ or hasattr(Capacity, name))]
    assert len(named) > 5 and sorted(missing) == []
    assert "nothing calls" not in DESIGN  # every hook it names is called (launch/lifecycle.py, launch/judgment.py)


def test_no_source_cites_a_guide_the_repository_does_not_ship():
    this_file = REPO / "tests" / "docs" / "test_docs_and_suite.py"
    sources = [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "scripts").glob("*.py"),
               REPO / "docs_hooks.py", *DOC_PAGES]
    citing = [f"{path.relative_to(REPO)}:{number}" for path in sources if path != this_file
              for number, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\bGUIDE\b", line)]
    assert citing == []


def test_test_modules_do_not_import_from_each_other():
    """What several test modules use lives in tests/helpers.py (or a lab or stand-in module beside it):
    importing a test module runs its module-level code and makes its helpers look like its own."""
    importing = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            importing += [f"{path.name}: {name}" for name in names if name.split(".")[0].startswith("test_")]
    assert importing == []


NEEDS_EVERY_FACILITY = """
import pytest

def test_on_the_lab(lab):
    pass

@pytest.mark.lab  # needs root without the lab fixture
def test_as_root():
    pass

def test_in_docker(docker):
    pass

@pytest.mark.gcloud
def test_with_gcloud():
    pass
"""


def run_pytest_without_tools(tmp_path, **env: str) -> subprocess.CompletedProcess:
    """pytest with the suite's conftest on a file of tests that need each facility, with no tool on PATH
    (no ip, sshd, docker or gcloud), and PODRUN_TESTS_REQUIRE_ALL only as `env` says (CI sets it)."""
    (tmp_path / "test_needs.py").write_text(textwrap.dedent(NEEDS_EVERY_FACILITY))
    (tmp_path / "bin").mkdir()
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "conftest", "-p", "no:cacheprovider",
         "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path / "test_needs.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**{name: value for name, value in os.environ.items() if name != "PODRUN_TESTS_REQUIRE_ALL"},
             "PATH": str(tmp_path / "bin"), "PYTHONPATH": str(REPO / "tests"), **env})


def test_a_missing_facility_skips_its_tests_in_one_line_each(tmp_path):
    result = run_pytest_without_tools(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    skipped = [re.fullmatch(r"SKIPPED \[(\d)\] \S*tests/conftest\.py:\d+: (\w+): (.*)", line)
               for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert all(skipped), result.stdout
    assert [match.groups() for match in skipped] == [
        ("2", "lab", "the lab needs root (network namespaces)" if os.geteuid() else
         "the lab needs ip: apt-get install iproute2 util-linux openssh-server openssh-client"),
        ("1", "docker", "dockerd needs root" if os.geteuid() else "the docker tests need docker: apt-get install docker.io"),
        ("1", "gcloud", "the gcloud CLI is not on PATH: https://cloud.google.com/sdk/docs/install")], result.stdout
    assert result.stdout.splitlines()[-1].startswith("4 skipped")


def test_where_every_facility_is_required_a_missing_one_fails_naming_it(tmp_path):
    result = run_pytest_without_tools(tmp_path, PODRUN_TESTS_REQUIRE_ALL="1")
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1].startswith("4 errors")
    assert "gcloud CLI is not on PATH: https://cloud.google.com/sdk/docs/install (.ci/run installs it)" in result.stdout


def test_the_readme_gives_the_test_tiers_and_ci_runs_its_full_command():
    commands = [line.split("#")[0].strip() for line in section(README, "## Quick start").splitlines()
                if "python -m pytest" in line]
    assert 'python -m pytest -q -m "not lab and not docker and not slow"' in commands
    ci_runs = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if "python -m pytest" in line]
    assert ci_runs and all(command in commands for command in ci_runs), (ci_runs, commands)


def test_the_docs_say_what_podrun_cleans_up_and_when():
    docs = documentation()
    assert f"podrun keeps the {KEPT_VERSIONS} most recently used code versions of a name" in docs
    assert f"finished jobs untouched for {JOB_FILES_KEPT_S // 86400} days" in docs
    assert "not cleaned up" not in docs


def test_the_jax_example_leaves_the_cpu_collectives_to_jaxs_default():
    """gloo has been JAX's default for cross-process CPU collectives since 0.5.1 (test_jax.py runs the
    example without setting it)."""
    assert "jax_cpu_collectives_implementation" not in (REPO / "examples" / "jax" / "psum.py").read_text()
    assert "gloo, JAX's default since 0.5.1" in " ".join(documented_section("JAX").split())
