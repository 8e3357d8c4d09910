"""The `slurm` target's options (`target: {slurm: {...}}`, `exec --slurm`): a Slurm cluster's nodes,
allocated for the job and reached through its login node. Light: imported whenever a spec is loaded;
the implementation (targets/slurm.py) is imported only when a job runs there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationInfo, WithJsonSchema, field_validator

from podrun.spec.fields import HOST_FORMS, HostEntry, Model
from podrun.target_kinds.kind import AdhocFlag, TargetKind, whole_number

SLURM_TIME_FORMS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, such as 4:00:00"
# Slurm's own time forms (sbatch --time): minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds
SLURM_TIME = re.compile(r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                        r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)\Z")
UNLIMITED = ("UNLIMITED", "INFINITE")
# a Slurm name: a partition, account, QOS, constraint expression; no blanks or shell syntax
SLURM_WORD = re.compile(r"^[A-Za-z0-9_.:@%+=,&|!\[\]*()-]+\Z")

EXPECTED = {  # by field, for "expected ..." errors (TargetKind.expected)
    "": "a mapping such as {login: user@login-node, nodes: 2, partition: gpu}",
    "login": f"the login node: {HOST_FORMS} (omit it on the login node)",
    "nodes": "a number of nodes from 1, such as 2",
    "spares": "a number of spare nodes from 0, such as 1",
    "partition": "a partition's name, such as gpu",
    "time": f"a time limit in Slurm's forms ({SLURM_TIME_FORMS})",
    "account": "an account's name, such as proj",
    "gpus_per_node": "a number of GPUs per node, such as 8",
    "exclusive": "true (the whole of each node, the default) or false (share the nodes)",
    "cpus_per_node": "a number of CPUs per node, such as 16",
    "constraint": "node features, such as a100",
    "qos": "a quality of service's name, such as high",
    "sbatch_args": "a list of sbatch options, such as [--exclusive]",
    "sbatch_args.*": "an sbatch option, such as --exclusive",
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


# sbatch options that say how much of each node the job gets, as `exclusive` and `cpus_per_node` do
NODE_SHARE_OPTIONS = ("--exclusive", "--oversubscribe", "-s", "--cpus-per-task", "-c", "--mincpus", "--cpus-per-gpu")


def node_share_option(arg: str) -> bool:
    """Whether an sbatch option says how much of each node the job gets (`-c8`, `--exclusive=user` too)."""
    name = arg.split("=", 1)[0]
    return name in NODE_SHARE_OPTIONS or (arg[:2] == "-c" and arg[2:].isdigit())


def _sbatch_arg(value: str) -> str:
    if not value.startswith("-"):
        raise ValueError(f"expected an sbatch option starting with - (such as --exclusive), got {value!r}")
    return value


SlurmWord = Annotated[str, AfterValidator(_word), WithJsonSchema({"type": "string", "pattern": SLURM_WORD.pattern})]


class SlurmOptions(Model):
    """A Slurm cluster: the job gets an allocation of `nodes` nodes and runs one worker on each."""

    login: HostEntry | None = Field(
        None, description="the login node (user@host[:port]), reached over SSH; omit it to run the Slurm commands here")
    nodes: int = Field(1, ge=1, le=100_000, description="how many nodes: one worker on each")
    spares: int = Field(0, ge=0, le=100_000, description="spare nodes allocated with them: a lost node's worker goes "
                                                          "on one in its rank, without a new allocation")
    partition: SlurmWord | None = Field(None, description="default: the cluster's default partition")
    time: Annotated[str, AfterValidator(_time)] | None = Field(
        None, description=f"the allocation's time limit ({SLURM_TIME_FORMS}); default: the partition's")
    account: SlurmWord | None = None
    gpus_per_node: int | None = Field(None, ge=0, le=1024, description="sbatch --gpus-per-node")
    constraint: Annotated[str, Field(min_length=1)] | None = Field(None, description="sbatch --constraint")
    qos: SlurmWord | None = None
    exclusive: bool | None = Field(
        None, description="the whole of each node for the job (salloc --exclusive): all its CPUs, and no other job "
                          "beside it; false: share the nodes. Default: true, false where cpus_per_node is given")
    cpus_per_node: int | None = Field(
        None, ge=1, le=100_000, description="CPUs of each node for the job (salloc --cpus-per-task: one task per node), "
                                            "sharing the rest of the node with other jobs")
    sbatch_args: list[Annotated[str, AfterValidator(_sbatch_arg)]] = Field(
        default_factory=list, description="any other sbatch options, passed on as they are")

    @field_validator("cpus_per_node")
    @classmethod
    def _part_or_whole(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("exclusive"):
            raise ValueError(f"{value} CPUs of each node, but exclusive: true asks for the whole node: keep one")
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _said_once(cls, value: list[str], info: ValidationInfo) -> list[str]:
        said = [name for name in ("exclusive", "cpus_per_node") if info.data.get(name) is not None]
        own = next((arg for arg in value if node_share_option(arg)), None)
        if said and own is not None:
            raise ValueError(f"{own} and {said[0]} both say how much of each node the job gets: keep one")
        return value

    @property
    def allocated(self) -> int:
        """The nodes asked of Slurm: the workers' and the spares."""
        return self.nodes + self.spares

    @property
    def time_s(self) -> float | None:
        return slurm_time_s(self.time) if self.time else None

    def node_share(self) -> list[str]:
        """salloc's options for how much of each node the job gets: the whole node (--exclusive) unless the spec
        says otherwise, here or in sbatch_args (which then decide alone)."""
        if self.cpus_per_node is not None:
            return [f"--cpus-per-task={self.cpus_per_node}"]
        if self.exclusive is False or any(node_share_option(arg) for arg in self.sbatch_args):
            return []
        return ["--exclusive"]


def _summary(options: SlurmOptions) -> str:
    """`podrun validate`'s "job X on <summary>"."""
    where = f"partition {options.partition}" if options.partition else "the default partition"
    via = f" via {options.login}" if options.login else ""
    return f"{options.nodes} Slurm node{'s' if options.nodes != 1 else ''} of {where}{via}"


def _from_flags(value: str, extras: Mapping[str, Any]) -> dict:
    """`exec --slurm LOGIN` (`.`: this machine is the login node) with --nodes, --partition, --time and
    --gpus-per-node, as the spec's `target.slurm`."""
    options: dict[str, Any] = {} if value == "." else {"login": value}
    return {**options, **{key: given for key, given in extras.items() if given is not None}}


KIND = TargetKind(
    name="slurm", annotation=SlurmOptions, description="a Slurm cluster's nodes, allocated for the job",
    implementation="podrun.targets.slurm:SlurmCluster", expected=EXPECTED, transport="slurm",
    flag=AdhocFlag("--slurm", "LOGIN", "a Slurm cluster through its login node, user@host (`.`: this machine is it)"),
    extra_flags=(AdhocFlag("--nodes", "N", "how many Slurm nodes (default 1)", type=whole_number),
                 AdhocFlag("--partition", "P", "the Slurm partition (default: the cluster's)"),
                 AdhocFlag("--time", "T", "the allocation's time limit, such as 4:00:00"),
                 AdhocFlag("--gpus-per-node", "G", "GPUs on each Slurm node", type=whole_number)),
    to_options=_from_flags, uses_ssh=True, time_limited=True, summary=_summary, worker_count=lambda options: options.nodes)
