"""Put copied files where `podrun cp` was told, as scp would, from the staging directory they
arrived in (whole: a copy that failed half-way never touches the destination).

A DEST that is a directory receives each entry under its own name; otherwise DEST becomes the one
entry. A directory landing on one that exists merges into it, file by file; a file replaces a file.
The staging directory is removed in every case. check() says beforehand, touching nothing, whether
place() would fail for a reason it can see (no such directory, a file over a directory, a directory
that cannot be written in): a copy to several workers is put in place only where every one passed.

argv: [--check] STAGING DEST ENTRY... (each ENTRY a path inside STAGING; DEST may begin with ~).
Prints why it failed (or would) and exits 1.
Runs on the workers (uploads: commands/copy.py runs it as a script) and on the launcher (downloads).
"""

import os
import shutil
import sys


class PlacementError(Exception):
    pass


def place(staging, dest, entries):
    try:
        if not os.path.isdir(os.path.dirname(os.path.abspath(dest))):
            raise PlacementError("%s: no such directory" % os.path.dirname(dest))
        if os.path.isdir(dest):
            for entry in entries:
                _merge(entry, os.path.join(dest, os.path.basename(entry)))
        elif len(entries) > 1:
            raise PlacementError("%s: not a directory (several files are copied into one)" % dest)
        else:
            _merge(entries[0], dest)
    except OSError as error:
        raise PlacementError("%s: %s" % (error.filename or dest, error.strerror or error)) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check(staging, dest, entries):
    """Raise PlacementError where place() would fail as it begins, and where it would have to write in
    a directory it cannot (a read-only file system, permissions); changes nothing."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(dest))):
        raise PlacementError("%s: no such directory" % os.path.dirname(dest))
    if os.path.isdir(dest):
        pairs = [(entry, os.path.join(dest, os.path.basename(entry))) for entry in entries]
    elif len(entries) > 1:
        raise PlacementError("%s: not a directory (several files are copied into one)" % dest)
    else:
        pairs = [(entries[0], dest)]
    while pairs:
        source, target = pairs.pop()
        if _is_directory(source) and _is_directory(target):
            pairs += [(os.path.join(source, name), os.path.join(target, name)) for name in os.listdir(source)]
        elif _is_directory(target):
            raise PlacementError("%s: is a directory, cannot be replaced by a file" % target)
        elif _is_directory(source) and os.path.lexists(target):
            raise PlacementError("%s: not a directory, cannot be replaced by one" % target)
        elif not os.access(os.path.dirname(os.path.abspath(target)), os.W_OK | os.X_OK):
            folder = os.path.dirname(os.path.abspath(target))
            why = "read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else "permission denied"
            raise PlacementError("%s: cannot write there (%s)" % (folder, why))


def _is_directory(path):
    return os.path.isdir(path) and not os.path.islink(path)


def _merge(source, target):
    if os.path.isdir(source) and not os.path.islink(source) and os.path.isdir(target) and not os.path.islink(target):
        for name in os.listdir(source):
            _merge(os.path.join(source, name), os.path.join(target, name))
        return
    if os.path.isdir(target) and not os.path.islink(target):
        raise PlacementError("%s: is a directory, cannot be replaced by a file" % target)
    try:
        os.replace(source, target)
    except OSError as error:
        if error.errno != 18:  # EXDEV: the destination is on another file system
            raise
        shutil.move(source, target)


def main():
    checking = sys.argv[1] == "--check"
    staging, dest, *entries = sys.argv[2:] if checking else sys.argv[1:]
    try:
        (check if checking else place)(staging, os.path.expanduser(dest), entries)
    except PlacementError as error:
        print(error, file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
