"""A job run from this machine: on the laptop for `podrun exec`, on a supervisor host for a job
handed to it (supervisor/daemon.py). The spec checked and changed as the flags say, the target
resolved, the workdir scanned, then the plan printed (--dry-run) or the job's whole life run
(lifecycle.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from podrun import jobstore
from podrun.errors import SpecError, UsageError
from podrun.launch import control_tree
from podrun.launch.exec_options import ExecOptions
from podrun.launch.kept import Kept
from podrun.notify import url_from_launcher
from podrun.output import ask, say
from podrun.plan import parse_worker_selection, render, secrets_from_launcher
from podrun.shipping import scan
from podrun.spec.adhoc import COMMAND_LINE
from podrun.spec.commands import check_run_script
from podrun.spec.model import JobSpec
from podrun.targets.base import target_for


def run_here(spec: JobSpec, ships_code: bool, options: ExecOptions, job_id: str | None = None,
             on_running: Callable[[], None] | None = None, kept: Kept | None = None) -> int:
    """Run the spec's job; `ships_code`: ship its workdir (an ad-hoc command without --workdir ships none).
    `job_id`, `on_running` (called once run has started everywhere) and `kept` are a supervisor host's."""
    spec, max_restarts = prepare(spec, ships_code, options)
    lifecycle = _lifecycle(spec, ships_code, options, max_restarts, kept, begin=not options.dry_run)
    target = lifecycle.target
    if options.dry_run:
        workers = target.workers(dry_run=True)
        job = lifecycle.plans(workers, parse_worker_selection(options.worker, len(workers)),
                              job_id or jobstore.new_job_id(spec.name), attempt=0)
        sys.stdout.write(render(job.workers, f"target: {target.describe(workers)}{control_tree.described(job)}", job))
        return 0
    return lifecycle.run(options.worker, spec.stop_grace_s if options.grace_s is None else options.grace_s, job_id,
                         on_running)


def adopt_here(spec: JobSpec, ships_code: bool, options: ExecOptions, record: jobstore.JobRecord) -> int:
    """A supervisor host's running job, taken up again by a supervisor started anew (supervisor/adopt.py):
    what the handover said, less the secrets' values, which this process's environment gives where a
    restart needs them."""
    if options.stall_s is not None:
        spec = spec.model_copy(update={"stall_s": options.stall_s})
    lifecycle = _lifecycle(spec, ships_code, options, _max_restarts(spec, options.restarts), Kept.here(False))
    from podrun.launch import adoption

    return adoption.adopt(lifecycle, record, spec.stop_grace_s if options.grace_s is None else options.grace_s)


def _lifecycle(spec: JobSpec, ships_code: bool, options: ExecOptions, max_restarts: int, kept: Kept | None,
               begin: bool = False):
    """`begin`: the target starts asking what its provision needs (Target.begin) while the rest loads."""
    target = target_for(spec)
    if begin:
        target.capacity.begin()
    from podrun.launch.lifecycle import Lifecycle  # here: a spec refused before never loads asyncio

    tree = scan_workdir(spec, options.dry_run, options.allow_large_workdir) if ships_code else None
    return Lifecycle(spec, target, tree, options.env, options.kill_stale, options.detach, max_restarts,
                     options.down, options.collapse, options.raw, kept)


def prepare(spec: JobSpec, ships_code: bool, options: ExecOptions) -> tuple[JobSpec, int]:
    """What every run checks first, here or before a handover: the spec as the flags change it (--stall),
    and the restarts it gets; what cannot run is a SpecError or UsageError."""
    if ships_code:
        check_run_script(spec)
    secrets_from_launcher(spec, os.environ)  # a secret_env not exported is an error, said before any warning
    url_from_launcher(spec, os.environ)
    warn_of_doubts(spec)
    if options.stall_s == "auto" and spec.progress is None:
        raise UsageError(f"--stall auto: needs progress (the job's step) in {spec.path}, such as progress: "
                         f"'step (\\d+)'; or give a duration such as 15m")
    if options.stall_s is not None:
        spec = spec.model_copy(update={"stall_s": options.stall_s})
    max_restarts = _max_restarts(spec, options.restarts)
    if options.down and not spec.target.declared.deletes:
        raise UsageError(f"--down: deletes the TPU the job ran on, but {spec.path} runs on {spec.target.kind} workers")
    return spec, max_restarts


def _max_restarts(spec: JobSpec, restarts: int | None) -> int:
    """restarts.max, or --restarts N; restarts on preemption need a TPU podrun can create again."""
    if restarts is None:
        return spec.restarts.max if spec.restarts else 0
    if restarts and "preemption" in spec.restart_on and not spec.target.declared.recreates(spec.target.options):
        raise UsageError(f"--restarts {restarts}: restarts on preemption need a tpu target with accelerator_type "
                         f"(podrun creates it again); {spec.path} has none. To restart failures, set "
                         f"`restarts: {{on: [failure]}}` in the spec")
    return restarts


def scan_workdir(spec: JobSpec, dry_run: bool, allow_large_workdir: bool) -> scan.Tree:
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


def warn_of_doubts(spec: JobSpec) -> None:
    """One line per thing the spec says that may be wrong but is not refused: a secret whose value is
    written in the file, where whoever reads the file reads it; what the target's kind doubts (kind.py)."""
    for key in spec.written_secrets():
        say(f"{spec.path}: env.{key}: a secret's value is written in the spec, readable by whoever can read the "
            f"file; keep it out: drop it from env, list it in secret_env ([{key}]) and `export {key}=...` before "
            f"podrun runs (secret_env takes it from podrun's environment)")
    for field, doubt in spec.target.declared.doubts(spec.target.options):
        say(f"{spec.path}: target.{spec.target.kind}.{field}: {doubt}")
