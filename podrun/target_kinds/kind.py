"""What a kind of target declares about itself (each target_kinds/<kind>.py has one `KIND`): the
options a spec gives it, the flags that name it on the command line, and what it can do. The spec,
its JSON Schema, its error messages, the CLI's ad-hoc flags and the questions the rest of podrun asks
of a target are all assembled from these declarations (target_kinds/registry.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AdhocFlag:
    """A command-line flag of `exec`, `ssh` and `cp` (argparse's add_argument, with its dest from the name)."""

    name: str  # "--slurm"
    metavar: str  # "": a switch, which takes no value (True when given)
    help: str
    type: Callable[[str], Any] | None = None
    # the kind's option it sets, with a spec too (`exec job.yaml --tunnel-through-iap`); None: ad-hoc targets only
    spec_field: str | None = None

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def add_to(self, group: argparse._ArgumentGroup) -> None:
        if not self.metavar:
            group.add_argument(self.name, action="store_const", const=True, help=self.help)
        else:
            group.add_argument(self.name, metavar=self.metavar, help=self.help, type=self.type or str)


def whole_number(text: str) -> int:
    """A flag's value that counts something (argparse's type)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


@dataclass(frozen=True)
class TargetKind:
    name: str  # its key under `target:`
    annotation: Any  # the options' type: a pydantic model, or e.g. a list of host entries
    description: str
    implementation: str  # "module:Class", a targets.base.Target imported only when a job runs there
    flag: AdhocFlag  # the flag that names it instead of a spec (exec --hosts H1,H2)
    to_options: Callable[[str, Mapping[str, Any]], Any]  # its flag's value and its extra flags' -> its options
    summary: Callable[[Any], str]  # what `podrun validate` says the job runs on, from the spec alone
    # for its errors, what each of its fields takes ("" the options themselves, "names.*" each item of a list)
    expected: Mapping[str, str] = field(default_factory=dict)
    field_args: Mapping[str, Any] = field(default_factory=dict)  # pydantic Field() arguments, e.g. min_length
    nothing: str | None = None  # `kind:` with no value: this is expected instead (None: the options' defaults)
    extra_flags: tuple[AdhocFlag, ...] = ()  # flags that go with its flag only (--zone with --tpu)
    uses_ssh: bool = False  # the spec's `ssh:`, --user and --identity-file apply to it
    transport: str = "ssh"  # the endpoint kind of its workers' transport (transport/__init__.py)
    worker_count: Callable[[Any], int | None] = lambda options: None  # known from the spec alone, before provisioning
    recreates: Callable[[Any], bool] = lambda options: False  # made again after a preemption (restarts.on)
    time_limited: bool = False  # its capacity ends at a time limit, after which a new one goes on (restarts.on)
    deletes: bool = False  # what the job ran on can be deleted after it (delete_after, exec --down)
    default_restart_on: tuple[str, ...] = ("failure",)  # restarts.on when the spec does not say
    # (its field, one line) for each thing its options say that may be wrong but is not refused: a warning
    doubts: Callable[[Any], list[tuple[str, str]]] = lambda options: []
    # fields beside it under `target:` that only it takes ({hosts: [...], spares: [...]}): name -> (type, description)
    siblings: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    # its extra flags' values -> its siblings' (exec --hosts H --spares S: {"spares": [S]})
    to_siblings: Callable[[Mapping[str, Any]], dict] = lambda extras: {}

    def expected_at(self) -> dict[str, str]:
        """Its fields' expectations keyed by their place in a spec (`target.tpu.names.*`; a sibling's own key
        begins with its name: `target.spares.*`)."""
        return {".".join(filter(None, ("target", *([] if key.split(".")[0] in self.siblings else [self.name]), key))):
                text for key, text in self.expected.items()}
