"""`podrun exec` and `podrun validate`: load the spec, plan it, then print the plan or launch it."""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable, Iterable

from podrun import jobstore
from podrun.adhoc import COMMAND_LINE
from podrun.commands.exec_options import ExecOptions
from podrun.errors import SpecError, UsageError
from podrun.output import ask, say
from podrun.plan import render, secrets_from_launcher
from podrun.shipping import scan
from podrun.spec import ENV_KEY_PATTERN, RESERVED_ENV, JobSpec, parse_stall, parse_stop_grace
from podrun.spec_commands import check_run_script
from podrun.spec_loading import load_spec
from podrun.targets.base import target_for


def validate(spec_path: str) -> JobSpec:
    spec = load_spec(spec_path)
    check_run_script(spec)
    warn_of_written_secrets(spec)
    say(f"{spec_path}: valid; job {spec.name!r} on {spec.target.declared.summary(spec.target.options)}")
    return spec


def execute(spec: JobSpec, ships_code: bool, options: ExecOptions, job_id: str | None = None,
            on_running: Callable[[], None] | None = None) -> int:
    """Run the spec's job; `ships_code`: ship its workdir (an ad-hoc command without --workdir ships none).
    `job_id` and `on_running` (called once run has started everywhere) are a supervisor's (supervisor/daemon.py)."""
    if ships_code:
        check_run_script(spec)
    secrets_from_launcher(spec, os.environ)  # a secret_env not exported is an error, said before any warning
    warn_of_written_secrets(spec)
    extra_env = parse_env_overrides(options.env)
    grace_s = parse_grace(options.grace)
    if options.stall is not None:
        spec = spec.model_copy(update={"stall_s": parse_stall_flag(options.stall)})
    max_restarts = parse_restarts(spec, options.restarts)
    if options.down and not spec.target.declared.deletes:
        raise UsageError(f"--down: deletes the TPU the job ran on, but {spec.path} runs on {spec.target.kind} workers")
    if supervisor := options.supervisor or (spec.supervisor and spec.supervisor.host):
        from podrun.supervisor import handover

        tree = _scan(spec, options.dry_run, options.allow_large_workdir) if ships_code else None
        return handover.hand_over(spec, supervisor, tree, options)
    from podrun.launch.lifecycle import Lifecycle  # here: validate and a spec refused above never load asyncio

    target = target_for(spec)
    tree = _scan(spec, options.dry_run, options.allow_large_workdir) if ships_code else None
    lifecycle = Lifecycle(spec, target, tree, extra_env, options.kill_stale, options.detach, max_restarts, options.down,
                          options.collapse, options.raw)
    if options.dry_run:
        workers = target.workers(dry_run=True)
        job = lifecycle.plans(workers, parse_worker_selection(options.worker, len(workers)),
                              job_id or jobstore.new_job_id(spec.name), attempt=0)
        sys.stdout.write(render(job.workers, f"target: {target.describe(workers)}", job))
        return 0
    return lifecycle.run(functools.partial(parse_worker_selection, options.worker),
                         spec.stop_grace_s if grace_s is None else grace_s, job_id, on_running)


def _scan(spec: JobSpec, dry_run: bool, allow_large_workdir: bool) -> scan.Tree:
    def ship_large(too_large: scan.WorkdirTooLarge) -> bool:
        """--allow-large-workdir, or a yes on a terminal; off one, the stop says what to do."""
        if allow_large_workdir:
            return True
        if not (sys.stdin.isatty() and sys.stderr.isatty()):
            return False
        say(f"{spec.path}: workdir: {spec.workdir}: {too_large.found}")
        if ask("ship it all? (--allow-large-workdir ships it without asking)"):
            return True
        raise SpecError(spec.path, "workdir", f"{spec.workdir}: not shipped; exclude what the job does not need in "
                                              f".podrunignore, or point workdir: at the code")

    try:
        return scan.scan(spec.workdir, remember=not dry_run, ship_large=ship_large, left_home=_spec_in_workdir(spec))
    except scan.WorkdirTooLarge as error:
        raise SpecError(spec.path, "workdir", f"{spec.workdir}: {error}") from None


def _spec_in_workdir(spec: JobSpec) -> str | None:
    """The spec file's path in its workdir, where it is in it: it never ships (its env may hold secrets)."""
    if spec.path == COMMAND_LINE:
        return None
    try:
        return spec.path.resolve().relative_to(spec.workdir).as_posix()
    except ValueError:
        return None


def warn_of_written_secrets(spec: JobSpec) -> None:
    """One line per secret whose value is written in the spec file, where whoever reads the file reads it."""
    for key in spec.written_secrets():
        say(f"{spec.path}: env.{key}: a secret's value is written in the spec, readable by whoever can read the "
            f"file; keep it out: drop it from env, list it in secret_env ([{key}]) and `export {key}=...` before "
            f"podrun runs (secret_env takes it from podrun's environment)")


def parse_restarts(spec: JobSpec, restarts: int | None) -> int:
    """restarts.max, or --restarts N; restarts on preemption need a TPU podrun can create again."""
    if restarts is None:
        return spec.restarts.max if spec.restarts else 0
    if restarts and "preemption" in spec.restart_on and not spec.target.declared.recreates(spec.target.options):
        raise UsageError(f"--restarts {restarts}: restarts on preemption need a tpu target with accelerator_type "
                         f"(podrun creates it again); {spec.path} has none. To restart failures, set "
                         f"`restarts: {{on: [failure]}}` in the spec")
    return restarts


def parse_grace(grace: str | None) -> float | None:
    if grace is None:
        return None
    try:
        return parse_stop_grace(grace)
    except ValueError as error:
        raise UsageError(f"--grace {grace!r}: {error}") from None


def parse_stall_flag(stall: str) -> float:
    try:
        return parse_stall(stall)
    except ValueError as error:
        raise UsageError(f"--stall {stall!r}: {error}") from None


def parse_env_overrides(assignments: Iterable[str]) -> dict[str, str]:
    env = {}
    for assignment in assignments:
        key, equals, value = assignment.partition("=")
        if not equals or not re.match(ENV_KEY_PATTERN, key):
            raise UsageError(f"--env {assignment!r}: expected KEY=VALUE with KEY a variable name")
        if key in RESERVED_ENV:
            raise UsageError(f"--env {key}: set by podrun on every worker and cannot be overridden")
        env[key] = value
    return env


def parse_worker_selection(selection: str | None, count: int) -> set[int]:
    """`--worker` as gcloud takes it: "all", or indexes and ranges such as 0,2-3."""
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
