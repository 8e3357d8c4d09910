"""What podrun keeps on this worker for one name: its code versions, its run directory and its jobs'
directories, measured and, on request, freed (`podrun disk`, commands/disk.py, runs it as a script).

argv NAME_DIR JOBS_DIR FREE MAX_JOB_AGE_S. Prints one JSON line: the versions' count and bytes, the
run directory's own bytes (what is not shared with a version), the job directories' count and bytes.
With FREE "1" it first removes every version but the current one and the job directories of finished
jobs untouched for MAX_JOB_AGE_S, and adds what it freed. Never the run directory: it holds the jobs'
checkpoints.

Standard library only, Python 3.8+, nothing done at import.
"""

import os
import sys

try:  # on a worker, each was sent ahead of this file (transport/base.py, script_modules)
    checkout, run_dirs, versions = (
        sys.modules["podrun_remote_" + name] for name in ("checkout", "run_dirs", "versions"))
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import checkout, run_dirs, versions


def disk_usage(name_dir, jobs_dir):
    """What podrun keeps for one name and its jobs, each inode counted once (run/ links the versions' files)."""
    seen = set()
    found = versions.versions_in(name_dir)
    jobs = _job_dirs(jobs_dir)
    return {"versions": len(found), "versions_bytes": sum(_bytes_under(path, seen) for path in found),
            "run_bytes": _bytes_under(os.path.join(name_dir, checkout.RUN), seen),
            "jobs": len(jobs), "jobs_bytes": sum(_bytes_under(path, seen) for path in jobs)}


def free(name_dir, jobs_dir, max_job_age_s):
    """Remove every version but the current one and the finished jobs' directories older than
    max_job_age_s; returns (versions removed, job directories removed)."""
    import shutil
    import time

    run_dir = os.path.join(name_dir, checkout.RUN)
    if os.path.isdir(run_dir):
        with run_dirs.exclusive(run_dir):
            removed = versions.prune(name_dir, checkout.current_version(run_dir), 1)
    else:
        removed = versions.prune(name_dir, None, 1)
    old = [path for path in _job_dirs(jobs_dir)
           if _last_change(path) < time.time() - max_job_age_s and _finished(path)]
    for path in old:
        shutil.rmtree(path)
    return removed, len(old)


def _job_dirs(jobs_dir):
    try:
        return [entry.path for entry in os.scandir(jobs_dir) if entry.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _bytes_under(path, seen):
    """Bytes on disk (allocated blocks) under path, skipping the inodes in `seen`, which it extends."""
    total = 0
    pending = [path]
    while pending:
        try:
            entries = os.scandir(pending.pop())
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                if (info.st_dev, info.st_ino) not in seen:
                    seen.add((info.st_dev, info.st_ino))
                    total += info.st_blocks * 512
    return total


def _last_change(job_dir):
    return max([os.stat(job_dir).st_mtime] + [entry.stat().st_mtime for entry in os.scandir(job_dir)])


def _finished(job_dir):
    """Whether every step the job started (its agent's pid in <step>.agent) has ended."""
    for name in os.listdir(job_dir):
        step, extension = os.path.splitext(name)
        if extension == ".agent" and not os.path.exists(os.path.join(job_dir, step + ".exit")):
            with open(os.path.join(job_dir, name)) as handle:
                if _running(int((handle.read().split() or ["0"])[0])):  # "PID START" (agent.py)
                    return False
    return True


def _running(pid):
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process now has that pid
        return True
    return True


def main():
    import json

    name_dir, jobs_dir, free_now, max_job_age_s = sys.argv[1:5]
    before = disk_usage(name_dir, jobs_dir)
    report = dict(before, freed_versions=0, freed_jobs=0, freed_bytes=0)
    if free_now == "1":
        report["freed_versions"], report["freed_jobs"] = free(name_dir, jobs_dir, float(max_job_age_s))
        report.update(disk_usage(name_dir, jobs_dir))
        report["freed_bytes"] = sum(before[key] - report[key] for key in ("versions_bytes", "run_bytes", "jobs_bytes"))
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
