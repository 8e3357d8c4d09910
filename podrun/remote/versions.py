"""A name's code versions on this worker (~/podrun/<name>/<hash>/, each with its record beside it):
which there are, and the removal of those beyond the most recently used (checkout.py, disk.py).
Standard library only, Python 3.8+, nothing done at import.
"""

import os
import stat
import sys

try:  # on a worker, sent ahead of this file (transport/base.py, script_modules)
    code_record = sys.modules["podrun_remote_code_record"]
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import code_record


def prune(name_dir, current, keep):
    """Remove the versions in name_dir beyond the `keep` most recently used, `current` counted first
    (None: no version is current); returns how many it removed."""
    versions = sorted(versions_in(name_dir), key=lambda path: (os.path.basename(path) == current,
                                                                os.stat(path).st_mtime), reverse=True)
    for path in versions[keep:]:
        remove(path)
    return len(versions[keep:])


def remove(version_dir):
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
