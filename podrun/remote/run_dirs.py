"""run/'s directories and the files a checkout places in them (checkout.py), each directory opened
from its parent's without following a symbolic link, so that nothing is written or removed through a
job's link out of run/; and run/'s own lock, one checkout, verify or pruning at a time.
Standard library only, Python 3.8+, nothing done at import.
"""

import errno
import fcntl
import os
import stat

NEW_SUFFIX = ".podrun-new"
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class exclusive:
    """flock on a directory itself, for a `with` block."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        self.descriptor = os.open(self.path, os.O_RDONLY)
        fcntl.flock(self.descriptor, fcntl.LOCK_EX)

    def __exit__(self, *exception):
        os.close(self.descriptor)


class RunDirs:
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


def inodes(dirs, relative_dirs):
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


def link(source, parent, name, replacing, copy=False):
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


def remove_placed(dirs, relative, inode):
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
