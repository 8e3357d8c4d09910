"""A worker's directory for the jobs of one name: its code versions, and the run directory its jobs run in.

    ~/podrun/<name>/<hash>/   one version of the code per content hash, as shipped; never trusted as
                              is: its record (<hash>.files, code_record.py) says what it must hold.
                              Only a directory with its record beside it is a version: whatever else
                              is there is the user's (a 2024/), never counted or removed
    ~/podrun/<name>/run/      where every job of that name runs (its cwd): its version's files,
                              hard-linked in, beside what jobs wrote there (checkpoints, outputs); a
                              checkout never follows a link a job made in it (run_dirs.py)

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

The versions themselves are listed and pruned by versions.py; `podrun disk` measures and frees what
a name keeps (disk.py).

Standard library only, Python 3.8+, nothing done at import.
"""

import fcntl
import os
import sys

try:  # on a worker, each was sent ahead of this file (transport/base.py, script_modules)
    code_record, run_dirs, versions = (
        sys.modules["podrun_remote_" + name] for name in ("code_record", "run_dirs", "versions"))
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import code_record, run_dirs, versions

# beside run/, not in it: the job's directory holds its code and its files only
MANIFEST_SUFFIX = ".manifest"
LOCK_SUFFIX = ".lock"
WRITTEN_SUFFIX = ".written"
RUN = "run"
KEPT_VERSIONS = 3
_verified: dict = {}  # version dir: its record, as verify() just found it


class CheckoutError(Exception):
    """Why the job cannot run in run/ (one line, for the user)."""


def check_out(version_dir, run_dir, job_id):
    """Make run_dir hold the files of version_dir and hold it (run.lock) until this process ends;
    returns the lock's descriptor. Raises CheckoutError."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        with run_dirs.exclusive(run_dir):
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
        versions.prune(os.path.dirname(run_dir), version, KEPT_VERSIONS)
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
    with run_dirs.exclusive(run_dir):  # no checkout links from it meanwhile
        record = code_record.load(version_dir)
        changed = [] if record is None else code_record.changed_files(version_dir, record)
        if record is not None and not changed:
            _verified[version_dir] = record  # for the checkout that follows in this process
            return True, []
        versions.remove(version_dir)
        if changed:
            _write_written(run_dir, _written(run_dir) | set(changed))
    return False, changed


def _try_lock(descriptor, operation):
    try:
        fcntl.flock(descriptor, operation)
    except BlockingIOError:
        return False
    return True


def _place(version_dir, run_dir, same_version):
    """Link the version's files into run_dir where it lacks them (the version is new there, or a job
    replaced or removed one) and remove what the last checkout placed that the version lacks."""
    record = _verified.pop(version_dir, None) or (code_record.load(version_dir) if os.path.isdir(version_dir) else None)
    if record is None:
        raise CheckoutError("the code version %s is gone from this worker (removed while the job started?); "
                            "run the job again" % version_dir)
    entries = record[1]
    with run_dirs.RunDirs(run_dir) as dirs:
        if not same_version:
            for relative, inode in _read_manifest(run_dir).items():
                if relative not in entries:
                    run_dirs.remove_placed(dirs, relative, inode)
        in_run_dir = run_dirs.inodes(dirs, {os.path.dirname(relative) for relative in entries})
        written = _written(run_dir)
        linked = []
        placed = {}
        for relative, entry in entries.items():
            inode = entry[1] or os.lstat(os.path.join(version_dir, relative)).st_ino
            if in_run_dir.get(relative) == inode:
                placed[relative] = inode
                continue
            copy = relative in written
            placed[relative] = run_dirs.link(os.path.join(version_dir, relative),
                                             dirs.open(os.path.dirname(relative), True),
                                             os.path.basename(relative), relative in in_run_dir, copy)
            if not copy:
                linked.append(relative)
    if linked:
        code_record.settle(version_dir, record, linked)
    if linked or not same_version:
        _write_manifest(run_dir, placed)


def _written(run_dir):
    """The code files jobs of this name wrote into (run.written): placed as copies, not links."""
    try:
        with open(run_dir + WRITTEN_SUFFIX, "rb") as handle:
            return {os.fsdecode(relative) for relative in handle.read().split(b"\0") if relative}
    except FileNotFoundError:
        return set()


def _write_written(run_dir, relatives):
    path = run_dir + WRITTEN_SUFFIX
    with open(path + run_dirs.NEW_SUFFIX, "wb") as handle:
        handle.write(b"".join(os.fsencode(relative) + b"\0" for relative in sorted(relatives)))
    os.replace(path + run_dirs.NEW_SUFFIX, path)


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
    with open(path + run_dirs.NEW_SUFFIX, "wb") as handle:
        handle.write(b"".join(b"%d %s\0" % (inode, os.fsencode(relative)) for relative, inode in files.items()))
    os.replace(path + run_dirs.NEW_SUFFIX, path)


def current_version(run_dir):
    """The version checked out in run_dir, or None."""
    try:
        with open(run_dir + LOCK_SUFFIX) as handle:
            return (handle.read().split() or [None])[0]
    except FileNotFoundError:
        return None
