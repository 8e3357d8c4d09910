"""A worker's directory for the jobs of one name: the code versions, the run directory, and their disk.

    ~/podrun/<name>/<hash>/   one version of the code per content hash, as shipped; never trusted as
                              is: its record (<hash>.files, code_record.py) says what it must hold.
                              Only a directory with its record beside it is a version: whatever else
                              is there is the user's (a 2024/), never counted or removed
    ~/podrun/<name>/run/      where every job of that name runs (its cwd): its version's files,
                              hard-linked in, beside what jobs wrote there (checkpoints, outputs); a
                              checkout never follows a link a job made in it (_RunDirs)

Before a job's first step, its agent's probe calls verify(): a version whose files changed since it
was shipped is removed, and the launcher ships it again. A job changes a version by writing into one
of its files through the link in run/: the files are read-only, but root ignores the mode bits (a
torch.save over a shipped snapshot.pt does it). Before each step, its agent calls check_out(): run/
then holds exactly the files of the job's version (those a job replaced, removed or wrote into are
linked again), and what jobs wrote there stays. Unchanged code costs an lstat per file (verify)
and a directory read per directory (check_out): 5,000 files, 46 MB, in about 25 ms
(scripts/bench_code_integrity.py). Files are linked, not copied: a new version costs a link per
file, not the workdir's size again (copies cost 13x that here, and reflinks are not on ext4), but a
file a job wrote into is copied from then on (run.written).

  run.manifest  per file the checkout placed in run/, its inode: the next checkout removes what this
                one placed and its version lacks, if the file is still that inode (a job that
                replaced it made it its own)
  run.lock      "VERSION JOB_ID" of the checkout and the job that last took it; held (flock, shared)
                by the agent of every step running in run/, for the step's life. A job with other
                code is refused while it is held; jobs with the same code share run/, as they shared
                the code directory before (their files are the same)
  run.written   the code files that jobs of this name wrote into, as verify found them: from then on
                the checkout puts a copy of each in run/, afresh every time, not a link, so that a
                job that writes it again changes its own copy, not the version
  run/ itself   flock'ed (exclusive) during a checkout, a verify or a pruning: one at a time

After a checkout that changed run/, the versions beyond the KEPT_VERSIONS most recently used (a
checkout touches its version) are removed; the current one never is, and it is the only one a
running job can use (the lock refuses others).

As a script (`podrun disk`): argv NAME_DIR JOBS_DIR FREE MAX_JOB_AGE_S. Prints one JSON line: the
versions' count and bytes, the run directory's own bytes (what is not shared with a version), the
job directories' count and bytes. With FREE "1" it first removes every version but the current one
and the job directories of finished jobs untouched for MAX_JOB_AGE_S, and adds what it freed. Never
the run directory: it holds the jobs' checkpoints.

Standard library only, Python 3.8+, nothing done at import.
"""

import errno
import fcntl
import os
import stat
import sys

try:  # on a worker, sent ahead of this file (transport/base.py, script_modules)
    code_record = sys.modules["podrun_remote_code_record"]
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import code_record

# beside run/, not in it: the job's directory holds its code and its files only
MANIFEST_SUFFIX = ".manifest"
LOCK_SUFFIX = ".lock"
WRITTEN_SUFFIX = ".written"
RUN = "run"
KEPT_VERSIONS = 3
NEW_SUFFIX = ".podrun-new"
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_verified: dict = {}  # version dir: its record, as verify() just found it


class CheckoutError(Exception):
    """Why the job cannot run in run/ (one line, for the user)."""


def check_out(version_dir, run_dir, job_id):
    """Make run_dir hold the files of version_dir and hold it (run.lock) until this process ends;
    returns the lock's descriptor. Raises CheckoutError."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        with _exclusive(run_dir):
            return _take(version_dir, run_dir, job_id)
    except OSError as error:
        raise CheckoutError("cannot check out %s into %s: %s" % (version_dir, run_dir, _reason(error))) from None


def _reason(error):
    return "%s%s" % (error.strerror or error, " (%s)" % error.filename if error.filename else "")


def _take(version_dir, run_dir, job_id):
    version = os.path.basename(version_dir)
    lock = os.open(run_dir + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o600)
    last_version, last_job = (os.pread(lock, 4096, 0).decode(errors="replace").split() + ["", ""])[:2]
    unused = _try_lock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if not unused and last_version != version:  # jobs run there now, all with last_version
        raise CheckoutError("%s is in use by job %s, which runs other code: give this job another name: in its "
                            "spec, or wait until that one ends (or podrun stop it)" % (os.path.abspath(run_dir), last_job))
    _place(version_dir, run_dir, last_version == version)
    if last_version != version:
        prune(os.path.dirname(run_dir), version, KEPT_VERSIONS)
    os.utime(version_dir)
    os.ftruncate(lock, 0)
    os.pwrite(lock, ("%s %s\n" % (version, job_id)).encode(), 0)
    fcntl.flock(lock, fcntl.LOCK_SH)  # under run/'s own lock: no one takes it in between
    return lock


def verify(version_dir):
    """Before a job's first step (its agent's probe): whether this worker has the version as shipped.
    Returns (present, changed): a version with files whose content changed since it was shipped (a
    job wrote into one through the run directory) is removed, so that the launcher ships it again, and
    `changed` names those files. A version without its record (shipped by an older podrun) is removed too.
    Raises CheckoutError."""
    try:
        code_record.make_private(version_dir)
        if not os.path.isdir(version_dir):
            return False, []
        return _verify(version_dir)
    except OSError as error:
        raise CheckoutError("cannot check the code in %s: %s" % (version_dir, _reason(error))) from None


def _verify(version_dir):
    run_dir = os.path.join(os.path.dirname(version_dir), RUN)
    os.makedirs(run_dir, exist_ok=True)
    with _exclusive(run_dir):  # no checkout links from it meanwhile
        record = code_record.load(version_dir)
        changed = [] if record is None else code_record.changed_files(version_dir, record)
        if record is not None and not changed:
            _verified[version_dir] = record  # for the checkout that follows in this process
            return True, []
        _remove_version(version_dir)
        if changed:
            _write_written(run_dir, _written(run_dir) | set(changed))
    return False, changed


def _try_lock(descriptor, operation):
    try:
        fcntl.flock(descriptor, operation)
    except BlockingIOError:
        return False
    return True


class _exclusive:
    """flock on a directory itself, for a `with` block."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.descriptor = os.open(self.path, os.O_RDONLY)
        fcntl.flock(self.descriptor, fcntl.LOCK_EX)

    def __exit__(self, *exception):
        os.close(self.descriptor)


def _place(version_dir, run_dir, same_version):
    """Link the version's files into run_dir where it lacks them (the version is new there, or a job
    replaced or removed one) and remove what the last checkout placed that the version lacks."""
    record = _verified.pop(version_dir, None) or (code_record.load(version_dir) if os.path.isdir(version_dir) else None)
    if record is None:
        raise CheckoutError("the code version %s is gone from this worker (removed while the job started?); "
                            "run the job again" % version_dir)
    entries = record[1]
    with _RunDirs(run_dir) as dirs:
        if not same_version:
            for relative, inode in _read_manifest(run_dir).items():
                if relative not in entries:
                    _remove_placed(dirs, relative, inode)
        in_run_dir = _inodes(dirs, {os.path.dirname(relative) for relative in entries})
        written = _written(run_dir)
        linked = []
        placed = {}
        for relative, entry in entries.items():
            inode = entry[1] or os.lstat(os.path.join(version_dir, relative)).st_ino
            if in_run_dir.get(relative) == inode:
                placed[relative] = inode
                continue
            copy = relative in written
            placed[relative] = _link(os.path.join(version_dir, relative), dirs.open(os.path.dirname(relative), True),
                                     os.path.basename(relative), relative in in_run_dir, copy)
            if not copy:
                linked.append(relative)
    if linked:
        code_record.settle(version_dir, record, linked)
    if linked or not same_version:
        _write_manifest(run_dir, placed)


class _RunDirs:
    """Descriptors of run/'s directories, each opened from its parent's without following a symbolic
    link: what a checkout writes or removes is in run/, never through a job's link out of it (say,
    src/ replaced by a link to a directory elsewhere). Every name is then used relative to its directory's
    descriptor, for a `with` block."""

    def __init__(self, run_dir):
        self.run_dir = run_dir

    def __enter__(self):
        self.descriptors = {"": os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY)}
        return self

    def __exit__(self, *exception):
        for descriptor in self.descriptors.values():
            os.close(descriptor)

    def open(self, relative_dir, create=False):
        """The directory's descriptor; None if it is missing or not a directory (a link is not one),
        unless `create`: then it is made, and a link found in its place removed (the link itself)."""
        if relative_dir in self.descriptors:
            return self.descriptors[relative_dir]
        parent = self.open(os.path.dirname(relative_dir), create)
        if parent is None:
            return None
        name = os.path.basename(relative_dir)
        try:
            descriptor = os.open(name, DIRECTORY_FLAGS, dir_fd=parent)
        except (FileNotFoundError, NotADirectoryError) as error:
            if not create:
                return None
            if isinstance(error, NotADirectoryError):
                if not stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode):
                    raise FileExistsError(errno.EEXIST, "a file is where the code has a directory",
                                          os.path.join(self.run_dir, relative_dir)) from None
                os.unlink(name, dir_fd=parent)
            try:
                os.mkdir(name, dir_fd=parent)
            except FileExistsError:  # a job made it meanwhile
                pass
            descriptor = os.open(name, DIRECTORY_FLAGS, dir_fd=parent)
        self.descriptors[relative_dir] = descriptor
        return descriptor

    def remove(self, relative_dir):
        """Remove the directory if it is empty; returns whether it did."""
        parent = self.open(os.path.dirname(relative_dir))
        if parent is None:
            return False
        try:
            os.rmdir(os.path.basename(relative_dir), dir_fd=parent)
        except OSError:  # not empty: the job's files, or the version's (or a link: not ours)
            return False
        descriptor = self.descriptors.pop(relative_dir, None)
        if descriptor is not None:
            os.close(descriptor)
        return True


def _inodes(dirs, relative_dirs):
    """{relative path: inode} of what the directories hold, from the directory entries (no stat: a
    checkout of unchanged code reads a directory per directory of the code, not an inode per file)."""
    inodes = {}
    for relative_dir in relative_dirs:
        descriptor = dirs.open(relative_dir)
        if descriptor is not None:
            with os.scandir(descriptor) as entries:
                for entry in entries:
                    inodes[os.path.join(relative_dir, entry.name)] = entry.inode()
    return inodes


def _link(source, parent, name, replacing, copy=False):
    """Put source (or a copy of it) at `name` in the directory `parent` (a descriptor), a file there
    `replacing` (through a temporary name: a job never finds it missing); returns its inode."""
    info = os.lstat(source)
    placed = name + NEW_SUFFIX if replacing else name
    try:
        inode = _hard_link(source, parent, placed, info, copy)
    except FileExistsError:  # a temporary name left by a checkout that was killed
        os.unlink(placed, dir_fd=parent)
        inode = _hard_link(source, parent, placed, info, copy)
    if replacing:
        os.replace(placed, name, src_dir_fd=parent, dst_dir_fd=parent)
    return inode


def _hard_link(source, parent, name, info, copy):
    """A hard link, or a copy if asked or where run/ is on another file system than the version;
    returns its inode."""
    try:
        if not copy:
            os.link(source, name, dst_dir_fd=parent, follow_symlinks=False)
            return info.st_ino
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(source), name, dir_fd=parent)
    else:
        _copy(source, parent, name, info)
    return os.lstat(name, dir_fd=parent).st_ino


def _copy(source, parent, name, info):
    """A new file `name` in `parent` with source's content, mode and times (as shutil.copy2)."""
    import shutil

    descriptor = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent)
    with open(source, "rb") as reader, open(descriptor, "wb") as writer:
        shutil.copyfileobj(reader, writer)
        writer.flush()
        os.chmod(descriptor, stat.S_IMODE(info.st_mode))
        os.utime(descriptor, ns=(info.st_atime_ns, info.st_mtime_ns))


def _remove_placed(dirs, relative, inode):
    """Remove a file an earlier checkout placed, unless a job replaced it since (or its directory),
    then the directories that emptied."""
    parent = dirs.open(os.path.dirname(relative))
    if parent is None:  # gone, or a job's link now: what it leads to is not ours
        return
    name = os.path.basename(relative)
    try:
        if os.lstat(name, dir_fd=parent).st_ino != inode:
            return
        os.unlink(name, dir_fd=parent)
    except (FileNotFoundError, NotADirectoryError):
        return
    relative_dir = os.path.dirname(relative)
    while relative_dir and dirs.remove(relative_dir):
        relative_dir = os.path.dirname(relative_dir)


def _written(run_dir):
    """The code files jobs of this name wrote into (run.written): placed as copies, not links."""
    try:
        with open(run_dir + WRITTEN_SUFFIX, "rb") as handle:
            return {os.fsdecode(relative) for relative in handle.read().split(b"\0") if relative}
    except FileNotFoundError:
        return set()


def _write_written(run_dir, relatives):
    path = run_dir + WRITTEN_SUFFIX
    with open(path + NEW_SUFFIX, "wb") as handle:
        handle.write(b"".join(os.fsencode(relative) + b"\0" for relative in sorted(relatives)))
    os.replace(path + NEW_SUFFIX, path)


def _read_manifest(run_dir):
    try:
        with open(run_dir + MANIFEST_SUFFIX, "rb") as handle:
            records = handle.read().split(b"\0")
    except FileNotFoundError:
        return {}
    placed = {}
    for record in filter(None, records):
        inode, _, relative = record.partition(b" ")
        placed[os.fsdecode(relative)] = int(inode)
    return placed


def _write_manifest(run_dir, files):
    path = run_dir + MANIFEST_SUFFIX
    with open(path + NEW_SUFFIX, "wb") as handle:
        handle.write(b"".join(b"%d %s\0" % (inode, os.fsencode(relative)) for relative, inode in files.items()))
    os.replace(path + NEW_SUFFIX, path)


def prune(name_dir, current, keep):
    """Remove the versions in name_dir beyond the `keep` most recently used, `current` counted first
    (None: no version is current); returns how many it removed."""
    versions = sorted(versions_in(name_dir), key=lambda path: (os.path.basename(path) == current,
                                                                os.stat(path).st_mtime), reverse=True)
    for path in versions[keep:]:
        _remove_version(path)
    return len(versions[keep:])


def _remove_version(version_dir):
    """The version, then its record (renamed first: versions_in no longer lists a half-removed one)."""
    import shutil

    removed = "%s.removed.%d" % (version_dir, os.getpid())
    os.rename(version_dir, removed)
    try:
        os.unlink(version_dir + code_record.SUFFIX)
    except FileNotFoundError:
        pass
    shutil.rmtree(removed)


def versions_in(name_dir):
    """The version directories of a name: those with podrun's record beside them (shipments still
    unpacking have none yet). Whatever else is there is the user's, whatever its name (2024/)."""
    try:
        entries = os.listdir(name_dir)
    except FileNotFoundError:
        return []
    versions = []
    for entry in entries:
        path = os.path.join(name_dir, entry[:-len(code_record.SUFFIX)])
        if entry.endswith(code_record.SUFFIX) and code_record.is_record(path + code_record.SUFFIX) and _is_directory(path):
            versions.append(path)
    return versions


def _is_directory(path):
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def current_version(run_dir):
    """The version checked out in run_dir, or None."""
    try:
        with open(run_dir + LOCK_SUFFIX) as handle:
            return (handle.read().split() or [None])[0]
    except FileNotFoundError:
        return None


def disk_usage(name_dir, jobs_dir):
    """What podrun keeps for one name and its jobs, each inode counted once (run/ links the versions' files)."""
    seen = set()
    versions = versions_in(name_dir)
    jobs = _job_dirs(jobs_dir)
    return {"versions": len(versions), "versions_bytes": sum(_bytes_under(path, seen) for path in versions),
            "run_bytes": _bytes_under(os.path.join(name_dir, RUN), seen),
            "jobs": len(jobs), "jobs_bytes": sum(_bytes_under(path, seen) for path in jobs)}


def free(name_dir, jobs_dir, max_job_age_s):
    """Remove every version but the current one and the finished jobs' directories older than
    max_job_age_s; returns (versions removed, job directories removed)."""
    import shutil
    import time

    run_dir = os.path.join(name_dir, RUN)
    if os.path.isdir(run_dir):
        with _exclusive(run_dir):
            versions = prune(name_dir, current_version(run_dir), 1)
    else:
        versions = prune(name_dir, None, 1)
    old = [path for path in _job_dirs(jobs_dir)
           if _last_change(path) < time.time() - max_job_age_s and _finished(path)]
    for path in old:
        shutil.rmtree(path)
    return versions, len(old)


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
    import sys

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
