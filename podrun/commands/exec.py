"""`podrun exec` and `podrun validate`: load the spec, then run the job here (launch/run_here.py) or
hand it to a supervisor host (supervisor/handover.py)."""

from __future__ import annotations

from podrun.launch.exec_options import ExecOptions
from podrun.launch.run_here import prepare, run_here, scan_workdir, warn_of_doubts
from podrun.output import say
from podrun.spec.commands import check_run_script
from podrun.spec.loading import load_spec
from podrun.spec.model import JobSpec
from podrun.supervisor.early import Begun


def validate(spec_path: str) -> JobSpec:
    spec = load_spec(spec_path)
    check_run_script(spec)
    warn_of_doubts(spec)
    say(f"{spec_path}: valid; job {spec.name!r} on {spec.target.declared.summary(spec.target.options)}")
    return spec


def execute(spec: JobSpec, ships_code: bool, options: ExecOptions, begun: Begun | None = None) -> int:
    """Run the spec's job, here or on its supervisor host; `ships_code`: ship its workdir (an ad-hoc
    command without --workdir ships none); `begun`: the handover begun while the spec loaded."""
    if supervisor := options.supervisor or (spec.supervisor and spec.supervisor.host):
        from podrun.supervisor import handover

        spec, _ = prepare(spec, ships_code, options)  # the supervisor runs the job with its own run_here
        tree = scan_workdir(spec, options.dry_run, options.allow_large_workdir) if ships_code else None
        return handover.hand_over(spec, supervisor, tree, options, begun)
    return run_here(spec, ships_code, options)
