"""Reading a job file: YAML into a validated JobSpec, its `name` and `workdir` resolved.

Every problem becomes one SpecError line naming the file, the dotted field path and what is expected.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from podrun.errors import SpecError
from podrun.output import say
from podrun.spec.commands import check_command_size, refuse_python_under_torchrun
from podrun.spec.fields import yaml_kind
from podrun.spec.model import NAME_PATTERN, JobSpec
from podrun.spec.problems import FieldProblems, SpecProblems, field_path, validate_fields

SURROGATE = re.compile("[\ud800-\udfff]")
INT_TAG, FLOAT_TAG, MERGE_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:merge"
# a spec is a page of YAML: past this, reading and checking it would only cost time and memory
MAX_SPEC_BYTES = 1 << 20


def load_spec(path: str | Path) -> JobSpec:
    """Read, validate and resolve a job file: `name` defaults to the file's stem, `workdir` becomes absolute."""
    path = Path(path)
    try:
        with path.open("rb") as spec_file:
            raw = spec_file.read(MAX_SPEC_BYTES + 1)
        if len(raw) > MAX_SPEC_BYTES:
            raise SpecError(path, None, f"over {MAX_SPEC_BYTES // 1024} KiB, too large for a job spec; keep long "
                                        f"commands and data in files of the workdir")
        text = raw.decode()
    except FileNotFoundError:
        raise SpecError(path, None, "no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(path, None, f"cannot read: {error}") from None
    except ValueError:  # the only other error open() raises: a NUL byte in the name
        raise SpecError(repr(str(path)), None, "expected a file name, this one holds a NUL byte") from None
    try:
        data, duplicates = _parse_yaml(text)
        _refuse_unusable_text(path, data)
    except yaml.YAMLError as error:
        raise SpecError(path, None, _yaml_problem(error)) from None
    except RecursionError:  # YAML's reader and the checks recurse: thousands of nested [ or {
        raise SpecError(path, None, "nested too deeply to be a job spec") from None
    if not isinstance(data, dict):
        raise SpecError(path, None, f"expected a mapping of job fields (run, target, ...), got {yaml_kind(data)}")
    if data.get("name") is None:
        if not re.match(NAME_PATTERN, path.stem):
            raise SpecError(path, "name", f"the file's stem {path.stem!r} is not a valid job name; "
                                          f"set name: (letters, digits, . _ -)")
        data = {**data, "name": path.stem}
    try:
        spec = validate_fields(data)
    except FieldProblems as error:
        raise SpecProblems(path, duplicates + error.problems) from None
    if duplicates:
        raise SpecProblems(path, duplicates)
    if spec.torchrun:
        refuse_python_under_torchrun(path, spec.run)
    for field, command in (("run", spec.run), ("setup", spec.setup or "")):
        check_command_size(path, field, command)
    _refuse_lifecycle_without_a_tpu(path, spec)
    expanded = os.path.expanduser(spec.workdir)  # pathlib's would raise for ~user of no user
    if expanded.startswith("~"):
        raise SpecError(path, "workdir",
                        f"expected an existing directory, {_printable(spec.workdir)} is no user's home here")
    known_hosts = spec.ssh.known_hosts
    if known_hosts is not None and not os.path.isfile(os.path.expanduser(known_hosts)):
        raise SpecError(path, "ssh.known_hosts",
                        f"expected an existing known-hosts file, {_printable(known_hosts)} is not one")
    workdir = (path.parent / expanded).resolve()
    if not workdir.is_dir():
        raise SpecError(path, "workdir", f"expected an existing directory, {_printable(str(workdir))} is not one")
    resolved = spec.model_copy(update={"workdir": str(workdir)})
    resolved._path = path
    return resolved


def _parse_yaml(text: str) -> tuple[Any, list[tuple[str | None, str]]]:
    """The document as yaml.safe_load reads it, except that a number under `env` stays as it was
    written (YAML reads `3.10` as 3.1 and `0x1F` as 31, but a variable gets the text in the file); and
    each key given twice, a problem listed with the spec's others (PyYAML keeps the last one silently)."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        duplicates = list(_duplicate_keys(root, (), set())) if root is not None else []
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    if isinstance(root, yaml.MappingNode) and isinstance(data, dict) and isinstance(data.get("env"), dict):
        env_node = next((value for key, value in root.value if key.value == "env"), None)
        if isinstance(env_node, yaml.MappingNode):
            for key, value in env_node.value:
                if isinstance(value, yaml.ScalarNode) and value.tag in (INT_TAG, FLOAT_TAG):
                    data["env"][loader.construct_object(key)] = value.value
    return data, duplicates


def _duplicate_keys(node: yaml.Node, field: tuple[str, ...], seen: set[int]) -> Iterator[tuple[str | None, str]]:
    """(field path, problem) for each key given twice in one mapping; `seen` stops at an alias met again."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_lines: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            where = (*field, str(key.value))
            if isinstance(key, yaml.ScalarNode) and key.tag != MERGE_TAG:  # `<<: *defaults` may be overridden
                line, first = key.start_mark.line + 1, first_lines.get((key.tag, key.value))
                if first is None:
                    first_lines[key.tag, key.value] = line
                else:
                    lines = f"line {line}" if first == line else f"line {first} and line {line}"
                    yield field_path(where), f"given twice, on {lines}; keep one"
            yield from _duplicate_keys(value, where, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicate_keys(item, (*field, str(index)), seen)


def _refuse_lifecycle_without_a_tpu(path: Path, spec: JobSpec) -> None:
    declared = spec.target.declared
    if spec.delete_after != "never" and not declared.deletes:
        raise SpecError(path, "delete_after", f"{spec.delete_after} deletes the TPU VM the job ran on, but the "
                                              f"target is {spec.target.kind}: remove it")
    if spec.idle_delete_s is not None and not declared.recreates(spec.target.options):
        raise SpecError(path, "idle_delete", "deletes a TPU VM that podrun creates: it needs target.tpu.accelerator_type"
                        if declared.deletes else f"deletes a TPU VM that podrun creates, but the target is "
                                                 f"{spec.target.kind}: remove it")
    if spec.restarts and spec.restarts.exit_codes and "failure" not in spec.restart_on:
        raise SpecError(path, "restarts.exit_codes", "limits failure restarts, but restarts.on does not hold "
                                                     "failure: add it, or remove exit_codes")
    if spec.restarts and "preemption" in spec.restart_on and not declared.deletes:  # one spec for every target
        say(f"{path}: restarts.on: preemption: nothing of a {spec.target.kind} target is preempted; the rest of "
            f"restarts.on holds")
    elif spec.restarts and "preemption" in spec.restart_on and not declared.recreates(spec.target.options):
        raise SpecError(path, "restarts.on", f"{_preemption_restarts(spec)}; `on: [failure]` restarts failures")
    if spec.restarts and "time_limit" in spec.restart_on and not declared.time_limited:
        raise SpecError(path, "restarts.on", f"time_limit continues a Slurm job on a new allocation, but the target "
                                             f"is {spec.target.kind}: remove it")


def _preemption_restarts(spec: JobSpec) -> str:
    """Why a target that cannot be made again cannot restart on preemption (restarts.on, given or not)."""
    given = spec.restarts is not None and spec.restarts.on is not None
    return (f"{'' if given else f'on a {spec.target.kind} target, restarts default to '}preemption restarts, which "
            f"create the TPU VM again, so they need target.tpu.accelerator_type")


def _refuse_unusable_text(path: Path, data: Any, field: tuple[str, ...] = ()) -> None:
    """No field may hold a NUL byte or a lone surrogate (YAML's "\\0" or "\\ud800"): neither can be
    a path, a command or an environment value, and each would end in a traceback further on."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        where = (*field, str(key))
        if isinstance(key, str) and not _usable(key):
            raise SpecError(path, field_path(field), f"a key holds {_unusable_kind(key)}: {key!r}")
        if isinstance(value, str) and not _usable(value):
            raise SpecError(path, field_path(where), f"holds {_unusable_kind(value)}, which no path, command or "
                                                     f"variable can")
        _refuse_unusable_text(path, value, where)


def _printable(text: str) -> str:
    """text, or its repr when it holds a control character (which could end the message's line)."""
    return text if text.isprintable() else repr(text)


def _usable(text: str) -> bool:
    return "\0" not in text and not SURROGATE.search(text)


def _unusable_kind(text: str) -> str:
    return "a NUL byte" if "\0" in text else "a lone surrogate character"


def _yaml_problem(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.reader.ReaderError):  # a character YAML does not allow, before any parsing
        return f"byte {error.position + 1}: not valid YAML: character {error.character!r} is not allowed in YAML"
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return f"{where}not valid YAML: {problem}"

