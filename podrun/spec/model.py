"""The job spec (docs/spec.md): its pydantic models, JobSpec at their top, and its JSON Schema.

spec/loading.py reads a YAML file into a JobSpec; spec/problems.py says what is wrong with one, a line each.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from podrun.spec.fields import DURATION, DURATION_SCHEMA, HostEntry, Model, got, parse_jumps, yaml_kind
from podrun.spec.messages import DURATION_EXAMPLES, EXPECTED, NOTIFY_URL
from podrun.spec.values import (
    MAX_STOP_GRACE_S,
    STALL_AUTO,
    above_zero,
    lower_choice,
    parse_idle_delete,
    parse_stall,
    parse_stop_grace,
)
from podrun.target_kinds import registry
from podrun.target_kinds.kind import TargetKind

DEFAULT_RDZV_PORT = 29500
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
ENV_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Set by podrun on every worker (docs/spec.md, "What every worker gets"); a spec may not override them through `env`.
RESERVED_ENV = ("PJRT_DEVICE", "PODRUN_JOB_ID", "PODRUN_WORKER", "PODRUN_NUM_WORKERS",
                "PODRUN_WORKER_IPS", "PODRUN_WORKER_IPS_FILE", "MASTER_ADDR", "MASTER_PORT", "PODRUN_JOB_DIR",
                "PODRUN_ATTEMPT", "PODRUN_SLICE", "PODRUN_NUM_SLICES", "PODRUN_WORKER_IN_SLICE")
SECRET_KEY_PATTERN = re.compile(r"TOKEN|KEY|SECRET|PASSWORD", re.IGNORECASE)
DEFAULT_STOP_GRACE_S = 30.0


class _Target(Model):
    """Where the job runs: exactly one of the kinds target_kinds/registry.py lists. Each kind's options are its
    own (target_kinds/<kind>.py); outside targets/, code asks the kind (`declared`), not its options."""

    @field_validator(*registry.names(), mode="before", check_fields=False)
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
        for name, declared in registry.siblings().items():
            if getattr(self, name) and declared.name != given[0]:  # empty: as good as absent (a handover's dump)
                raise ValueError(f"{name}: only a {declared.name} target takes {name} (this one is {given[0]})")
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

    def sibling(self, name: str) -> Any:
        """A field beside the kind that only the kind takes (TargetKind.siblings: `spares`), for its own modules."""
        return getattr(self, name)


Target = create_model(  # type: ignore[call-overload]
    "Target", __base__=_Target, __doc__=f"Where the job runs: exactly one of {', '.join(registry.names())}.",
    **{declared.name: (declared.annotation | None, Field(None, description=declared.description, **declared.field_args))
       for declared in registry.kinds()},
    **{name: (annotation, Field(default_factory=list, description=description))
       for declared in registry.kinds() for name, (annotation, description) in declared.siblings.items()})


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


DeleteAfter = Literal["never", "success", "always"]
# the ends that restart a job, then the classes of a failure's cause (launch/causes.py) that restart it alone
RestartCause = Literal["preemption", "failure", "stall", "time_limit",
                       "oom", "collective", "hardware", "config", "exception", "signal", "lost", "unknown"]
NotifyEvent = Literal["failure", "preemption", "stall", "restart", "success", "straggler"]
NOTIFY_EVENTS: tuple[str, ...] = typing.get_args(NotifyEvent)
RESTART_CAUSES: tuple[str, ...] = typing.get_args(RestartCause)


def _http_url(url: str) -> str:
    if not re.match(r"https?://[^/\s]+", url) or any(char.isspace() for char in url):
        raise ValueError(f"expected {EXPECTED['notify.url']}, got {got(url)}")
    return url


def _progress(value: Any) -> Any:
    """`progress: 'step (\\d+)'` is short for {pattern: 'step (\\d+)'}."""
    return {"pattern": value} if isinstance(value, str) else value


def _step_pattern(pattern: str) -> str:
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise ValueError(f"expected {EXPECTED['progress.pattern']}, got {got(pattern)} ({error})") from None
    if compiled.groups < 1:
        raise ValueError(f"expected {EXPECTED['progress.pattern']}, got {got(pattern)}, which has no group (...) "
                         f"for the step")
    unknown = sorted(set(compiled.groupindex) - {"epoch", "step"})
    if unknown:
        nearest = next((name for name in ("epoch", "step") if name.startswith(unknown[0][:2].lower())), None)
        raise ValueError(f"expected {EXPECTED['progress.groups']}, got {got(pattern)}, whose group {unknown[0]!r} is "
                         f"neither" + (f" (did you mean {nearest!r}?)" if nearest else ""))
    if "epoch" in compiled.groupindex and compiled.groups < 2:
        raise ValueError(f"expected {EXPECTED['progress.epoch']}, got {got(pattern)}, which has only the epoch's")
    return pattern


class Progress(Model):
    """Where the job's step is read: its output lines (pattern), or a file it writes (file)."""

    pattern: Annotated[str, AfterValidator(_step_pattern)] | None = Field(
        None, min_length=1, description="a regular expression over each output line whose first group is the step; "
                                        "with a group named epoch, such as 'Epoch (?P<epoch>\\d+):.*?(\\d+)/\\d+', "
                                        "the step of each epoch (the group named step, else the first other one)")
    file: str | None = Field(None, min_length=1, description="a file the job writes its step into (relative to "
                                                            "the run directory), read every second")
    total: int | None = Field(None, ge=1, description="the job's last step: `podrun jobs` shows the share done and, "
                                                      "from the recent step rate, the time left")

    @model_validator(mode="after")
    def _exactly_one(self) -> Progress:
        if (self.pattern is None) == (self.file is None):
            raise ValueError(f"expected {EXPECTED['progress']}")
        return self


class WithOn(Model):
    """A mapping with an `on` key, which YAML 1.1 (PyYAML) reads as the boolean true, as GitHub Actions
    users know."""

    @model_validator(mode="before")
    @classmethod
    def _on_as_written(cls, data: Any) -> Any:
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if key is True else key): value for key, value in data.items()}
        return data


class Notify(WithOn):
    url: Annotated[str, AfterValidator(_http_url)] | None = Field(
        None, description="where each event is POSTed as JSON (a Slack or Discord incoming webhook works)")
    url_env: EnvKey | None = Field(None, description="the variable of podrun's environment that holds the URL, "
                                                     "so that its token is in no file (instead of url)")
    on: list[Annotated[NotifyEvent, BeforeValidator(lower_choice("notify.on.*", NOTIFY_EVENTS))]] = Field(
        default_factory=lambda: list(typing.get_args(NotifyEvent)), min_length=1,
        description="which events: failure, preemption, stall, restart, success and/or straggler (default: all)")

    @model_validator(mode="after")
    def _one_url(self) -> Notify:
        if (self.url is None) == (self.url_env is None):
            raise ValueError(f"expected {NOTIFY_URL}")
        return self

    def url_in(self, environ: Mapping[str, str]) -> str | None:
        """Where the events go: url, or url_env's value in `environ` (None where it is not there)."""
        return self.url or environ.get(self.url_env or "")


class Cost(Model):
    per_hour: float = Field(gt=0, lt=1e6, description="what the job's accelerators cost per hour, all workers "
                                                      "together; overrides podrun's Cloud TPU price table")


class Restarts(WithOn):
    max: int = Field(1, ge=0, le=100, description="how many times the job may restart (default 1)")
    on: list[Annotated[RestartCause, BeforeValidator(lower_choice("restarts.on.*", RESTART_CAUSES))]] | None = \
        Field(None, min_length=1,
              description="preemption (the TPU is created again), failure and/or stall (run again on the same "
                          "workers), time_limit (a Slurm job continued on a new allocation, not counted in max), or "
                          "the classes of a failure's cause (oom, collective, hardware, config, exception, signal, "
                          "lost, unknown: those failures alone; failure is every class but config); "
                          "default: [preemption] on a tpu target, [failure] elsewhere")
    exit_codes: list[Annotated[int, Field(ge=1, le=255)]] | None = Field(
        None, min_length=1, description="failure restarts only for these exit codes (default: any)")
    until_no_progress: int | None = Field(
        None, ge=1, le=100, description="stop restarting after this many attempts in a row that never got past the "
                                        "best step reached before (needs progress)")


PreflightCheck = Literal["devices", "versions", "disk", "network"]
PREFLIGHT_CHECKS: tuple[str, ...] = typing.get_args(PreflightCheck)


def _preflight(value: Any) -> Any:
    """`preflight: true` is every check; a list names some; `false` none."""
    if value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, list):
        return {"checks": value}
    return value


class Preflight(Model):
    """The health check on every worker before run (launch/health.py)."""

    checks: list[Annotated[PreflightCheck, BeforeValidator(lower_choice("preflight.checks.*", PREFLIGHT_CHECKS))]] \
        = Field(default_factory=lambda: list(typing.get_args(PreflightCheck)), min_length=1,
                description="devices (the accelerators the target promises are there and free), versions (one "
                            "Python and framework version everywhere), disk (free space where the job runs), "
                            "network (an all-reduce across every worker with the job's backend, and each worker's "
                            "bandwidth); default: all")
    min_free_gb: float = Field(10, ge=0, description="the free disk each worker must have where the job runs, in "
                                                     "GB of 2^30 bytes, as podrun shows sizes (default 10)")
    network_mib: int = Field(16, ge=1, le=4096, description="MiB each worker sends in each round of the network "
                                                            "check (default 16)")
    timeout_s: Annotated[float, BeforeValidator(lambda value: above_zero(value, "preflight.timeout")),
                         WithJsonSchema(DURATION_SCHEMA)] = Field(
        120, alias="timeout", description="how long the whole check may take, e.g. 2m (default)")


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
    on_preempt: str | None = Field(
        None, min_length=1, description="runs on each worker of a TPU VM as its own notice of a preemption or "
                                        "maintenance event comes, beside the job's SIGTERM, within the ~30 s the "
                                        "VM has left (upload a log, a last checkpoint)")
    stop_grace_s: StopGrace = Field(
        DEFAULT_STOP_GRACE_S, alias="stop_grace",
        description="how long a stopped job's processes get between SIGTERM and SIGKILL, to save a checkpoint: "
                    f"a duration such as {DURATION_EXAMPLES}, from 0s to 1h; default 30s")
    progress: Annotated[Progress, BeforeValidator(_progress)] | None = Field(
        None, description="the job's step: a regular expression over its output lines whose first group is the step, "
                          "such as 'step (\\d+)' (a step that starts over each epoch: with a group named epoch "
                          "before it, as in 'Epoch (?P<epoch>\\d+):.*?(\\d+)/\\d+'), or {file: PATH} that the job "
                          "writes its step into")
    stall_s: Annotated[float | Literal["auto"], BeforeValidator(parse_stall),
                       WithJsonSchema({"anyOf": [*DURATION_SCHEMA["anyOf"], {"const": "auto"}]})] | None = Field(
        None, alias="stall",
        description="stop the job (saving every worker's stacks) when no worker printed a line (with progress: no "
                    "worker's step advanced) for this long while run runs, e.g. 15m, or auto (with progress: a "
                    "multiple of the recent step time); default: never")
    stragglers_s: Annotated[float, BeforeValidator(lambda value: above_zero(value, "stragglers")),
                            WithJsonSchema(DURATION_SCHEMA)] | None = Field(
        None, alias="stragglers", description="sample every worker's stacks on this period while run runs, e.g. 30s, "
                                              "and name the worker that holds the others back in their collectives")
    preflight: Annotated[Preflight | None, BeforeValidator(_preflight)] = Field(
        None, description="a health check on every worker before run: true (every check) or a list of devices, "
                          "versions, disk, network; a worker that fails it is named, and swapped for a spare where "
                          "the target has one")
    delete_after: Annotated[DeleteAfter, BeforeValidator(lower_choice("delete_after", ("never", "success", "always")))] \
        = Field("never", description="delete the TPU VM when the job ends: never, success or always")
    restarts: Restarts | None = Field(None, description="restart the job on preemption, failure and/or stall")
    idle_delete_s: Annotated[float, BeforeValidator(parse_idle_delete), WithJsonSchema(DURATION_SCHEMA)] | None = Field(
        None, alias="idle_delete",
        description="delete the TPU VM podrun created for the job once no job has run on it for this long, e.g. 2h: "
                    "its worker 0 watches and deletes it with the VM's service account (roles/tpu.admin); "
                    "default: never")
    notify: Notify | None = Field(None, description="POST a JSON message to a URL on the job's events")
    cost: Cost | None = Field(None, description="the job's accelerators' price per hour")
    supervisor: Supervisor | None = Field(None, description="a host that runs the job's whole life (exec "
                                                            "--supervisor HOST)")
    _path: Path = PrivateAttr(Path("job.yaml"))  # the file it came from, for error messages

    @field_validator("stall_s")
    @classmethod
    def _auto_needs_progress(cls, value: Any, info: ValidationInfo) -> Any:
        if value == STALL_AUTO and info.data.get("progress") is None:
            raise ValueError("auto needs progress (the job's step) to measure its step time; add progress: "
                             "'step (\\d+)' or give a duration such as 15m")
        return value

    @field_validator("restarts")
    @classmethod
    def _until_no_progress_needs_progress(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and value.until_no_progress and info.data.get("progress") is None:
            raise ValueError("until_no_progress needs progress (the job's step): add progress: 'step (\\d+)'")
        return value

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


def json_schema() -> dict:
    schema = JobSpec.model_json_schema()
    schema["required"].remove("name")  # the file's stem when the file does not say
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "podrun job spec"
    return schema
