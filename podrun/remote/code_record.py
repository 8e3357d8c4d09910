"""What each file of a code version on a worker held when it was shipped, and the stat signature at
which podrun last saw that content: a job that writes into a code file through its hard link in the
run directory (root ignores the read-only mode) changes the version's own copy, and the next exec
must not trust it as is (remote/checkout.py, verify).

    ~/podrun/<name>/<hash>.files   beside the version: a header "podrun-files 1 STAMP", then per file,
                                   NUL-terminated, "SHA256 INO SIZE MTIME_NS CTIME_NS MODE PATH"
                                   (the signature all 0 until a checkout saw the file; SHA256 "-"
                                   for a symbolic link, which no write can go through)

A file is unchanged while its signature is the recorded one: any write, chmod or link changes the
inode change time (ctime), which no job can set back, as git's index relies on. A signature is
trusted only if its ctime is older than STAMP, the ctime of the record's own new file taken before
the files were looked at: a write after that gets a later ctime, even within the same tick of a
coarse clock. A file whose signature moved is hashed again; only if its content differs is the
version damaged. The relay writes the record when it unpacks a shipment (sha256s only); a checkout
that linked files fills in their signatures.

Standard library only, Python 3.8+, nothing done at import.
"""

import os
import stat
import time

SUFFIX = ".files"
HEADER = b"podrun-files 1 "
NEW_SUFFIX = ".podrun-new"
UNSEEN = (0, 0, 0, 0, 0)
LINK = "-"
READ_BYTES = 1 << 20
TICK_WAIT_S = 0.001


def make_private(version_dir):
    """~/podrun and ~/podrun/<name> above a version, where they are, made 0700 (older podruns left them
    0755): the code, and what jobs write in run/, are the user's own."""
    name_dir = os.path.dirname(version_dir)
    for directory in (os.path.dirname(name_dir), name_dir):
        if os.path.isdir(directory):
            os.chmod(directory, 0o700)


def create(directory, record_path):
    """After unpacking a shipment into directory: make its files read-only (a job then gets EACCES
    writing into one, unless it runs as root) and record each file's sha256. Returns the entries."""
    entries = {}
    for relative, info in _walk(directory):
        path = os.path.join(directory, relative)
        if stat.S_ISLNK(info.st_mode):
            entries[relative] = [LINK, *UNSEEN]
            continue
        if info.st_mode & 0o222:
            os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o222)
        entries[relative] = [sha256_of(path), *UNSEEN]
    write_new(record_path, entries)
    return entries


def write_new(record_path, entries):
    """The record of a tree whose files no checkout has seen yet (every signature UNSEEN): what create()
    wrote, for a copy of the same files."""
    _write(record_path, entries, _new_stamp(record_path))


def load(version_dir):
    """(stamp, {path: [sha256, *signature]}) of a version, or None without a record."""
    try:
        with open(version_dir + SUFFIX, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    header, _, body = data.partition(b"\n")
    if not header.startswith(HEADER):
        return None
    entries = {}
    for item in body.split(b"\0")[:-1]:
        fields = item.split(b" ", 6)
        entries[os.fsdecode(fields[6])] = [fields[0].decode(), *map(int, fields[1:6])]
    return int(header[len(HEADER):]), entries


def is_record(path):
    """Whether path is a record podrun wrote (its header), not a user's file of that name."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(HEADER)) == HEADER
    except (FileNotFoundError, IsADirectoryError):
        return False


def changed_files(version_dir, record):
    """The files of the version whose content is not the one shipped (missing ones too), sorted.
    Signatures that moved but whose content is intact are recorded again."""
    stamp, entries = record
    changed = []
    refreshed = {}
    new = None
    for relative, entry in entries.items():
        path = os.path.join(version_dir, relative)
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            changed.append(relative)
            continue
        if trusted(entry, info, stamp) or entry[0] == LINK:
            continue
        if new is None:  # from here on, a signature is trusted only if older than a new stamp
            new = _new_stamp(version_dir + SUFFIX)
        seen = intact_signature(path, entry)
        if seen is None:
            changed.append(relative)
        else:
            refreshed[relative] = seen
    if refreshed and not changed:
        for relative, seen in refreshed.items():
            entries[relative][1:] = seen
        _write(version_dir + SUFFIX, entries, new)
    elif new is not None:
        os.unlink(version_dir + SUFFIX + NEW_SUFFIX)
    return sorted(changed)


def trusted(entry, info, stamp):
    """Whether the file lstat'ed as info is the one the record's entry vouches for."""
    return entry[4] < stamp and entry[1:] == signature(info) and entry[1] != 0


def intact_signature(path, entry):
    """The file's signature if its content is the recorded one (and did not move while it was read), else None."""
    try:
        before = os.lstat(path)
        if (before.st_mode ^ entry[5]) & 0o111 and entry[5]:  # executable or not is part of the code
            return None
        if sha256_of(path) != entry[0]:
            return None
        after = signature(os.lstat(path))
    except OSError:  # gone, or made unreadable: not the code either
        return None
    return after if after == signature(before) else None


def settle(version_dir, record, relatives):
    """After a checkout linked these files (a link changes their ctime): record their signatures, under a
    stamp newer than every link, so that the next check trusts them without reading them."""
    stamp, entries = record
    path = version_dir + SUFFIX
    first = _new_stamp(path)
    new = _new_stamp(path)
    while new <= first:  # every link was made before `first`: a later stamp makes them all older
        time.sleep(TICK_WAIT_S)
        new = _new_stamp(path)
    for entry in entries.values():
        if entry[4] >= stamp:  # seen within the old stamp's tick: not to be trusted under the new one
            entry[1:] = UNSEEN
    for relative in relatives:
        entries[relative][1:] = signature(os.lstat(os.path.join(version_dir, relative)))
    _write(path, entries, new)


def signature(info):
    return [info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode]


def sha256_of(path):
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        block = handle.read(READ_BYTES)
        while block:
            digest.update(block)
            block = handle.read(READ_BYTES)
    return digest.hexdigest()


def _new_stamp(record_path):
    """Touch the record's new file; its ctime, which the file system's own clock gave it."""
    descriptor = os.open(record_path + NEW_SUFFIX, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.utime(descriptor)
        return os.fstat(descriptor).st_ctime_ns
    finally:
        os.close(descriptor)


def _write(record_path, entries, stamp):
    """The record into its new file (whose ctime is the stamp), then into place."""
    with open(record_path + NEW_SUFFIX, "r+b") as handle:
        handle.write(HEADER + b"%d\n" % stamp)
        handle.write(b"".join(b"%s %d %d %d %d %d %s\0" % (entry[0].encode(), *entry[1:], os.fsencode(relative))
                              for relative, entry in entries.items()))
        handle.truncate()
    os.replace(record_path + NEW_SUFFIX, record_path)


def _walk(directory):
    """(relative path, lstat) of the files and symbolic links under directory."""
    pending = [""]
    while pending:
        relative_dir = pending.pop()
        with os.scandir(os.path.join(directory, relative_dir)) as entries:
            for entry in entries:
                relative = os.path.join(relative_dir, entry.name)
                if entry.is_dir(follow_symlinks=False):
                    pending.append(relative)
                else:
                    yield relative, entry.stat(follow_symlinks=False)
