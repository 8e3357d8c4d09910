"""The `slurm` target's options (`target: {slurm: {...}}`, `exec --slurm`): a Slurm cluster's nodes,
allocated for the job and reached through its login node. Light: imported whenever a spec is loaded;
the implementation (targets/slurm.py) is imported only when a job runs there.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

SLURM_TIME_FORMS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, such as 4:00:00"
# Slurm's own time forms (sbatch --time): minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds
SLURM_TIME = re.compile(r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                        r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)\Z")
UNLIMITED = ("UNLIMITED", "INFINITE")
# a Slurm name: a partition, account, QOS, constraint expression; no blanks or shell syntax
SLURM_WORD = re.compile(r"^[A-Za-z0-9_.:@%+=,&|!\[\]*()-]+\Z")

EXPECTED = {
    "target.slurm": "a mapping such as {login: user@login-node, nodes: 2, partition: gpu}",
    "target.slurm.login": "the login node: host, user@host, host:port or user@host:port (omit it on the login node)",
    "target.slurm.nodes": "a number of nodes from 1, such as 2",
    "target.slurm.partition": "a partition's name, such as gpu",
    "target.slurm.time": f"a time limit in Slurm's forms ({SLURM_TIME_FORMS})",
    "target.slurm.account": "an account's name, such as proj",
    "target.slurm.gpus_per_node": "a number of GPUs per node, such as 8",
    "target.slurm.constraint": "node features, such as a100",
    "target.slurm.qos": "a quality of service's name, such as high",
    "target.slurm.sbatch_args": "a list of sbatch options, such as [--exclusive]",
    "target.slurm.sbatch_args.*": "an sbatch option, such as --exclusive",
}


def slurm_time_s(text: str) -> float | None:
    """A Slurm time limit -> seconds (None: unlimited); ValueError if it is none of Slurm's forms."""
    if text.strip().upper() in UNLIMITED:
        return None
    match = SLURM_TIME.match(text.strip())
    if not match:
        raise ValueError(f"expected {SLURM_TIME_FORMS}, got {text!r}")
    if match["days"] is not None:
        days, hours, minutes, seconds = (int(match[key] or 0) for key in ("days", "dh", "dm", "ds"))
        return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    parts = [int(part) for part in (match["a"], match["b"], match["c"]) if part is not None]
    if len(parts) == 1:  # minutes
        return float(parts[0] * 60)
    if len(parts) == 2:  # minutes:seconds
        return float(parts[0] * 60 + parts[1])
    return float((parts[0] * 60 + parts[1]) * 60 + parts[2])


def _time(value: str) -> str:
    if value.strip().upper() in UNLIMITED:
        raise ValueError(f"expected a time limit ({SLURM_TIME_FORMS}); leave time out for the partition's default")
    slurm_time_s(value)
    return value.strip()


def _word(value: str) -> str:
    if not SLURM_WORD.match(value):
        raise ValueError(f"expected a Slurm name without blanks or shell syntax, got {value!r}")
    return value


# user@host[:port] (IPv6 in brackets); podrun.spec_fields.parse_host reads it (this module may not import spec.py)
LOGIN = re.compile(r"^(?:[^@\s]+@)?(?:\[[0-9A-Fa-f:.]+\]|[^@:\s\[\]]+)(?::\d{1,5})?\Z")


def _login(value: str) -> str:
    if not LOGIN.match(value):
        raise ValueError(f"expected host, user@host, host:port or user@host:port, got {value!r}")
    return value


def _sbatch_arg(value: str) -> str:
    if not value.startswith("-"):
        raise ValueError(f"expected an sbatch option starting with - (such as --exclusive), got {value!r}")
    return value


SlurmWord = Annotated[str, AfterValidator(_word), WithJsonSchema({"type": "string", "pattern": SLURM_WORD.pattern})]


class SlurmOptions(BaseModel):
    """A Slurm cluster: the job gets an allocation of `nodes` nodes and runs one worker on each."""

    model_config = ConfigDict(extra="forbid")

    login: Annotated[str, AfterValidator(_login)] | None = Field(
        None, description="the login node (user@host[:port]), reached over SSH; omit it to run the Slurm commands here")
    nodes: int = Field(1, ge=1, le=100_000, description="how many nodes: one worker on each")
    partition: SlurmWord | None = Field(None, description="default: the cluster's default partition")
    time: Annotated[str, AfterValidator(_time)] | None = Field(
        None, description=f"the allocation's time limit ({SLURM_TIME_FORMS}); default: the partition's")
    account: SlurmWord | None = None
    gpus_per_node: int | None = Field(None, ge=0, le=1024, description="sbatch --gpus-per-node")
    constraint: Annotated[str, Field(min_length=1)] | None = Field(None, description="sbatch --constraint")
    qos: SlurmWord | None = None
    sbatch_args: list[Annotated[str, AfterValidator(_sbatch_arg)]] = Field(
        default_factory=list, description="any other sbatch options, passed on as they are")

    @property
    def time_s(self) -> float | None:
        return slurm_time_s(self.time) if self.time else None


def summary(options: SlurmOptions) -> str:
    """`podrun validate`'s "job X on <summary>"."""
    where = f"partition {options.partition}" if options.partition else "the default partition"
    via = f" via {options.login}" if options.login else ""
    return f"{options.nodes} Slurm node{'s' if options.nodes != 1 else ''} of {where}{via}"


def to_options(flag_value: str, extras: dict[str, Any]) -> dict:
    """`exec --slurm [LOGIN]` with --nodes, --partition, --time ... as the spec's `target.slurm`.
    --slurm takes the login node, or `.` (or nothing) for this machine."""
    options: dict[str, Any] = {} if flag_value in ("", ".", "local") else {"login": flag_value}
    for key, value in extras.items():
        if value is not None:
            options[key] = value
    return options
