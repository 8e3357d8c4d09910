"""`podrun exec` and `podrun validate`: load the spec, plan it, then print the plan or launch it."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import sys

from podrun import jobstore, paths
from podrun.errors import SpecError, UsageError
from podrun.launch.launcher import Launch
from podrun.output import Terminal, counted, say
from podrun.plan import plan, render
from podrun.shipping import scan
from podrun.spec import ENV_KEY_PATTERN, RESERVED_ENV, JobSpec, check_run_script, load_spec, parse_stop_grace
from podrun.targets import target_for


def validate(spec_path: str) -> JobSpec:
    spec = load_spec(spec_path)
    check_run_script(spec)
    say(f"{spec_path}: valid; job {spec.name!r} on {spec.target.kind} workers")
    return spec


def execute(spec_path: str, dry_run: bool, worker_selection: str | None, env_overrides: list[str],
            detach: bool = False, kill_stale: bool = False, allow_large_workdir: bool = False,
            grace: str | None = None) -> int:
    spec = load_spec(spec_path)
    check_run_script(spec)
    extra_env = parse_env_overrides(env_overrides)
    grace_s = parse_grace(grace)
    target = target_for(spec)
    workers = target.workers(dry_run)
    selected = parse_worker_selection(worker_selection, len(workers))
    try:
        tree = scan.scan(spec.workdir, remember=not dry_run, allow_large=allow_large_workdir)
    except scan.WorkdirTooLarge as error:
        raise SpecError(spec.path, "workdir", f"{spec.workdir}: {error}") from None
    job_id = jobstore.new_job_id(spec.name)
    code_dir = paths.remote_code_dir(spec.name, tree.digest)
    plans = [worker_plan for worker_plan in plan(spec, target, workers, job_id, code_dir, extra_env,
                                                       os.environ)
             if worker_plan.worker.index in selected]
    if dry_run:
        sys.stdout.write(render(plans, f"target: {target.describe(workers)}"))
        return 0
    record = jobstore.JobRecord(
        id=job_id, name=spec.name, target=f"{spec.target.kind}:{len(workers)}", spec_path=str(spec.path),
        workers=[jobstore.WorkerRecord(p.worker.index, p.worker.address, endpoint=p.worker.transport.endpoint())
                 for p in plans], stop_grace_s=spec.stop_grace_s if grace_s is None else grace_s)
    record.create()
    say(f"job {job_id}: {counted(len(plans), target.worker_noun)}; logs in {record.dir}")
    gc.freeze()  # what start-up made (cli._exec turned the collector off for it) is never collected
    gc.enable()
    return asyncio.run(Launch(spec, target, plans, tree, record, Terminal(worker_count=len(workers)), detach,
                                kill_stale).run())


def parse_grace(grace: str | None) -> float | None:
    if grace is None:
        return None
    try:
        return parse_stop_grace(grace)
    except ValueError as error:
        raise UsageError(f"--grace {grace!r}: {error}") from None


def parse_env_overrides(assignments: list[str]) -> dict[str, str]:
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
