"""Targets named on the command line: `exec`, `ssh` and `cp` with --tpu, --hosts or --local instead
of a spec file. They become a JobSpec like a file's, so an ad-hoc job gets what a spec's job gets
(prefixes, logs, a job record, fail-fast, a clean stop); what is wrong is named by its flag.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from podrun.errors import UsageError
from podrun.spec import NAME_PATTERN, FieldProblems, JobSpec, load_spec, validate_fields

ADHOC_NAME = "exec"  # an ad-hoc job's name, unless its --workdir names it
COMMAND_LINE = Path("command line")  # what an ad-hoc spec's messages name as its file
# the flag that sets each field of an ad-hoc spec, for its errors
FLAG_OF_FIELD = {"target.tpu": "--tpu", "target.hosts": "--hosts", "target.local": "--local",
                 "ssh.user": "--user", "ssh.identity_file": "--identity-file"}


@dataclass(frozen=True)
class TargetFlags:
    tpu: str | None = None  # a name, or names joined by commas (slices created separately)
    hosts: str | None = None  # comma-separated entries as target.hosts takes them
    local: int | None = None
    zone: str | None = None
    project: str | None = None
    user: str | None = None
    identity_file: str | None = None

    @property
    def given(self) -> bool:
        return self.tpu is not None or self.hosts is not None or self.local is not None

    def refuse_with_a_spec(self, spec_path: str) -> None:
        named = [f"--{name.replace('_', '-')}" for name, value in vars(self).items() if value is not None]
        if named:
            raise UsageError(f"{spec_path}: a spec names its own target; drop {', '.join(named)} or the spec")

    def target(self) -> dict:
        """The spec's `target` and `ssh` fields."""
        named = [flag for flag, value in (("--tpu", self.tpu), ("--hosts", self.hosts), ("--local", self.local))
                 if value is not None]
        if len(named) > 1:
            raise UsageError(f"{' and '.join(named)}: expected one target")
        if (self.zone or self.project) and self.tpu is None:
            raise UsageError(f"{'--zone' if self.zone else '--project'}: goes with --tpu")
        if (self.user or self.identity_file) and self.local is not None:
            raise UsageError(f"{'--user' if self.user else '--identity-file'}: goes with --tpu or --hosts")
        ssh = {key: value for key, value in (("user", self.user), ("identity_file", self.identity_file)) if value}
        if self.tpu is not None:
            names = self.tpu.split(",")
            where = {"zone": self.zone, "project": self.project}
            tpu = {"names": names} if len(names) > 1 else {"name": self.tpu}
            return {"target": {"tpu": {**tpu, **{key: value for key, value in where.items() if value}}}, "ssh": ssh}
        if self.hosts is not None:
            return {"target": {"hosts": [host.strip() for host in self.hosts.split(",")]}, "ssh": ssh}
        return {"target": {"local": {"workers": self.local}}}


def job_spec(spec_path: str | None, flags: TargetFlags, command: list[str], workdir: str | None = None) -> JobSpec:
    """The job `exec` runs: the spec file's, or CMD on the target the flags name."""
    if spec_path is not None:
        flags.refuse_with_a_spec(spec_path)
        if command:
            raise UsageError(f"{spec_path}: the spec says what runs; `-- CMD` goes with --tpu, --hosts or --local")
        if workdir is not None:
            raise UsageError("--workdir: goes with --tpu, --hosts or --local (a spec has workdir:)")
        return load_spec(spec_path)
    if not flags.given:
        raise UsageError("expected a job spec (JOB.yaml), or a target (--tpu, --hosts or --local) and -- CMD")
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
        return load_spec(spec_path)
    if not flags.given:
        raise UsageError("expected a job spec (JOB.yaml) or a target: --tpu, --hosts or --local")
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
        flag = next((flag for prefix, flag in FLAG_OF_FIELD.items() if (field or "").startswith(prefix)), field)
        raise UsageError(f"{flag}: {expected}") from None
    spec._path = COMMAND_LINE
    return spec
