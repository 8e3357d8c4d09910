"""The package's shape, checked: no import cycle anywhere in podrun/, and what is particular to one
kind of target stays in podrun/targets/ (the spec's schema and the CLI name the kinds too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "podrun"
TARGET_KINDS = {"tpu", "hosts", "local"}
# where a target's kind may be named: the targets themselves, the spec's schema, the CLI and the
# spec it builds from its target flags (adhoc.py); the Cloud TPU API's own code (gcloud's
# `api_endpoint_overrides/tpu`); the local transport's endpoint kind (transport/local.py, read back by
# transport_for), which names a transport, not a target
ALLOWED = {"targets", "spec.py", "cli.py", "adhoc.py", "cloud", "transport/local.py", "transport/__init__.py"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(path: Path) -> set[str]:
    """The podrun modules a module imports, at its top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in MODULES}


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    cycles = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        for imported in sorted(graph[name]):
            if imported in trail:
                cycles.append(" -> ".join([*trail[trail.index(imported):], imported]))
            elif imported not in done:
                visit(imported, [*trail, imported])
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    return cycles


def test_no_import_cycle_in_podrun():
    assert find_cycles({name: imports_of(path) - {name} for name, path in MODULES.items()}) == []


def test_the_cycle_check_sees_a_cycle(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("from podrun import b\n")
    (tmp_path / "b.py").write_text("import podrun.a\n")
    monkeypatch.setitem(MODULES, "podrun.a", tmp_path / "a.py")
    monkeypatch.setitem(MODULES, "podrun.b", tmp_path / "b.py")
    graph = {name: imports_of(MODULES[name]) - {"podrun"} for name in ("podrun.a", "podrun.b")}
    assert find_cycles(graph) == ["podrun.a -> podrun.b -> podrun.a"]


def test_target_kinds_are_named_only_by_the_targets_the_spec_and_the_cli():
    named = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.split("/")[0] in ALLOWED or relative in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in TARGET_KINDS:
                named.append(f"{relative}:{node.lineno}: {node.value!r}")
    assert named == []


REMOTE = sorted(name for name in MODULES if name.startswith("podrun.remote."))


def test_worker_side_modules_use_the_standard_library_only():
    """They run on the workers' own python3, where nothing but the standard library is installed
    (framing.py travels with the scripts that import it)."""
    import sys

    foreign = []
    for name in REMOTE:
        for node in ast.walk(ast.parse(MODULES[name].read_text())):
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                       else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            foreign += [f"{name}: {module}" for module in modules
                        if module.split(".")[0] not in sys.stdlib_module_names and module != "podrun.remote"]
    assert foreign == []


def test_worker_side_modules_do_nothing_when_imported():
    import subprocess
    import sys

    imports = "; ".join(f"import {name}" for name in REMOTE)
    result = subprocess.run([sys.executable, "-c", imports], stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=30, cwd=PACKAGE.parent)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
