"""What every worker runs: its environment and commands (docs/spec.md, "What every worker gets"). Pure: no I/O.

`podrun exec --dry-run` prints the plan; `podrun exec` executes the same plan.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from podrun import paths
from podrun.errors import SpecError, UsageError
from podrun.remote import interfaces
from podrun.spec.commands import check_command_size
from podrun.spec.model import DEFAULT_RDZV_PORT, Docker, JobSpec
from podrun.targets.base import Target, Worker

SECRET_SHOWN_AS = "<secret>"
CONTAINER_SHELL_TRAP = "trap 'exit 143' TERM\n"  # see _in_docker
# what the agent's probe does before the first step (remote/interfaces.py), as a shell does it: where
# this host's name resolves to loopback and the job names neither variable, both name the interface of
# the route to MASTER_ADDR (lo when it is this host's own address: then the interface holding it)
LOOPBACK_CHECK = """\
if [ -z "$GLOO_SOCKET_IFNAME$NCCL_SOCKET_IFNAME" ]; then
  case "$(getent ahosts "$(uname -n)" | awk 'NR == 1 {print $1}')" in ''|::1|127.*)
    ifname=$(ip -o route get "$MASTER_ADDR" | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p')
    [ "$ifname" != lo ] || ifname=$(ip -o -4 addr show to "$MASTER_ADDR/32" | awk '{print $2; exit}')
    [ -z "$ifname" ] || export GLOO_SOCKET_IFNAME="$ifname" NCCL_SOCKET_IFNAME="$ifname";;
  esac
fi"""
FILE_END = "PODRUN_FILE_END"
# every worker gets the workers' IPs as a file in its job's directory, one a line, and as
# PODRUN_WORKER_IPS while that stays this small: each variable is one argument of the job's execve,
# and Linux takes at most 128 KiB in one (10,000 workers' IPs take 133 KB)
WORKER_IPS_FILE = "worker_ips"
MAX_WORKER_IPS_VARIABLE = 32 * 1024
# the variables the agent sets to a file of the job's directory (it knows the directory's absolute path)
FILE_VARIABLES = {"PODRUN_WORKER_IPS_FILE": WORKER_IPS_FILE}
# --dry-run shows this many workers in full; each worker after them, only where it differs from worker 0
WORKERS_SHOWN_IN_FULL = 8


@dataclass(frozen=True)
class WorkerPlan:
    worker: Worker
    cwd: str  # where the job runs, relative to the worker's root: its name's run directory (paths.remote_run_dir)
    code_dir: str  # the code version that the agent checks out there (remote/checkout.py); "": none, cwd is the root
    job_dir: str  # the job's files on the worker, this attempt's (paths.remote_job_dir)
    env: dict[str, str]
    setup: str | None
    run: str
    secret_keys: frozenset[str]
    worker_ips: str = ""  # the workers' internal IPs, one a line: the job's directory's WORKER_IPS_FILE
    container: str | None = None  # the docker container run runs in: stopped by name
    # torchrun passes SIGTERM on to its ranks: the agent signals it alone, or each rank got two
    term_leader_only: bool = False
    on_preempt: str | None = None  # the spec's: what run's agent starts on the VM's own notice (remote/step.py)

    def shown_env(self) -> dict[str, str]:
        return {key: SECRET_SHOWN_AS if key in self.secret_keys else value for key, value in self.env.items()}


@dataclass(frozen=True)
class JobPlan:
    """What runs, for the whole job, decided once from the spec: launch/ executes it as it is, and
    `--dry-run` prints it (render)."""

    workers: list[WorkerPlan]  # the selected workers' plans, in worker order
    code_dir: str  # the code version shipped to the workers that lack it; "": nothing ships
    steps: tuple[str, ...]  # ("setup", "run") or ("run",)
    checks: dict[str, tuple[str, ...]]  # what is checked on every worker before each step (CHECKS), in order
    rendezvous_port: int | None  # torchrun's, on worker 0
    stall_s: float | str | None  # the spec's `stall`: seconds, or "auto" (launch/stall.py)
    progress: dict | None = None  # the spec's `progress`: {"pattern": REGEX} or {"file": PATH}
    # the spec's `preflight` (launch/health.py), with the devices the target promises and the job's backend
    preflight: dict | None = None
    stragglers_s: float | None = None  # the spec's `stragglers`: how often run's stacks are sampled


# what each check proves before a step (launch/preflight.py does them)
CHECKS = {"docker": "every worker has docker",
          "torchrun": "every worker finds torchrun, of one torch version",
          "rendezvous": "worker 0's rendezvous port is free and every worker reaches it",
          "health": "every worker passes the spec's preflight"}


def parse_worker_selection(selection: str | None, count: int) -> set[int]:
    """`--worker` as gcloud takes it: "all", or indexes and ranges such as 0,2-3, of `count` workers."""
    if selection is None or selection == "all":
        return set(range(count))
    chosen: set[int] = set()
    for part in selection.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise UsageError(f"--worker {selection!r}: expected 'all' or indexes like 0,2-3") from None
        if not 0 <= first <= last < count:
            raise UsageError(f"--worker {selection!r}: this target has workers 0 to {count - 1}")
        chosen.update(range(first, last + 1))
    return chosen


def job_plan(spec: JobSpec, target: Target, workers: list[Worker], job_id: str, code_dir: str,
             extra_env: Mapping[str, str], launcher_env: Mapping[str, str], attempt: int = 0,
             selected: set[int] | None = None) -> JobPlan:
    """The job's plan, on the `selected` workers (default: all): plan()'s per worker, and the steps
    with the checks before each. torchrun is checked once setup (which may install it) has run, except
    in a container, which brings its own; the rendezvous before the first step and again before run."""
    plans = [worker_plan for worker_plan in plan(spec, target, workers, job_id, code_dir, extra_env, launcher_env,
                                                 attempt) if selected is None or worker_plan.worker.index in selected]
    steps = ("setup", "run") if spec.setup else ("run",)
    torchrun: tuple[str, ...] = ("torchrun",) if spec.torchrun and not spec.docker else ()
    torchrun += ("health",) * bool(spec.preflight)
    rendezvous = ("rendezvous",) if spec.torchrun else ()
    checks = {steps[0]: ("docker",) * bool(spec.docker) + (rendezvous if spec.setup else torchrun + rendezvous)}
    if spec.setup:
        checks["run"] = torchrun + rendezvous
    return JobPlan(plans, code_dir, steps, checks, spec.torchrun.port if spec.torchrun else None, spec.stall_s,
                   spec.progress.model_dump(exclude_none=True) if spec.progress else None, preflight(spec, target),
                   spec.stragglers_s)


def preflight(spec: JobSpec, target: Target) -> dict | None:
    """What launch/health.py checks: the spec's preflight, the devices the target promises each worker, the
    job's backend. In a container the image brings the job's Python: only its devices and disk are checked."""
    if not spec.preflight:
        return None
    checks = [check for check in spec.preflight.checks if not spec.docker or check in ("devices", "disk")]
    device = spec.device or target.default_device
    return {**spec.preflight.model_dump(by_alias=False), "checks": checks, "devices": target.promised_devices(),
            "backend": "nccl" if device in ("CUDA", "ROCM") else "gloo"}


def plan(spec: JobSpec, target: Target, workers: list[Worker], job_id: str, code_dir: str,
         extra_env: Mapping[str, str], launcher_env: Mapping[str, str], attempt: int = 0) -> list[WorkerPlan]:
    """One WorkerPlan per worker, in worker order. `extra_env` is `--env K=V` from the command line;
    `launcher_env` supplies secret_env keys that the spec names but does not set; `attempt` counts the
    job's restarts (`restarts`)."""
    user_env = {**spec.env, **secrets_from_launcher(spec, launcher_env), **extra_env}
    secret_keys = frozenset(key for key in user_env if spec.is_secret(key))
    port = spec.torchrun.port if spec.torchrun else DEFAULT_RDZV_PORT
    master_addr = workers[0].internal_ip
    worker_ips = ",".join(worker.internal_ip for worker in workers)  # one string that every plan shares
    ips_variable = {"PODRUN_WORKER_IPS": worker_ips} if len(worker_ips) <= MAX_WORKER_IPS_VARIABLE else {}
    ips_file = "".join(f"{worker.internal_ip}\n" for worker in workers)
    plans = []
    # what the target keeps from torchrun's ranks (Slurm's step variables), unless the job's env sets it; a
    # container is not passed them anyway
    removed_from_ranks = [] if spec.docker else [name for name in target.rank_env_removed if name not in user_env]
    for worker in workers:
        env = {
            "PJRT_DEVICE": spec.device or target.default_device,
            "PODRUN_JOB_ID": job_id,
            "PODRUN_ATTEMPT": str(attempt),
            "PODRUN_WORKER": str(worker.index),
            "PODRUN_NUM_WORKERS": str(len(workers)),
            **ips_variable,
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(port),
            **target.worker_env(worker, workers),
            **user_env,
        }
        _megascale_ports_agree(env, user_env)
        run = spec.run
        container = f"podrun-{job_id}-w{worker.index}" if spec.docker else None
        if spec.torchrun:
            # torchrun runs each rank as rank_output.py SCRIPT ARGS (the agent puts it in the job's
            # directory): its lines reach the worker's output whole and marked with the rank
            run = (f"torchrun --nnodes={len(workers)} --node_rank={worker.index}"
                   f" --nproc_per_node={spec.torchrun.nproc_per_node}"
                   f' --rdzv_endpoint={master_addr}:{port} "$PODRUN_JOB_DIR/rank_output.py" {run}')
            if removed_from_ranks:
                run = f"env -u {' -u '.join(removed_from_ranks)} {run}"
        if container and spec.docker:
            run = _in_docker(spec.docker, target.container_flags, container, list(env), run)
        check_command_size(spec.path, "run", run)
        cwd = paths.remote_run_dir(spec.name) if code_dir else "."
        job_dir = paths.remote_job_dir(job_id, attempt, worker.index if target.shares_root else None)
        plans.append(WorkerPlan(worker, cwd, code_dir, job_dir, env, spec.setup, run, secret_keys, ips_file, container,
                                term_leader_only=bool(spec.torchrun), on_preempt=spec.on_preempt))
    return plans


def checks_interfaces(plans: list[WorkerPlan]) -> bool:
    """Whether the first step's agents look for the loopback trap (remote/interfaces.py): only where
    several workers reach each other over a network, and the job names no interface itself."""
    master_addr = plans[0].env["MASTER_ADDR"]
    return (len(plans) > 1 and not interfaces.is_loopback(master_addr)
            and not any(name in plans[0].env for name in interfaces.VARIABLES))


def job_files(worker_plan: WorkerPlan, step: str = "run") -> dict[str, str]:
    """What the agent writes into the job's directory before a step, by name: the workers' IPs, and
    for the run under torchrun, the wrapper each rank runs behind (podrun's own source, read here)."""
    from podrun.transport.base import remote_source

    files = {WORKER_IPS_FILE: worker_plan.worker_ips}
    if step == "run" and worker_plan.term_leader_only:
        files["rank_output.py"] = remote_source("rank_output").decode()
    return files


def render(plans: list[WorkerPlan], title: str | None = None, job: JobPlan | None = None) -> str:
    """The plan as the shell script each worker runs, secrets hidden: run as it is, in the worker's
    starting environment, it does what the agent does; `title` (what the job runs on) as a comment first,
    then the `job`'s steps and checks. Past WORKERS_SHOWN_IN_FULL workers, each after worker 0 shows only
    its lines that differ from worker 0's, so that the script grows with the workers, not with their square."""
    blocks = [f"# {title}"] if title else []
    if job:
        blocks[-1:] = ["\n".join([*blocks[-1:], *_steps_and_checks(job)])]
    interfaces_checked = checks_interfaces(plans)
    first: list[str] = []
    for worker_plan in plans:
        lines = _worker_script(worker_plan, interfaces_checked)
        if not first:
            first = lines
        elif len(plans) > WORKERS_SHOWN_IN_FULL and len(lines) == len(first):
            differing = [line for line, line_0 in zip(lines[1:], first[1:]) if line != line_0]
            lines = [lines[0] + ": as worker 0, except:", *differing]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _steps_and_checks(job: JobPlan) -> list[str]:
    lines = [f"# steps: {', '.join(job.steps)}" + (f", once the code is in ~/{job.code_dir} on every worker (shipped "
                                                    f"where it is not)" if job.code_dir else "")]
    for step in job.steps:
        for check in job.checks.get(step, ()):
            port = f" (port {job.rendezvous_port})" if check == "rendezvous" else ""
            lines.append(f"# checked before {step}: {CHECKS[check]}{port}")
    if job.progress:
        source = f"lines matching '{job.progress['pattern']}'" if "pattern" in job.progress else \
            f"the file {job.progress['file']} in the run directory"
        lines.append(f"# each worker's step is read from {source} (progress)")
    if job.stall_s:
        silence = "no worker's step advances" if job.progress else "no worker prints a line"
        bound = "a multiple of the recent step time" if job.stall_s == "auto" else f"{job.stall_s:g}s"
        lines.append(f"# run stops if {silence} for {bound} (stall); stacks are saved first")
    return lines


def _worker_script(worker_plan: WorkerPlan, interfaces_checked: bool) -> list[str]:
    """The lines of one worker's part of render(): its header comment first."""
    worker = worker_plan.worker
    root = '"$HOME"' if worker.transport.root == "~" else shlex.quote(worker.transport.root)
    lines = [f"# worker {worker.index}: {worker.address} (internal IP {worker.internal_ip})",
             f"# environment: {worker.transport.starting_environment()}, then:",
             f"cd {worker.transport.root}" + ("" if worker_plan.cwd == "." else f"/{worker_plan.cwd}")]
    lines += [f"export PODRUN_JOB_DIR={root}/{shlex.quote(worker_plan.job_dir)}",
              '(umask 077 && mkdir -p "$PODRUN_JOB_DIR")']
    lines += [f'export {key}="$PODRUN_JOB_DIR/{name}"' for key, name in FILE_VARIABLES.items()]
    for name, text in job_files(worker_plan).items():
        lines.append(f"cat > \"$PODRUN_JOB_DIR/{name}\" <<'{FILE_END}'\n{text.rstrip()}\n{FILE_END}")
    if "PODRUN_WORKER_IPS" not in worker_plan.env:
        lines.append(f"# PODRUN_WORKER_IPS is not set: the {worker_plan.env['PODRUN_NUM_WORKERS']} workers' IPs "
                     f"take over {MAX_WORKER_IPS_VARIABLE // 1024} KiB; read $PODRUN_WORKER_IPS_FILE")
    lines += [f"export {key}={shlex.quote(value)}" for key, value in worker_plan.shown_env().items()]
    if interfaces_checked:
        lines.append(LOOPBACK_CHECK)
    if worker_plan.setup:
        lines.append(f"{worker_plan.setup}  # setup")
    lines.append(worker_plan.run)
    return lines


def _megascale_ports_agree(env: dict[str, str], user_env: Mapping[str, str]) -> None:
    """On a multislice, MEGASCALE_COORDINATOR_ADDRESS (host:port) and MEGASCALE_PORT name one port, as
    the queued-resource service writes them: where the user set one of the two, the other follows it."""
    address, port = env.get("MEGASCALE_COORDINATOR_ADDRESS"), env.get("MEGASCALE_PORT")
    if address is None or port is None:
        return
    host, colon, address_port = address.rpartition(":")
    if "MEGASCALE_PORT" in user_env and "MEGASCALE_COORDINATOR_ADDRESS" not in user_env and colon:
        env["MEGASCALE_COORDINATOR_ADDRESS"] = f"{host}:{port}"
    elif "MEGASCALE_COORDINATOR_ADDRESS" in user_env and "MEGASCALE_PORT" not in user_env and address_port.isdigit():
        env["MEGASCALE_PORT"] = address_port


def secrets_from_launcher(spec: JobSpec, launcher_env: Mapping[str, str]) -> dict[str, str]:
    missing = [key for key in spec.secret_env if key not in spec.env]
    for position, key in enumerate(spec.secret_env):
        if key in missing and key not in launcher_env:
            raise SpecError(spec.path, f"secret_env.{position}",
                            f"{key} is neither set in env nor in podrun's environment; export it first")
    return {key: launcher_env[key] for key in missing}


def _in_docker(docker: Docker, target_flags: tuple[str, ...], container: str, env_keys: list[str], run: str) -> str:
    # --net=host: workers rendezvous on the host's addresses; the code dir is mounted at its own path.
    # --init: `docker stop` signals only the container's PID 1, and a shell there ignores SIGTERM (the
    # kernel drops it for a PID 1 without a handler): docker's init passes it, once, to the shell's
    # whole process group, and the shell's trap waits for the job to finish saving before it exits
    argv = ["docker", "run", "--rm", "--net=host", f"--name={container}", "--init", "--env=TINI_KILL_PROCESS_GROUP=1"]
    argv += target_flags
    # values come from the agent's environment, not argv; PODRUN_JOB_DIR is the agent's own, and the
    # interface variables are the agent's where it sets them (remote/interfaces.py; docker passes a
    # variable named here only when it is set)
    passed = dict.fromkeys([*env_keys, *interfaces.VARIABLES, "PODRUN_JOB_DIR", *FILE_VARIABLES])
    argv += [f"--env={key}" for key in passed]
    argv += [*docker.args, docker.image]
    # the run directory is the container's working directory; the job's directory holds rank_output.py
    mount = '-v "$PWD:$PWD" -w "$PWD" -v "$PODRUN_JOB_DIR:$PODRUN_JOB_DIR"'
    return f"{shlex.join(argv[:5])} {mount} {shlex.join(argv[5:])} sh -c {shlex.quote(CONTAINER_SHELL_TRAP + run)}"
