"""The job spec (the README's "The job spec"): parse a YAML job file into a validated JobSpec.

Every problem becomes one SpecError line naming the file, the dotted field path and what is expected.
"""

from __future__ import annotations

import difflib
import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from podrun.errors import SpecError

DEFAULT_LOCAL_WORKERS = 2
DEFAULT_RDZV_PORT = 29500
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
ENV_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Set by podrun on every worker (the README's "What every worker gets"); a spec may not override them through `env`.
RESERVED_ENV = ("PJRT_DEVICE", "PODRUN_JOB_ID", "PODRUN_WORKER", "PODRUN_NUM_WORKERS",
                "PODRUN_WORKER_IPS", "MASTER_ADDR", "MASTER_PORT")
PLAIN_KEY = re.compile(r"^[\w-]+$")
SECRET_KEY_PATTERN = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
SURROGATE = re.compile("[\ud800-\udfff]")
INT_TAG, FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TpuTarget(_Model):
    name: str = Field(description="TPU VM name")
    zone: str | None = None
    project: str | None = None
    internal_ip: bool = Field(False, description="connect to the workers' internal IPs")


class LocalTarget(_Model):
    workers: int = Field(DEFAULT_LOCAL_WORKERS, ge=1, le=256)


class Target(_Model):
    """Where the job runs: exactly one of tpu, hosts, local."""

    tpu: TpuTarget | None = None
    hosts: list[HostEntry] | None = Field(None, min_length=1, description="host, user@host, host:port or user@host:port")
    local: LocalTarget | None = None

    @field_validator("tpu", "hosts", mode="before")
    @classmethod
    def _not_empty(cls, value: Any, info: ValidationInfo) -> Any:
        # absent and empty differ: `hosts:` with nothing after it names the kind but no machine
        if value is None:
            wanted = "the TPU VM's fields (at least name)" if info.field_name == "tpu" else (
                "a list of hosts (host, user@host, host:port or user@host:port)")
            raise ValueError(f"expected {wanted}, got nothing")
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> Target:
        given = [kind for kind in ("tpu", "hosts", "local") if kind in self.model_fields_set]
        if len(given) != 1:
            got = " and ".join(given) if given else "none"
            raise ValueError(f"expected exactly one of tpu, hosts, local (got {got})")
        if self.local is None and given == ["local"]:  # `local:` with no value: the defaults
            self.local = LocalTarget()
        return self

    @property
    def kind(self) -> str:
        return "tpu" if self.tpu else "hosts" if self.hosts else "local"


class SshOptions(_Model):
    """Defaults for every host; a host entry's own user@ and :port win. Unset: ~/.ssh/config, then ssh's defaults."""

    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    check_host_keys: bool = Field(True, description="trust on first use, refuse changed host keys")


HOST_ENTRY = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[^@:\s\[\]]+))"
                        r"(?::(?P<port>\d{1,5}))?$")


def parse_host(entry: str) -> tuple[str | None, str, int | None]:
    """`host`, `user@host`, `host:port`, `user@host:port` (IPv6 in brackets) -> (user, host, port)."""
    match = HOST_ENTRY.match(entry)
    if not match or (match["port"] and not 1 <= int(match["port"]) <= 65535):
        raise ValueError(f"expected host, user@host, host:port or user@host:port, got {entry!r}")
    return match["user"], match["ipv6"] or match["host"], int(match["port"]) if match["port"] else None


def _host_entry(entry: str) -> str:
    parse_host(entry)
    return entry


HostEntry = Annotated[str, AfterValidator(_host_entry)]


def _nproc_per_node(value: Any) -> Any:
    # one message for the whole union, instead of one per member under pydantic's member tags
    if value in ("auto", "gpu", "cpu") or (type(value) is int and value >= 1):
        return value
    raise ValueError(f"expected a number of processes >= 1, or auto, gpu or cpu; got {value!r}")


class Torchrun(_Model):
    nproc_per_node: Annotated[Annotated[int, Field(ge=1)] | Literal["auto", "gpu", "cpu"],
                              BeforeValidator(_nproc_per_node)] = 1
    port: int = Field(DEFAULT_RDZV_PORT, ge=1, le=65535, description="rendezvous port on worker 0")


class Docker(_Model):
    image: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list, description="extra `docker run` arguments")


def _env_value(value: Any) -> str:
    # bool is an int in Python, and YAML reads `yes`/`on` as booleans: make the user say which
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        got = "a boolean (quote it)" if isinstance(value, bool) else _yaml_kind(value)
        raise ValueError(f"expected a string or number, got {got}")
    return str(value)


def _not_reserved(key: str) -> str:
    if key in RESERVED_ENV:
        raise ValueError("set by podrun on every worker (see `podrun exec --dry-run`); remove it from env")
    return key


EnvValue = Annotated[str, BeforeValidator(_env_value)]
EnvKey = Annotated[str, Field(pattern=ENV_KEY_PATTERN)]
UserEnvKey = Annotated[EnvKey, AfterValidator(_not_reserved)]


class JobSpec(_Model):
    """A podrun job: where it runs and what runs on every worker."""

    # optional in the file (json_schema() says so); load_spec fills in the file's stem
    name: str = Field(pattern=NAME_PATTERN, description="default: the file's stem")
    target: Target = Field(default_factory=lambda: Target(local=LocalTarget()))
    ssh: SshOptions = Field(default_factory=SshOptions)
    workdir: str = Field(".", description="shipped to every worker; relative to the spec file")
    setup: str | None = Field(None, description="runs on every worker before run")
    run: str = Field(min_length=1, description="the command; with torchrun: the script and its args")
    env: dict[UserEnvKey, EnvValue] = Field(default_factory=dict)
    secret_env: list[EnvKey] = Field(default_factory=list)
    device: Literal["TPU", "CUDA", "ROCM", "CPU"] | None = Field(None, description="PJRT_DEVICE")
    torchrun: Torchrun | None = None
    docker: Docker | None = None
    _path: Path = PrivateAttr(Path("job.yaml"))  # the file it came from, for error messages

    @property
    def path(self) -> Path:
        return self._path

    def is_secret(self, key: str) -> bool:
        return key in self.secret_env or bool(SECRET_KEY_PATTERN.search(key))


def load_spec(path: str | Path) -> JobSpec:
    """Read, validate and resolve a job file: `name` defaults to the file's stem, `workdir` becomes absolute."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(path, None, "no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise SpecError(path, None, f"cannot read: {error}") from None
    except ValueError:  # the only other error open() raises: a NUL byte in the name
        raise SpecError(repr(str(path)), None, "expected a file name, this one holds a NUL byte") from None
    try:
        data = _parse_yaml(text)
        _refuse_unusable_text(path, data)
    except yaml.YAMLError as error:
        raise SpecError(path, None, _yaml_problem(error)) from None
    except RecursionError:  # YAML's reader and the checks recurse: thousands of nested [ or {
        raise SpecError(path, None, "nested too deeply to be a job spec") from None
    if not isinstance(data, dict):
        raise SpecError(path, None, f"expected a mapping of job fields (run, target, ...), got {_yaml_kind(data)}")
    if data.get("name") is None:
        if not re.match(NAME_PATTERN, path.stem):
            raise SpecError(path, "name", f"the file's stem {path.stem!r} is not a valid job name; "
                                          f"set name: (letters, digits, . _ -)")
        data = {**data, "name": path.stem}
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as error:
        raise _spec_error(path, error) from None
    expanded = os.path.expanduser(spec.workdir)  # pathlib's would raise for ~user of no user
    if expanded.startswith("~"):
        raise SpecError(path, "workdir", f"expected an existing directory, {spec.workdir} is no user's home here")
    workdir = (path.parent / expanded).resolve()
    if not workdir.is_dir():
        raise SpecError(path, "workdir", f"expected an existing directory, {workdir} is not one")
    resolved = spec.model_copy(update={"workdir": str(workdir)})
    resolved._path = path
    return resolved


def _parse_yaml(text: str) -> Any:
    """The document as yaml.safe_load reads it, except that a number under `env` stays as it was
    written: YAML reads `3.10` as 3.1 and `0x1F` as 31, but a variable gets the text in the file."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    if isinstance(root, yaml.MappingNode) and isinstance(data, dict) and isinstance(data.get("env"), dict):
        env_node = next((value for key, value in root.value if key.value == "env"), None)
        if isinstance(env_node, yaml.MappingNode):
            for key, value in env_node.value:
                if isinstance(value, yaml.ScalarNode) and value.tag in (INT_TAG, FLOAT_TAG):
                    data["env"][loader.construct_object(key)] = value.value
    return data


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


def _yaml_kind(value: Any) -> str:
    kinds = {type(None): "nothing", bool: "a boolean", int: "a number", float: "a number",
             str: "a string", list: "a list", dict: "a mapping"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _spec_error(path: Path, error: ValidationError) -> SpecError:
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"] if part != "[key]"]
    field = _field_path(loc)
    kind, message = first["type"], first["msg"]
    if kind == "extra_forbidden":
        known = _field_names(loc[:-1])
        nearest = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f"did you mean {nearest[0]!r}?" if nearest else f"expected one of: {', '.join(known)}"
        expected = f"unknown field; {hint}"
    elif kind == "missing":
        expected = "required field is missing"
    else:
        expected = message.removeprefix("Value error, ").replace("Input should be", "expected")
        if kind != "value_error" and "input" in first and not isinstance(first["input"], (dict, list)):
            expected += f", got {first['input']!r}"
    more = error.error_count() - 1
    expected = expected.replace("\n", "\\n")
    return SpecError(path, field, expected + (f" (and {more} more problem{'s' * (more > 1)})" if more else ""))


def _field_names(loc: list[str]) -> list[str]:
    """The valid field names of the model found at `loc` inside JobSpec."""
    model: type[BaseModel] = JobSpec
    for part in loc:
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        nested = _model_in(annotation)
        if nested is None:
            return []
        model = nested
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
