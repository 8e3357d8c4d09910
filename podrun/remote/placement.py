"""Put copied files where `podrun cp` was told, as scp would, from the staging directory they
arrived in (whole: a copy that failed half-way never touches the destination).

A DEST that is a directory receives each entry under its own name; otherwise DEST becomes the one
entry. A directory landing on one that exists merges into it, file by file; a file replaces a file.
The staging directory is removed in every case.

argv: STAGING DEST ENTRY... (each ENTRY a path inside STAGING; DEST may begin with ~). Prints why it
failed and exits 1.
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
    try:
        place(sys.argv[1], os.path.expanduser(sys.argv[2]), sys.argv[3:])
    except PlacementError as error:
        print(error, file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
