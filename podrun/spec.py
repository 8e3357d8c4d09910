"""The job spec (the README's "The job spec"): parse a YAML job file into a validated JobSpec.

Every problem becomes one SpecError line naming the file, the dotted field path and what is expected.
"""

from __future__ import annotations

import difflib
import os
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from podrun.errors import PodrunError, SpecError
from podrun.spec_fields import (
    DURATION,
    DURATION_SCHEMA,
    HOST_FORMS,
    JUMP_FORMS,
    HostEntry,
    Model,
    duration_s,
    got,
    parse_jumps,
    yaml_kind,
)
from podrun.targets import registry
from podrun.targets.kind import TargetKind

DEFAULT_RDZV_PORT = 29500
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
ENV_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Set by podrun on every worker (the README's "What every worker gets"); a spec may not override them through `env`.
RESERVED_ENV = ("PJRT_DEVICE", "PODRUN_JOB_ID", "PODRUN_WORKER", "PODRUN_NUM_WORKERS",
                "PODRUN_WORKER_IPS", "PODRUN_WORKER_IPS_FILE", "MASTER_ADDR", "MASTER_PORT", "PODRUN_JOB_DIR",
                "PODRUN_ATTEMPT", "PODRUN_SLICE", "PODRUN_NUM_SLICES", "PODRUN_WORKER_IN_SLICE")
PLAIN_KEY = re.compile(r"^[\w-]+\Z")
SECRET_KEY_PATTERN = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
SURROGATE = re.compile("[\ud800-\udfff]")
INT_TAG, FLOAT_TAG, MERGE_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:merge"
DEFAULT_STOP_GRACE_S = 30.0
MAX_STOP_GRACE_S = 3600.0
DURATION_EXAMPLES = "30s, 2m, 90 (seconds) or 1m30s"
# what `run` holds is guessed at only when it is one plain command
SHELL_SYNTAX = re.compile(r"[;&|$`\n()<>]")
# one word of a plain command, as the shell (and shlex.split, quadratic on a long word) reads it
SHELL_WORD = re.compile(r"""(?:[^ \t\r\n'"\\]+|\\.|'[^']*'|"(?:[^"\\]+|\\.)*")+""", re.S)
SHELL_BLANKS = re.compile(r"[ \t\r\n]*")
QUOTED_PART = re.compile(r"""\\(.)|'([^']*)'|"((?:[^"\\]+|\\.)*)"|([^'"\\]+)""", re.S)
ESCAPED_IN_DOUBLE_QUOTES = re.compile(r'\\(["\\])')
# a spec is a page of YAML: past this, reading and checking it would only cost time and memory
MAX_SPEC_BYTES = 1 << 20
# Linux's MAX_ARG_STRLEN: the most one argument or variable (NAME=value) may hold, its final NUL included;
# the agent runs a command as `sh -c COMMAND`
MAX_ARG_BYTES = 128 * 1024
PYTHON = re.compile(r"^(?:.*/)?python(?:\d+(?:\.\d+)?)?\Z")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class _Target(Model):
    """Where the job runs: exactly one of the kinds targets/registry.py lists. Each kind's options are its
    own (targets/<kind>_options.py); outside targets/, code asks the kind (`declared`), not its options."""

    @field_validator("*", mode="before")
    @classmethod
    def _not_empty(cls, value: Any, info: ValidationInfo) -> Any:
        # absent and empty differ: `hosts:` with nothing after it names the kind but no machine
        nothing = registry.kind(str(info.field_name)).nothing
        if value is None and nothing:
            raise ValueError(f"expected {nothing}, got nothing")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> _Target:
        given = [name for name in registry.names() if name in self.model_fields_set]
        if len(given) != 1:
            raise ValueError(f"expected exactly one of {', '.join(registry.names())} (got {' and '.join(given) or 'none'})")
        if getattr(self, given[0]) is None:  # `local:` with no value: its defaults
            setattr(self, given[0], registry.kind(given[0]).annotation())
        return self

    @property
    def kind(self) -> str:
        return next(name for name in registry.names() if getattr(self, name) is not None)

    @property
    def declared(self) -> TargetKind:
        return registry.kind(self.kind)

    @property
    def options(self) -> Any:
        """The kind's options, for its own modules (targets/)."""
        return getattr(self, self.kind)


Target = create_model(  # type: ignore[call-overload]
    "Target", __base__=_Target, __doc__=f"Where the job runs: exactly one of {', '.join(registry.names())}.",
    **{declared.name: (declared.annotation | None, Field(None, description=declared.description, **declared.field_args))
       for declared in registry.kinds()})


def _jump_hosts(value: str) -> str:
    parse_jumps(value)
    return value


class SshOptions(Model):
    """Defaults for every host; a host entry's own user@ and :port win. Unset: ~/.ssh/config, then ssh's defaults."""

    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    check_host_keys: bool = Field(True, description="trust on first use, refuse changed host keys")
    known_hosts: str | None = Field(None, description="a known-hosts file read with ~/.ssh/known_hosts: a host "
                                                      "it knows must present a key it holds for it")
    proxy_command: str | None = Field(None, min_length=1, description="OpenSSH's ProxyCommand: a command whose stdin and "
                                      "stdout reach the host (%h host, %p port, %r user)")
    proxy_jump: Annotated[str, AfterValidator(_jump_hosts)] | None = Field(
        None, description="OpenSSH's ProxyJump: user@bastion[:port][,next], the jump hosts to reach every host through")

    @model_validator(mode="after")
    def _one_route(self) -> SshOptions:
        if self.proxy_jump is not None and self.proxy_command is not None:
            # OpenSSH too takes only one of them (whichever it reads first)
            raise ValueError("expected proxy_jump or proxy_command, not both: proxy_jump is OpenSSH's "
                             "ProxyCommand \"ssh -W %h:%p bastion\" with podrun's host-key rules for the bastion")
        return self


def _nproc_per_node(value: Any) -> Any:
    # one message for the whole union, instead of one per member under pydantic's member tags
    if isinstance(value, str) and value.lower() in ("auto", "gpu", "cpu"):
        return value.lower()
    if type(value) is int and value >= 1:
        return value
    raise ValueError(f"expected {EXPECTED['torchrun.nproc_per_node']}, got {got(value)}")


class Torchrun(Model):
    nproc_per_node: Annotated[Annotated[int, Field(ge=1)] | Literal["auto", "gpu", "cpu"],
                              BeforeValidator(_nproc_per_node)] = 1
    port: int = Field(DEFAULT_RDZV_PORT, ge=1, le=65535, description="rendezvous port on worker 0")


class Docker(Model):
    image: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list, description="extra `docker run` arguments")


def _env_value(value: Any) -> str:
    # bool is an int in Python, and YAML reads `yes`/`on` as booleans: make the user say which
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        got = "a boolean (quote it)" if isinstance(value, bool) else yaml_kind(value)
        raise ValueError(f"expected a string or number, got {got}")
    return str(value)


def _not_reserved(key: str) -> str:
    if key in RESERVED_ENV:
        raise ValueError("set by podrun on every worker (see `podrun exec --dry-run`); remove it from env")
    return key


EnvValue = Annotated[str, BeforeValidator(_env_value)]
EnvKey = Annotated[str, Field(pattern=ENV_KEY_PATTERN)]
UserEnvKey = Annotated[EnvKey, AfterValidator(_not_reserved)]
DeviceName = Literal["TPU", "CUDA", "ROCM", "CPU"]
DEVICES: tuple[str, ...] = typing.get_args(DeviceName)


def _device(value: Any) -> Any:
    if isinstance(value, str) and value.upper() in DEVICES:
        return value.upper()
    raise ValueError(f"expected {EXPECTED['device']}, got {got(value)}")


Device = Annotated[DeviceName, BeforeValidator(_device),
                   WithJsonSchema({"enum": [*DEVICES, *(device.lower() for device in DEVICES)], "type": "string"})]


def parse_stop_grace(value: Any) -> float:
    """`stop_grace` (and `exec --grace`): a duration from 0s to 1h, a number being seconds -> seconds."""
    seconds = duration_s(value) if isinstance(value, str) else value if type(value) in (int, float) else None
    if seconds is None or not 0 <= seconds <= MAX_STOP_GRACE_S:  # NaN fails the comparison too
        raise ValueError(f"expected {EXPECTED['stop_grace']}, got {got(value)}")
    return float(seconds)


def parse_stall(value: Any) -> float:
    """`stall` (and `exec --stall`): a duration above 0, a number being seconds -> seconds."""
    seconds = duration_s(value) if isinstance(value, str) else value if type(value) in (int, float) else None
    if seconds is None or not 0 < seconds < float("inf"):  # NaN fails the comparison too
        raise ValueError(f"expected {EXPECTED['stall']}, got {got(value)}")
    return float(seconds)


DeleteAfter = Literal["never", "success", "always"]
RestartCause = Literal["preemption", "failure", "stall"]
RESTART_CAUSES: tuple[str, ...] = typing.get_args(RestartCause)


def _lower_choice(field: str, choices: tuple[str, ...]):
    def parse(value: Any) -> Any:
        if isinstance(value, str) and value.lower() in choices:
            return value.lower()
        raise ValueError(f"expected {EXPECTED[field]}, got {got(value)}")
    return parse


class Restarts(Model):
    max: int = Field(1, ge=0, le=100, description="how many times the job may restart (default 1)")
    on: list[Annotated[RestartCause, BeforeValidator(_lower_choice("restarts.on.*", RESTART_CAUSES))]] | None = \
        Field(None, min_length=1,
              description="preemption (the TPU is created again), failure and/or stall (run again on the same "
                          "workers); default: [preemption] on a tpu target, [failure] on hosts and local")
    exit_codes: list[Annotated[int, Field(ge=1, le=255)]] | None = Field(
        None, min_length=1, description="failure restarts only for these exit codes (default: any)")

    @model_validator(mode="before")
    @classmethod
    def _on_as_written(cls, data: Any) -> Any:
        # YAML 1.1 (PyYAML) reads the key `on` as the boolean true, as GitHub Actions users know
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if key is True else key): value for key, value in data.items()}
        return data


StopGrace = Annotated[float, BeforeValidator(parse_stop_grace), WithJsonSchema({"anyOf": [
    {"type": "number", "minimum": 0, "maximum": MAX_STOP_GRACE_S},
    {"type": "string", "pattern": f"^{DURATION.pattern}$"}]})]


class Supervisor(Model):
    """A host that runs the job's whole life in place of the machine that started it."""

    host: HostEntry = Field(description="host, user@host, host:port or user@host:port; the spec's ssh: applies")
    podrun: str | None = Field(None, description="podrun's path there; default: podrun on its login PATH, else one "
                                                 "podrun installs into ~/.podrun/venv")


class JobSpec(Model):
    """A podrun job: where it runs and what runs on every worker."""

    # optional in the file (json_schema() says so); load_spec fills in the file's stem
    name: str = Field(pattern=NAME_PATTERN, description="default: the file's stem")
    target: Target = Field(default_factory=lambda: Target.model_validate({registry.DEFAULT_KIND: None}))
    ssh: SshOptions = Field(default_factory=SshOptions)
    workdir: str = Field(".", description="shipped to every worker; relative to the spec file")
    setup: str | None = Field(None, description="runs on every worker before run")
    run: str = Field(min_length=1, description="the command; with torchrun: the script and its args")
    env: dict[UserEnvKey, EnvValue] = Field(default_factory=dict)
    secret_env: list[EnvKey] = Field(default_factory=list)
    device: Device | None = Field(None, description="PJRT_DEVICE: TPU, CUDA, ROCM or CPU, in any case")
    torchrun: Torchrun | None = None
    docker: Docker | None = None
    stop_grace_s: StopGrace = Field(
        DEFAULT_STOP_GRACE_S, alias="stop_grace",
        description="how long a stopped job's processes get between SIGTERM and SIGKILL, to save a checkpoint: "
                    f"a duration such as {DURATION_EXAMPLES}, from 0s to 1h; default 30s")
    stall_s: Annotated[float, BeforeValidator(parse_stall), WithJsonSchema(DURATION_SCHEMA)] | None = Field(
        None, alias="stall",
        description="stop the job (saving every worker's stacks) when no worker printed a line for this long "
                    "while run runs, e.g. 15m; default: never")
    delete_after: Annotated[DeleteAfter, BeforeValidator(_lower_choice("delete_after", ("never", "success", "always")))] \
        = Field("never", description="delete the TPU VM when the job ends: never, success or always")
    restarts: Restarts | None = Field(None, description="restart the job on preemption, failure and/or stall")
    supervisor: Supervisor | None = Field(None, description="a host that runs the job's whole life (exec "
                                                            "--supervisor HOST)")
    _path: Path = PrivateAttr(Path("job.yaml"))  # the file it came from, for error messages

    @property
    def path(self) -> Path:
        return self._path

    @property
    def restart_on(self) -> list[str]:
        """What restarts the job (when it may restart: `restarts`, `exec --restarts N`): restarts.on, else
        a preemption on a TPU, which podrun creates again, and a failure where nothing is preempted."""
        if self.restarts and self.restarts.on:
            return list(self.restarts.on)
        return list(self.target.declared.default_restart_on)

    def is_secret(self, key: str) -> bool:
        return key in self.secret_env or bool(SECRET_KEY_PATTERN.search(key))

    def written_secrets(self) -> list[str]:
        """The secret keys whose value `env` holds, as written in the spec (not taken from podrun's environment)."""
        return [key for key, value in self.env.items() if value != "" and self.is_secret(key)]


VARIABLE_NAME = ("a variable name", "use letters, digits and '_', not starting with a digit")
# (what it is not, the rule) for the fields with a pattern; `*` is any list index or env key, `[key]` the key itself
NAME_RULES = {
    "name": ("a valid name", "use letters, digits, '.', '_' and '-', starting with a letter or digit"),
    "env.*.[key]": VARIABLE_NAME,
    "secret_env.*": VARIABLE_NAME,
}
PORT = "a port number from 1 to 65535"
# what every other field takes, as an error message says it: "expected ..."
EXPECTED = {
    "target": f"a mapping with one of {', '.join(registry.names())}, such as {{local: {{workers: 2}}}}",
    **{key: text for declared in registry.kinds() for key, text in declared.expected_at().items()},
    "ssh": "a mapping such as {user: root, port: 22, identity_file: ~/.ssh/id_ed25519}",
    "ssh.user": "a user name such as root",
    "ssh.port": PORT,
    "ssh.identity_file": "the path of a private key such as ~/.ssh/id_ed25519",
    "ssh.check_host_keys": "true or false",
    "ssh.known_hosts": "the path of a known-hosts file such as ~/.ssh/cluster_known_hosts",
    "ssh.proxy_jump": JUMP_FORMS,
    "ssh.proxy_command": "a command whose stdin and stdout reach the host, such as \"ssh -W %h:%p bastion\"",
    "workdir": "a directory (relative to the spec file)",
    "setup": "a shell command such as pip install -r requirements.txt",
    "run": "the command to run, such as python3 train.py (with torchrun: the script and its arguments)",
    "env": "a mapping of variable names to values, such as {WANDB_MODE: offline}",
    "env.*": "a string or number",
    "secret_env": "a list of variable names such as [WANDB_API_KEY]",
    "device": "TPU, CUDA, ROCM or CPU (in any case)",
    "torchrun": "a mapping such as {nproc_per_node: 4, port: 29500}",
    "torchrun.nproc_per_node": "a number of processes >= 1, or auto, gpu or cpu",
    "torchrun.port": PORT,
    "docker": "a mapping such as {image: us-docker.pkg.dev/my-proj/repo/xla:r2.5, args: [--shm-size=16g]}",
    "docker.image": "an image such as us-docker.pkg.dev/my-proj/repo/xla:r2.5",
    "docker.args": "a list of `docker run` arguments such as [--shm-size=16g]",
    "docker.args.*": "a `docker run` argument such as --shm-size=16g",
    "stop_grace": f"a duration from 0s to 1h such as {DURATION_EXAMPLES}",
    "stall": "a duration above 0 such as 15m, 90 (seconds) or 1h30m",
    "delete_after": "never, success or always",
    "restarts": "a mapping such as {max: 3, on: [preemption]}",
    "restarts.max": "a number of restarts from 0 to 100",
    "restarts.on": "a list of preemption, failure and/or stall",
    "restarts.on.*": "preemption, failure or stall",
    "restarts.exit_codes": "a list of exit codes such as [42, 75]",
    "restarts.exit_codes.*": "an exit code from 1 to 255",
    "supervisor": "a mapping such as {host: me@supervisor-vm, podrun: /opt/podrun/bin/podrun}",
    "supervisor.host": HOST_FORMS,
    "supervisor.podrun": "the path of podrun on the supervisor host, such as /opt/podrun/bin/podrun",
}


class SpecProblems(SpecError):
    """Every problem found in one spec, one line each, as a SpecError says one."""

    def __init__(self, path: Path, problems: list[tuple[str | None, str]]):
        PodrunError.__init__(self, "\n".join(str(SpecError(path, field, expected)) for field, expected in problems))


class FieldProblems(Exception):
    """What is wrong with a spec's fields: (field path, what is expected) for each problem."""

    def __init__(self, problems: list[tuple[str | None, str]]):
        super().__init__(problems)
        self.problems = problems


def validate_fields(data: dict) -> JobSpec:
    """A spec's fields, checked (raises FieldProblems); load_spec reads them from a file, the
    command line's ad-hoc targets build them (adhoc.py)."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        raise FieldProblems(_problems(error)) from None


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
        _refuse_python_under_torchrun(path, spec.run)
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
                    yield _field_path(where), f"given twice, on {lines}; keep one"
            yield from _duplicate_keys(value, where, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicate_keys(item, (*field, str(index)), seen)


def _refuse_python_under_torchrun(path: Path, run: str) -> None:
    words = run.split()
    if words and PYTHON.match(words[0]):
        script = _after_python(words)
        fix = f"drop it: run: {' '.join(script)}" if script else "drop it and name the script"
        raise SpecError(path, "run", f"with torchrun, run is the script and its arguments: torchrun starts Python "
                                     f"itself, so it would run {words[0]!r} as the script; {fix}")


def _refuse_lifecycle_without_a_tpu(path: Path, spec: JobSpec) -> None:
    declared = spec.target.declared
    if spec.delete_after != "never" and not declared.deletes:
        raise SpecError(path, "delete_after", f"{spec.delete_after} deletes the TPU VM the job ran on, but the "
                                              f"target is {spec.target.kind}: remove it")
    if spec.restarts and spec.restarts.exit_codes and "failure" not in spec.restart_on:
        raise SpecError(path, "restarts.exit_codes", "limits failure restarts, but restarts.on does not hold "
                                                     "failure: add it, or remove exit_codes")
    if spec.restarts and "preemption" in spec.restart_on and not declared.recreates(spec.target.options):
        raise SpecError(path, "restarts.on", f"{_preemption_restarts(spec)}; `on: [failure]` restarts failures")


def _preemption_restarts(spec: JobSpec) -> str:
    """Why a target that cannot be made again cannot restart on preemption (restarts.on, given or not)."""
    given = spec.restarts is not None and spec.restarts.on is not None
    return (f"{'' if given else f'on a {spec.target.kind} target, restarts default to '}preemption restarts, which "
            f"create the TPU VM again, so they need target.tpu.accelerator_type")


def check_command_size(path: Path, field: str, command: str) -> None:
    """A command the agent can run as `sh -c COMMAND`: one argument, so at most MAX_ARG_BYTES."""
    size = len(command.encode(errors="surrogateescape"))
    if size >= MAX_ARG_BYTES:
        raise SpecError(path, field, f"{size} bytes, over the {MAX_ARG_BYTES // 1024} KiB "
                                     f"Linux allows one command; put it in a script in the workdir and run that")


def _after_python(words: list[str]) -> list[str] | None:
    """The script and its arguments of `python [options] script args...`; None with -m, -c or - (stdin)."""
    at = 1
    while at < len(words) and words[at].startswith("-"):
        option = words[at]
        at += 1
        if option == "--":
            break
        if option == "-" or option.startswith(("-m", "-c")):
            return None
        if option in ("-W", "-X"):  # the options that take their value as the next word
            at += 1
    return words[at:]


def check_run_script(spec: JobSpec) -> None:
    """Before a run: a script that `run` names (a relative path ending in .py or holding a /) is in the workdir."""
    script = _script_in(spec)
    # `setup` may make it: a download, a build, a checkout
    if script is None or script in (spec.setup or "") or (Path(spec.workdir) / script).exists():
        return
    folder = Path(spec.workdir) / os.path.dirname(script)
    names = sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []
    nearest = difflib.get_close_matches(os.path.basename(script), names, n=1)
    hint = f"; did you mean {os.path.join(os.path.dirname(script), nearest[0])}?" if nearest else ""
    raise SpecError(spec.path, "run", f"{script} is not in the workdir ({spec.workdir}){hint}")


def _script_in(spec: JobSpec) -> str | None:
    """The relative path of the file `run` starts, when it plainly names one; shell syntax is not guessed at."""
    if SHELL_SYNTAX.search(spec.run):
        return None
    words = _shell_words(spec.run)
    if words is None:  # unbalanced quotes: the shell will say so
        return None
    assignments = 0
    while assignments < len(words) and ASSIGNMENT.match(words[assignments]):  # `OMP_NUM_THREADS=1 python3 train.py`
        assignments += 1
    words = words[assignments:]
    if words and not spec.torchrun and PYTHON.match(words[0]):
        words = _after_python(words) or []
    if not words:
        return None
    script = words[0]
    looks_like_file = script.endswith(".py") or "/" in script
    return script if looks_like_file and not script.startswith(("/", "~")) else None


def _shell_words(command: str) -> list[str] | None:
    """shlex.split(command) in linear time (a command without shell syntax); None for unbalanced quotes."""
    words, at = [], 0
    while (at := SHELL_BLANKS.match(command, at).end()) < len(command):  # type: ignore[union-attr]
        word = SHELL_WORD.match(command, at)
        if word is None:
            return None
        words.append("".join(_unquoted(part) for part in QUOTED_PART.finditer(word[0])))
        at = word.end()
    return words


def _unquoted(part: re.Match[str]) -> str:
    escaped, single, double, plain = part.groups()
    if double is not None:
        return ESCAPED_IN_DOUBLE_QUOTES.sub(r"\1", double)
    return next(text for text in (escaped, single, plain) if text is not None)


def _refuse_unusable_text(path: Path, data: Any, field: tuple[str, ...] = ()) -> None:
    """No field may hold a NUL byte or a lone surrogate (YAML's "\\0" or "\\ud800"): neither can be
    a path, a command or an environment value, and each would end in a traceback further on."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        where = (*field, str(key))
        if isinstance(key, str) and not _usable(key):
            raise SpecError(path, _field_path(field), f"a key holds {_unusable_kind(key)}: {key!r}")
        if isinstance(value, str) and not _usable(value):
            raise SpecError(path, _field_path(where), f"holds {_unusable_kind(value)}, which no path, command or "
                                                      f"variable can")
        _refuse_unusable_text(path, value, where)


def _field_path(parts: tuple[str, ...] | list[str]) -> str | None:
    """`target.hosts.0`; a key that is not a plain name (a generated or mistyped one may hold
    anything, newlines included) quoted, to keep the message on one line."""
    return ".".join(part if PLAIN_KEY.match(part) else repr(part) for part in parts) or None


def _printable(text: str) -> str:
    """text, or its repr when it holds a control character (which could end the message's line)."""
    return text if text.isprintable() else repr(text)


def _usable(text: str) -> bool:
    return "\0" not in text and not SURROGATE.search(text)


def _unusable_kind(text: str) -> str:
    return "a NUL byte" if "\0" in text else "a lone surrogate character"


def json_schema() -> dict:
    schema = JobSpec.model_json_schema()
    schema["required"].remove("name")  # the file's stem when the file does not say
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "podrun job spec"
    return schema


def _yaml_problem(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.reader.ReaderError):  # a character YAML does not allow, before any parsing
        return f"byte {error.position + 1}: not valid YAML: character {error.character!r} is not allowed in YAML"
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return f"{where}not valid YAML: {problem}"


def _problems(error: ValidationError) -> list[tuple[str | None, str]]:
    """(field path, what is expected) for each of pydantic's errors, in podrun's words, without repeats."""
    problems: list[tuple[str | None, str]] = []
    for detail in error.errors():
        loc = [str(part) for part in detail["loc"]]
        if detail["type"] == "invalid_key":  # a key that is no text (`? ` alone, `1: x`): the mapping is at fault
            loc = loc[:-1]
        problem = (_field_path([part for part in loc if part != "[key]"]), _in_plain_words(detail, loc))
        if problem not in problems:
            problems.append(problem)
    return problems


def _in_plain_words(detail: Any, loc: list[str]) -> str:
    kind, value = detail["type"], detail.get("input")
    if kind == "value_error":  # raised by podrun's own validators: already in its words
        return detail["msg"].removeprefix("Value error, ").replace("\n", "\\n")
    if kind == "invalid_key":
        return f"every key must be a field name, got {got(value)} as a key"
    if kind == "extra_forbidden":
        known = _field_names(loc[:-1])
        nearest = difflib.get_close_matches(loc[-1], known, n=1)
        return "unknown field; " + (f"did you mean {nearest[0]!r}?" if nearest else f"expected one of: {', '.join(known)}")
    shape = _shape(loc)
    if kind == "string_pattern_mismatch":
        noun, rule = NAME_RULES[shape]
        return f"{got(value)} is not {noun}: {rule}"
    expected = EXPECTED.get(shape) or "{} ({})".format(*NAME_RULES[shape])
    if kind == "missing":
        return f"required field is missing; expected {expected}"
    return f"expected {expected}, got {got(value)}"


def _shape(loc: list[str]) -> str:
    """`loc` with each list index and mapping key that is not a field as `*`: `target.hosts.*`, `env.*.[key]`."""
    return ".".join(part if part == "[key]" or part in _field_names(loc[:index]) else "*"
                    for index, part in enumerate(loc))


def _field_names(loc: list[str]) -> list[str]:
    """The valid field names (as written in a spec) of the model found at `loc` inside JobSpec."""
    model: type[BaseModel] | None = JobSpec
    for part in loc:
        field = _fields(model).get(part) if model else None
        model = _model_in(field.annotation) if field else None
    return list(_fields(model)) if model else []


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    return {field.alias or name: field for name, field in model.model_fields.items()}


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
