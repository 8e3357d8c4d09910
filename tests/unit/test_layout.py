"""The package's shape, checked: no import cycle anywhere in podrun/, no import of a module on a higher
layer, no module over 450 lines, what is particular to one kind of target stays in podrun/targets/ (the
spec's schema and the CLI name the kinds too), and where a job lives is read in podrun/handles/ alone."""

from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from podrun import jobstore
from podrun.target_kinds import registry

PACKAGE = Path(__file__).resolve().parents[2] / "podrun"
TARGET_KINDS = set(registry.names())
# where a target's kind may be named: the targets themselves; the Cloud TPU API's own code (gcloud's
# `api_endpoint_overrides/tpu`); the transports' endpoint kinds (transport/, read back by transport_for),
# which name a transport, not a target
ALLOWED = {"targets", "target_kinds", "capacity", "cloud", "transport"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(path: Path) -> set[str]:
    """The podrun modules a module imports, at its top or inside functions (`from podrun.launch import
    detached`: podrun.launch.detached; `from podrun.transport import transport_for`: podrun.transport)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                         for alias in node.names)
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


# podrun's layers, bottom to top (docs/design.md, "Layers"): a module imports from its own layer and the
# ones below, never from one above, inside a function included. A module is on the layer of the longest
# pattern it matches.
LAYERS = {
    "base": ("podrun", "podrun.errors", "podrun.exits", "podrun.paths", "podrun.escapes", "podrun.output",
             "podrun.collapse", "podrun.interrupts", "podrun.file_limit", "podrun.timeline", "podrun.terminal",
             "podrun.worker_output", "podrun.countdown", "podrun.third_party", "podrun.settings",
             "podrun.stop_noise"),
    # Google's API and its accelerator types: nothing of the spec's; the tpu kind's options use it
    "cloud": ("podrun.cloud", "podrun.cloud.*"),
    # the spec, the kinds it assembles its target: from, and a spec made of flags (adhoc)
    "spec": ("podrun.spec", "podrun.spec.*", "podrun.target_kinds", "podrun.target_kinds.*"),
    "reach": ("podrun.remote", "podrun.remote.*", "podrun.transport", "podrun.transport.*"),
    # what the workers run on: made, lost, given back (the targets reach the workers on it)
    "capacity": ("podrun.capacity", "podrun.capacity.*"),
    "targets": ("podrun.targets", "podrun.targets.*"),
    "jobstore": ("podrun.jobstore", "podrun.progress", "podrun.notify", "podrun.owners"),
    # below the plan: it ships to targets' Workers, and its digest cache saves through jobstore.write_json
    "shipping": ("podrun.shipping", "podrun.shipping.*"),
    "plan": ("podrun.plan",),
    "launch": ("podrun.launch", "podrun.launch.*"),
    "supervisor": ("podrun.supervisor", "podrun.supervisor.*"),
    "handles": ("podrun.handles", "podrun.handles.*"),  # a job's handle: where it lives, decided once
    "report": ("podrun.report", "podrun.report.*"),
    "commands": ("podrun.commands", "podrun.commands.*"),
    "cli": ("podrun.cli", "podrun.cli_arguments", "podrun.__main__"),
}
LAYER_NAMES = list(LAYERS)


def layer_of(name: str) -> int | None:
    matches = [(len(pattern), index) for index, patterns in enumerate(LAYERS.values())
               for pattern in patterns if fnmatchcase(name, pattern)]
    return max(matches)[1] if matches else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{name} ({LAYER_NAMES[layer_of(name)]}) imports {imported} ({LAYER_NAMES[layer_of(imported)]})"
            for name in sorted(graph) for imported in sorted(graph[name])
            if layer_of(imported) > layer_of(name)]  # type: ignore[operator]


def test_every_module_is_on_a_layer():
    assert sorted(name for name in MODULES if layer_of(name) is None) == []


def test_no_module_imports_one_on_a_higher_layer():
    assert upward_imports({name: imports_of(path) for name, path in MODULES.items()}) == []


def test_the_layer_check_sees_an_upward_import(tmp_path, monkeypatch):
    (tmp_path / "plan.py").write_text("from podrun import output\nfrom podrun.shipping import scan\n\n\n"
                                      "def later():\n    from podrun.commands import exec\n")
    monkeypatch.setitem(MODULES, "podrun.plan", tmp_path / "plan.py")
    assert upward_imports({"podrun.plan": imports_of(MODULES["podrun.plan"])}) == [
        "podrun.plan (plan) imports podrun.commands.exec (commands)"]


LINE_LIMIT = 450
SOURCES = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("source", SOURCES)
def test_no_module_is_over_450_lines(source):
    lines = len((PACKAGE / source).read_text().splitlines())
    assert lines <= LINE_LIMIT, f"{source}: {lines} lines"


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


def options_read_outside_targets(tree: ast.AST) -> list[int]:
    """The lines that read a kind's options (`spec.target.tpu`, `target.options.name`) in a module."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and ((node.value.attr == "target" and node.attr in TARGET_KINDS) or node.value.attr == "options")]


def test_only_the_targets_read_a_kinds_options():
    """Outside targets/, code asks the kind's declaration (`spec.target.declared.deletes`), never its options."""
    read = [f"{path.relative_to(PACKAGE)}:{line}" for path in PACKAGE.rglob("*.py")
            if path.relative_to(PACKAGE).parts[0] not in ("targets", "target_kinds", "capacity")
            for line in options_read_outside_targets(ast.parse(path.read_text()))]
    assert read == []


def test_the_options_check_sees_a_read():
    assert options_read_outside_targets(ast.parse("if spec.target.tpu and x.target.options.name: pass")) == [1, 1]
    assert options_read_outside_targets(ast.parse("declared.summary(spec.target.options)")) == []


# where a job lives: the record's fields (jobstore.RESIDENCE) and its own answers about them
RESIDENCE = {*jobstore.RESIDENCE, "supervised", "supervisor_lost"}
# names that hold something else with a field so named: the spec and the CLI's options (`supervisor:`,
# `--supervisor`), a step's result (`detached`), the launch's endings (`endings.detached`, a launch that ends
# with its job detached)
NOT_RECORDS = {"spec", "options", "args", "result", "endings"}


def residence_read(tree: ast.AST) -> list[int]:
    """The lines that read where a job lives (`record.supervised_by`, `record.supervised()`) in a module."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in RESIDENCE and isinstance(node.ctx, ast.Load)
            and not (isinstance(node.value, ast.Name) and node.value.id in NOT_RECORDS)]


def test_only_the_handles_read_where_a_job_lives():
    """Outside handles/ (and jobstore.py, which keeps it), code asks the job's handle (handles.handle_for),
    never the record; setting where a job lives is the launch's and the supervisor's, and reads nothing."""
    read = [f"{path.relative_to(PACKAGE)}:{line}" for path in PACKAGE.rglob("*.py")
            if path.relative_to(PACKAGE).parts[0] != "handles" and path.relative_to(PACKAGE).as_posix() != "jobstore.py"
            for line in residence_read(ast.parse(path.read_text()))]
    assert read == []


def test_the_residence_check_sees_a_read():
    assert residence_read(ast.parse("if record.supervised_by or r.supervised() or self.record.launcher['pid']: pass")) \
        == [1, 1, 1]
    assert residence_read(ast.parse("record.detached = True\nif spec.supervisor or result.detached: pass")) == []


REMOTE = sorted(name for name in MODULES if name.startswith("podrun.remote."))


# the worker-side scripts that run in the job's own python3 and use its libraries (launch/health.py)
JOBS_OWN_LIBRARIES = {"podrun.remote.health_network": {"torch"}}


def test_worker_side_modules_use_the_standard_library_only():
    """They run on the workers' own python3, where nothing but the standard library is installed
    (framing.py travels with the scripts that import it), but for those run with the job's libraries."""
    import sys

    foreign = []
    for name in REMOTE:
        for node in ast.walk(ast.parse(MODULES[name].read_text())):
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                       else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            foreign += [f"{name}: {module}" for module in modules
                        if module.split(".")[0] not in sys.stdlib_module_names and module != "podrun.remote"
                        and module.split(".")[0] not in JOBS_OWN_LIBRARIES.get(name, ())]
    assert foreign == []


def test_worker_side_modules_do_nothing_when_imported():
    import subprocess
    import sys

    imports = "; ".join(f"import {name}" for name in REMOTE)
    result = subprocess.run([sys.executable, "-c", imports], stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=30, cwd=PACKAGE.parent)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


TESTS = PACKAGE.parent / "tests"
# the suite's areas, one folder each: what a test needs of the machine and what it is about
TEST_AREAS = {"unit", "local", "ssh", "tpu", "slurm", "supervisor", "hostile", "docs"}


def test_every_test_module_sits_in_its_areas_folder():
    placed = {path.relative_to(TESTS).parts[0] for path in TESTS.rglob("test_*.py")}
    assert sorted(placed - TEST_AREAS) == [], "test modules outside the area folders"
    assert sorted(TEST_AREAS - placed) == [], "area folders without tests"


def test_conftest_holds_fixtures_and_hooks_only():
    """What test modules share is in helpers.py; conftest.py, which pytest loads itself, only provides."""
    functions = [node for node in ast.parse((TESTS / "conftest.py").read_text()).body
                 if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    other = [node.name for node in functions
             if not node.name.startswith(("pytest_", "_"))  # a hook, or a part of the fixtures' own
             and not any("fixture" in ast.unparse(decorator) for decorator in getattr(node, "decorator_list", []))]
    assert other == [] and len(functions) > 5
