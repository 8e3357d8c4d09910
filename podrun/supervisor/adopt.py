"""`podrun supervisor start`: on a supervisor host, after its supervisor processes were killed or its
VM rebooted, adopt again every job it kept (launch/kept.py) that nothing keeps now: a job whose
record reads running is followed where it is (its run, or the attempt it was between), and one
whose launcher was cut off before its record began (during its TPU's creation) is begun again with
the same id. Each gets a supervisor process of its own, as the handover's was (daemon.py), which says
what it does in the job's console files. A job whose supervisor lives is left to it: its lock says so.

What the handover said is in the job's RESUME_FILE, less the secrets' values: this process's
environment gives them (for the boot's unit: boot.py), where a restart needs them.
"""

from __future__ import annotations

import json
import os
import traceback

from podrun import exits, jobstore, paths
from podrun.errors import PodrunError
from podrun.launch import kept
from podrun.launch.exec_options import ExecOptions
from podrun.output import counted, say, say_success
from podrun.spec.model import JobSpec
from podrun.supervisor import boot


def start() -> int:
    adopted = []
    for job_id in sorted(jobstore.job_ids()):
        job_dir = os.path.join(paths.jobs_dir(), job_id)
        if not os.path.exists(os.path.join(job_dir, kept.RESUME_FILE)) or not kept.kept_by_nobody(job_dir):
            continue
        try:
            record = jobstore.load_if_there(job_id)
        except PodrunError as error:
            say(f"{error}: not adopted")
            continue
        if record is not None and record.state != jobstore.RUNNING:  # it ended: nothing to adopt
            kept.forget(job_dir)
            continue
        if not _fork_supervisor(job_id, job_dir, record):  # another `supervisor start` came first
            continue
        adopted.append(job_id)
        say(f"job {job_id}: adopted again; " + ("its supervisor follows it" if record else
                                                "begun again, its launcher was cut off before it ran")
            + f" (what it says: {os.path.join(job_dir, 'console', 'stderr')})")
    if adopted:
        say_success(f"{counted(len(adopted), 'job')} adopted again")
    else:
        say("no job of this host's is without its supervisor")
    return 0


def _fork_supervisor(job_id: str, job_dir: str, record: jobstore.JobRecord | None) -> bool:
    """Whether the forked supervisor took the job: it says so once it holds the job's lock and the record
    names it as the job's supervisor, so that what is read of the job from then on (`podrun jobs`) finds
    it there, not the one that was killed."""
    taken_read, taken_write = os.pipe()
    if os.fork():
        os.close(taken_write)
        with open(taken_read, "rb") as taken:
            return taken.read(1) == b"y"  # nothing: the child did not take it, or ended first
    os.close(taken_read)
    os.setsid()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.dup2(os.open(os.path.join(job_dir, "console", "stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), 2)
    code = exits.INTERNAL_ERROR
    try:
        if kept.take_lock(job_dir):  # else another `supervisor start` came first
            if record is not None:
                record.supervisor = jobstore.process_identity(os.getpid())
                record.save()
            os.write(taken_write, b"y")
            os.close(taken_write)  # not the job's processes' to inherit
            code = _supervise(job_id, job_dir, record)
    except PodrunError as error:
        say(f"job {job_id}: not adopted again: {error}")
        code = error.exit_code
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _supervise(job_id: str, job_dir: str, record: jobstore.JobRecord | None) -> int:
    from podrun.launch.run_here import adopt_here, run_here
    from podrun.supervisor.daemon import spec_of
    from podrun.targets.base import target_for

    with open(os.path.join(job_dir, kept.RESUME_FILE)) as handle:
        payload = json.load(handle)
    os.environ.update(payload["environ"])
    spec = _without_unkept_notify(job_id, payload, spec_of(payload))
    options = ExecOptions(**{**payload["options"], "supervisor": None, "detach": True})
    if record is not None:
        return adopt_here(spec, payload["ships_code"], options, record)
    if spec.target.declared.recreates(spec.target.options):  # what the launcher cut off had asked for, if anything
        say(f"job {job_id}: its launcher was cut off while its TPU was made: that request is deleted and made again")
        target_for(spec).capacity.give_back()
    return run_here(spec, payload["ships_code"], options, job_id, kept=kept.Kept.here(shows_output=False))


def _without_unkept_notify(job_id: str, payload: dict, spec: JobSpec) -> JobSpec:
    """The spec as adopted: a webhook whose URL is not on this host (never kept on disk: daemon.py) sends
    nothing, and that is said once."""
    env_file = f"{os.path.join(paths.podrun_home(), boot.ENV_FILE)} for its boot unit"
    if payload.get("notify_unkept"):
        say(f"job {job_id}: adopted without its notifications: its webhook's URL was written in the spec, and "
            f"podrun keeps no URL on disk; give it as notify.url_env, set in this supervisor's environment "
            f"({env_file}), for notifications that outlive a restart")
    elif spec.notify and spec.notify.url_env and not os.environ.get(spec.notify.url_env):
        say(f"job {job_id}: adopted without its notifications: notify.url_env {spec.notify.url_env} is not in "
            f"this supervisor's environment ({env_file})")
        spec = spec.model_copy(update={"notify": None})
    return spec
