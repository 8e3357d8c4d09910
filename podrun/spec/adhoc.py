"""Targets named on the command line: `exec`, `ssh` and `cp` with a kind's flag (--tpu, --hosts,
--local: target_kinds/<kind>.py declares it) instead of a spec file. They become a JobSpec like a
file's, so an ad-hoc job gets what a spec's job gets (prefixes, logs, a job record, fail-fast, a
clean stop); what is wrong is named by its flag.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podrun.errors import UsageError
from podrun.spec.loading import load_spec
from podrun.spec.model import NAME_PATTERN, JobSpec
from podrun.spec.problems import FieldProblems, validate_fields
from podrun.target_kinds import registry
from podrun.target_kinds.kind import AdhocFlag, TargetKind

ADHOC_NAME = "exec"  # an ad-hoc job's name, unless its --workdir names it
COMMAND_LINE = Path("command line")  # what an ad-hoc spec's messages name as its file
SSH_FLAGS = {"user": "--user", "identity_file": "--identity-file"}  # the spec's `ssh:` fields, for kinds that use SSH


@dataclass(frozen=True)
class TargetFlags:
    """The command line's target: each kind's flags (target_kinds/<kind>.py), by dest, None where not given."""

    values: Mapping[str, Any]

    @classmethod
    def from_args(cls, args: Any) -> TargetFlags:
        dests = [flag.dest for declared in registry.kinds() for flag in _flags(declared)] + list(SSH_FLAGS)
        return cls({dest: getattr(args, dest) for dest in dests})

    @property
    def given(self) -> bool:
        return any(self.values[declared.flag.dest] is not None for declared in registry.kinds())

    def refuse_with_a_spec(self, spec_path: str) -> None:
        for_specs = {flag.dest for declared in registry.kinds() for flag in declared.extra_flags if flag.spec_field}
        named = [f"--{dest.replace('_', '-')}" for dest, value in self.values.items()
                 if value is not None and dest not in for_specs]
        if named:
            raise UsageError(f"{spec_path}: a spec names its own target; drop {', '.join(named)} or the spec")

    def applied_to(self, spec: JobSpec, spec_path: str) -> JobSpec:
        """The spec with what its kind's flags set in a spec too (`--tunnel-through-iap`: target.tpu.iap)."""
        for declared in registry.kinds():
            for flag in declared.extra_flags:
                if flag.spec_field is None or self.values[flag.dest] is None:
                    continue
                if spec.target.kind != declared.name:
                    raise UsageError(f"{flag.name}: goes with a {declared.name} target, and {spec_path} names a "
                                     f"{spec.target.kind} target")
                setattr(spec.target.options, flag.spec_field, self.values[flag.dest])
        return spec

    def target(self) -> dict:
        """The spec's `target` and `ssh` fields."""
        chosen = [declared for declared in registry.kinds() if self.values[declared.flag.dest] is not None]
        if len(chosen) > 1:
            raise UsageError(f"{' and '.join(declared.flag.name for declared in chosen)}: expected one target")
        declared = chosen[0]
        for other in registry.kinds():
            for flag in other.extra_flags:
                if other is not declared and self.values[flag.dest] is not None and flag not in declared.extra_flags:
                    raise UsageError(f"{flag.name}: goes with {other.flag.name}")
        ssh = {key: self.values[key] for key in SSH_FLAGS if self.values[key]}
        if ssh and not declared.uses_ssh:
            raise UsageError(f"{SSH_FLAGS[next(iter(ssh))]}: goes with "
                             f"{either([kind.flag.name for kind in registry.kinds() if kind.uses_ssh])}")
        extras = {flag.dest: self.values[flag.dest] for flag in declared.extra_flags}
        options = declared.to_options(self.values[declared.flag.dest], extras)
        return {"target": {declared.name: options, **declared.to_siblings(extras)},
                **({"ssh": ssh} if declared.uses_ssh else {})}


def target_flags_text() -> str:
    """Every kind's flag, for messages: `--tpu, --hosts or --local`."""
    return either([declared.flag.name for declared in registry.kinds()])


def either(choices: list[str]) -> str:
    return ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]


def _flags(declared: TargetKind) -> tuple[AdhocFlag, ...]:
    return (declared.flag, *declared.extra_flags)


def _flag_of_field(field: str | None) -> str | None:
    """The flag that set an ad-hoc spec's field, for its errors: `target.hosts.1` -> --hosts."""
    parts = (field or "").split(".")
    if parts[0] == "target" and len(parts) > 1:  # the kind's flag, or the extra flag that set the field (--time)
        declared = registry.kind(parts[1])
        extra = next((flag for flag in declared.extra_flags if parts[2:3] == [flag.dest]), None)
        return (extra or declared.flag).name
    if parts[0] == "ssh" and len(parts) > 1 and parts[1] in SSH_FLAGS:
        return SSH_FLAGS[parts[1]]
    return field


def job_spec(spec_path: str | None, flags: TargetFlags, command: list[str], workdir: str | None = None) -> JobSpec:
    """The job `exec` runs: the spec file's, or CMD on the target the flags name."""
    if spec_path is not None:
        flags.refuse_with_a_spec(spec_path)
        if command:
            raise UsageError(f"{spec_path}: the spec says what runs; `-- CMD` goes with {target_flags_text()}")
        if workdir is not None:
            raise UsageError(f"--workdir: goes with {target_flags_text()} (a spec has workdir:)")
        return flags.applied_to(load_spec(spec_path), spec_path)
    if not flags.given:
        raise UsageError(f"expected a job spec (JOB.yaml), or a target ({target_flags_text()}) and -- CMD")
    if not command:
        raise UsageError("expected -- CMD after the target: the command to run on every worker")
    fields = {"name": _name(workdir), "run": command_line(command), **flags.target()}
    if workdir is not None:
        fields["workdir"] = _directory(workdir)
    return _validated(fields)


def target_spec(spec_path: str | None, flags: TargetFlags) -> JobSpec:
    """Where `ssh` and `cp` go: the spec file's target, or the one the flags name."""
    if spec_path is not None:
        flags.refuse_with_a_spec(spec_path)
        return flags.applied_to(load_spec(spec_path), spec_path)
    if not flags.given:
        raise UsageError(f"expected a job spec (JOB.yaml) or a target: {target_flags_text()}")
    return _validated({"name": ADHOC_NAME, "run": "true", **flags.target()})


def command_line(command: list[str]) -> str:
    """`-- CMD ...` as the shell line it runs: one argument is a line as written (`-- 'make && ./a'`),
    several are words, each quoted (`-- python3 -c 'print(1)'` keeps its quotes, unlike ssh's join)."""
    return command[0] if len(command) == 1 else shlex.join(command)


def _name(workdir: str | None) -> str:
    """The workdir's name, which keeps each project's run directory its own; else "exec"."""
    name = os.path.basename(os.path.abspath(workdir)) if workdir is not None else ""
    return name if re.match(NAME_PATTERN, name) else ADHOC_NAME


def _directory(workdir: str) -> str:
    path = Path(os.path.expanduser(workdir)).resolve()
    if not path.is_dir():
        raise UsageError(f"--workdir {workdir}: expected an existing directory")
    return str(path)


def _validated(fields: dict) -> JobSpec:
    try:
        spec = validate_fields(fields)
    except FieldProblems as error:
        field, expected = error.problems[0]
        raise UsageError(f"{_flag_of_field(field)}: {expected}") from None
    spec._path = COMMAND_LINE
    return spec
