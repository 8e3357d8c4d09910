"""Which files of a workdir ship: what `git ls-files --cached --others --exclude-standard` lists there
(for a tree that is untracked, or was added with `git add -A`), less what `.podrunignore` excludes.

Git's rules (dir.c and wildmatch.c), followed to the letter so that what ships is what git would
commit:
  - each directory's `.gitignore` holds patterns relative to that directory; for a path, the ignore
    files are consulted from the deepest directory up, and in each the last matching pattern decides
    (a `!` pattern re-includes). `.podrunignore` is read after the `.gitignore` beside it, as if
    appended to it, so it can exclude more and, with `!`, re-include;
  - an excluded directory is never entered: nothing under it can be re-included, and its ignore
    files are never read;
  - a pattern with no slash (but a trailing one) matches a name at any depth, any other the path
    relative to its ignore file (a leading slash only anchors); a trailing `/` matches directories
    only, and a symlink is no directory: it is listed, whatever it points at, and never followed;
  - `*`, `?` and `[...]` stop at `/`, `**` between slashes spans directories, `\\` escapes, `#`
    starts a comment, trailing spaces are dropped unless escaped; an ignore file that is a symlink is
    not read (git >= 2.32);
  - entries named `.git` never ship, nor do sockets, FIFOs and devices (git lists files and symlinks);
  - inside a git repository, the `.gitignore` files of the directories above the workdir up to the
    repository's top, then `$GIT_DIR/info/exclude`, apply too, as to `git ls-files` run in the
    workdir (`.podrunignore` applies within the workdir only).

Differences from git, on purpose:
  - the workdir and the directories above it are never excluded: git lists nothing inside an ignored
    directory, but the workdir the user named ships (the rules still apply to what is in it);
  - the index is not read (the launcher may have no git): a file that the rules exclude but that was
    force-added (`git add -f`) does not ship;
  - git's configuration is not read: the user's global excludes (`core.excludesFile`, by default
    ~/.config/git/ignore) do not apply, and matching is case-sensitive even where `core.ignorecase`
    is set (as `git init` does on macOS): the workdir alone decides what ships;
  - a nested repository (a directory with its own `.git`) ships its files; git lists it as one entry.

Each pattern becomes a regular expression over bytes (wildmatch compares bytes: `?` is one byte of a
UTF-8 name). pathspec's GitIgnoreSpec is not used: it matches a path through its parent
directories, so that `!d` in x/.gitignore would re-include x/d/f.txt, which a `*.txt` above
excludes. The scan reads no file but the ignore files, and never enters an excluded directory.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

IGNORE_FILES = (b".gitignore", b".podrunignore")  # in this order: the later one's patterns win
_BACKSLASH = ord("\\")
_SLASH = ord("/")
_GLOB_SPECIAL = b"*?[\\"
_ANY_BYTE = frozenset(range(1, 256))
# git's own ctype (git-compat-util.h: ASCII only) for the [:class:] of a bracket expression
_CLASSES = {
    b"alnum": frozenset(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"),
    b"alpha": frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"),
    b"blank": frozenset(b" \t"),
    b"cntrl": frozenset([*range(32), 127]),
    b"digit": frozenset(b"0123456789"),
    b"graph": frozenset(range(33, 127)),
    b"lower": frozenset(b"abcdefghijklmnopqrstuvwxyz"),
    b"print": frozenset(range(32, 127)),
    b"punct": frozenset(b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    b"space": frozenset(b" \t\n\r"),
    b"upper": frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    b"xdigit": frozenset(b"0123456789ABCDEFabcdef"),
}


class _Pattern(NamedTuple):
    regex: bytes
    negated: bool  # `!`: re-includes
    only_directories: bool  # trailing `/`
    on_name: bool  # no other `/`: matches the last component of a path, at any depth


class _Matcher(NamedTuple):
    """Some of one directory's patterns as one expression whose alternatives run last pattern first,
    so the group that matches is the last matching pattern: `found[group]` is (its place, negated)."""

    regex: re.Pattern[bytes]
    found: tuple[tuple[int, bool], ...]


class _Rules(NamedTuple):
    """One directory's patterns: matched to names, or to paths from `base` (the length of the
    directory, with its slash, in the paths they are matched to); files and symlinks are matched
    without the patterns that end in `/`."""

    base: int
    file_names: _Matcher | None
    file_paths: _Matcher | None
    directory_names: _Matcher | None
    directory_paths: _Matcher | None


def shipped_files(workdir: str | os.PathLike[str]) -> list[str]:
    """The files of `workdir` that ship, as relative POSIX paths in git's order (bytewise)."""
    root = os.fsencode(workdir)
    prefix, above = _rules_above(root)
    found: list[bytes] = []
    pending = [(root, prefix, above)]
    while pending:
        directory, relative, rules = pending.pop()
        try:
            with os.scandir(directory) as scanner:
                entries = list(scanner)
        except OSError:  # unreadable or gone: as os.walk did, ship what can be read
            continue
        own = _read_rules([entry.path for name in IGNORE_FILES for entry in entries
                           if entry.name == name and entry.is_file(follow_symlinks=False)], len(relative))
        if own is not None:
            rules = (own, *rules)
        for entry in entries:
            if entry.name == b".git":
                continue
            path = relative + entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if not _excluded(entry.name, path, True, rules):
                        pending.append((entry.path, path + b"/", rules))
                elif entry.is_file(follow_symlinks=False) or entry.is_symlink():
                    if not _excluded(entry.name, path, False, rules):
                        found.append(path)
            except OSError:  # gone since the directory was listed
                continue
    found.sort()
    return [os.fsdecode(path[len(prefix):]) for path in found]


def _excluded(name: bytes, path: bytes, is_directory: bool, rules: tuple[_Rules, ...]) -> bool:
    for level in rules:  # deepest first: the first that has a matching pattern decides
        names, paths = ((level.directory_names, level.directory_paths) if is_directory
                        else (level.file_names, level.file_paths))
        by_name = names and names.regex.fullmatch(name)
        by_path = paths and paths.regex.fullmatch(path, level.base)
        if by_name or by_path:
            last = max(matcher.found[match.lastindex or 0]
                       for matcher, match in ((names, by_name), (paths, by_path)) if matcher and match)
            return not last[1]
    return False


def _rules_above(root: bytes) -> tuple[bytes, tuple[_Rules, ...]]:
    """The workdir's path below its repository's top (with a slash, or empty), and the rules that
    apply to it from above: the .gitignore files from its parent up to the top, then info/exclude."""
    real = os.path.realpath(root)
    top = _repository_top(real)
    if top is None:
        return b"", ()
    relative = os.path.relpath(real, top)
    prefix = b"" if relative == b"." else relative + b"/"
    levels: list[_Rules] = []
    directory = b""
    for part in prefix.split(b"/")[:-1]:
        gitignore = os.path.join(top, directory, b".gitignore")
        rules = None if os.path.islink(gitignore) else _read_rules([gitignore], len(directory))
        if rules is not None:
            levels.insert(0, rules)
        directory += part + b"/"
    exclude = _read_rules([os.path.join(_common_git_dir(top), b"info", b"exclude")], 0)
    return prefix, (*levels, *([exclude] if exclude is not None else []))


def _repository_top(directory: bytes) -> bytes | None:
    """The nearest directory holding a repository's `.git`, as git discovers it (without crossing
    into another file system, as git does unless GIT_DISCOVERY_ACROSS_FILESYSTEM is set)."""
    try:
        device = os.stat(directory).st_dev
        while True:
            dot_git = os.path.join(directory, b".git")
            if os.path.isfile(os.path.join(dot_git, b"HEAD")) or _gitdir_link(dot_git) is not None:
                return directory
            parent = os.path.dirname(directory)
            if parent == directory or os.stat(parent).st_dev != device:
                return None
            directory = parent
    except OSError:  # a workdir that does not exist ships nothing, as before
        return None


def _gitdir_link(dot_git: bytes) -> bytes | None:
    """Where a `.git` file (a linked worktree's or a submodule's) points, if it is one."""
    try:
        with open(dot_git, "rb") as handle:
            content = handle.read(4096)
    except OSError:  # no such file, or a directory
        return None
    if not content.startswith(b"gitdir:"):
        return None
    return os.path.join(os.path.dirname(dot_git), content[len(b"gitdir:"):].strip())


def _common_git_dir(top: bytes) -> bytes:
    """The directory holding info/exclude: a linked worktree's is its main repository's."""
    dot_git = os.path.join(top, b".git")
    git_dir = _gitdir_link(dot_git) or dot_git
    try:
        with open(os.path.join(git_dir, b"commondir"), "rb") as handle:
            return os.path.join(git_dir, handle.read().strip())
    except OSError:
        return git_dir


def _read_rules(files: list[bytes], base: int) -> _Rules | None:
    """The patterns of these ignore files (of one directory, later ones winning), or None if none."""
    patterns: list[_Pattern] = []
    for path in files:
        try:
            with open(path, "rb") as handle:
                content = handle.read()
        except OSError:  # missing or unreadable: git reads it as empty
            continue
        patterns += _parse(content)
    if not patterns:
        return None

    def matcher(on_name: bool, for_directories: bool) -> _Matcher | None:
        chosen = [(line, pattern) for line, pattern in reversed(list(enumerate(patterns)))
                  if pattern.on_name == on_name and (for_directories or not pattern.only_directories)]
        if not chosen:
            return None
        return _Matcher(re.compile(b"|".join(b"(" + pattern.regex + b")" for _, pattern in chosen), re.DOTALL),
                        ((-1, False), *((line, pattern.negated) for line, pattern in chosen)))

    return _Rules(base, matcher(True, False), matcher(False, False), matcher(True, True), matcher(False, True))


def _parse(content: bytes) -> list[_Pattern]:
    """An ignore file's patterns, in order."""
    patterns = []
    for line in content.removeprefix(b"\xef\xbb\xbf").split(b"\n"):
        if not line or line.startswith(b"#"):
            continue
        line = _trim_trailing_spaces(line.removesuffix(b"\r").partition(b"\0")[0])
        negated = line.startswith(b"!")
        if negated:
            line = line[1:]
        only_dirs = line.endswith(b"/")
        if only_dirs:
            line = line[:-1]
        on_name = b"/" not in line
        regex = _translate(line if on_name else line.removeprefix(b"/"), pathname=not on_name)
        if regex is not None:
            patterns.append(_Pattern(regex, negated, only_dirs, on_name))
    return patterns


def _trim_trailing_spaces(line: bytes) -> bytes:
    if not line.endswith(b" "):
        return line
    last_space = None
    index = 0
    while index < len(line):
        if line[index] == 0x20:
            if last_space is None:
                last_space = index
        else:
            last_space = None
            if line[index] == _BACKSLASH:  # escapes the next byte, a space included
                index += 1
        index += 1
    return line if last_space is None else line[:last_space]


def _translate(pattern: bytes, pathname: bool) -> bytes | None:
    """A wildmatch pattern as a regular expression that matches the same paths; None when it matches
    nothing (empty, a trailing lone backslash, an unterminated or empty bracket expression)."""
    if not pattern:
        return None
    # git compares the pattern's literal head itself and hands wildmatch the rest, so a `**` there
    # counts as at the start: `ab**/c` matches `ab/x/c`
    start = next((index for index, byte in enumerate(pattern) if byte in _GLOB_SPECIAL), len(pattern))
    parts = []
    index = 0
    while index < len(pattern):
        byte = pattern[index]
        if byte == _BACKSLASH:
            if index + 1 == len(pattern):
                return None
            parts.append(re.escape(pattern[index + 1:index + 2]))
            index += 2
        elif byte == ord("?"):
            parts.append(b"[^/]")
            index += 1
        elif byte == ord("["):
            bracket = _bracket(pattern, index)
            if bracket is None:
                return None
            members, index = bracket
            members -= {_SLASH}
            if not members:
                return None
            parts.append(_byte_class(members))
        elif byte == ord("*"):
            end = index
            while end < len(pattern) and pattern[end] == ord("*"):
                end += 1
            spans_directories = (pathname and end - index > 1
                                 and (index == start or pattern[index - 1] == _SLASH)
                                 and (end == len(pattern) or pattern[end] == _SLASH
                                      or pattern[end:end + 2] == b"\\/"))
            if not spans_directories:
                parts.append(b"[^/]*")
            elif pattern[end:end + 1] == b"/":  # `**/` also matches no directory at all
                parts.append(b"(?:.*/)?")
                end += 1
            else:
                parts.append(b".*")
            index = end
        else:
            parts.append(re.escape(pattern[index:index + 1]))
            index += 1
    return b"".join(parts)


def _bracket(pattern: bytes, index: int) -> tuple[set[int], int] | None:
    """The bytes a bracket expression at `pattern[index]` matches, and the index after it, as
    wildmatch parses it (`]` first is a member, `!` or `^` negates, `a-z`, `\\x`, `[:alpha:]`); None
    if it does not end, which makes the whole pattern match nothing."""

    def at(position: int) -> int:
        return pattern[position] if position < len(pattern) else 0

    index += 1
    negated = at(index) in b"!^"
    if negated:
        index += 1
    members: set[int] = set()
    previous = 0
    byte = at(index)
    while True:
        if not byte:
            return None
        if byte == _BACKSLASH:
            index += 1
            byte = at(index)
            if not byte:
                return None
            members.add(byte)
        elif byte == ord("-") and previous and at(index + 1) and at(index + 1) != ord("]"):
            index += 1
            byte = at(index)
            if byte == _BACKSLASH:
                index += 1
                byte = at(index)
                if not byte:
                    return None
            members.update(range(previous, byte + 1))
            byte = 0  # a range's end does not start another range
        elif byte == ord("[") and at(index + 1) == ord(":"):
            name_start = end = index + 2
            while at(end) and at(end) != ord("]"):
                end += 1
            if not at(end):
                return None
            if end - name_start < 1 or pattern[end - 1] != ord(":"):
                members.add(byte)  # no `:]`: the `[` is an ordinary member
            else:
                named = _CLASSES.get(pattern[name_start:end - 1])
                if named is None:
                    return None
                members.update(named)
                index = end
                byte = 0
        else:
            members.add(byte)
        previous = byte
        index += 1
        byte = at(index)
        if byte == ord("]"):
            break
    return (set(_ANY_BYTE - members) if negated else members), index + 1


def _byte_class(members: set[int]) -> bytes:
    ranges: list[list[int]] = []
    for byte in sorted(members):
        if ranges and ranges[-1][1] == byte - 1:
            ranges[-1][1] = byte
        else:
            ranges.append([byte, byte])
    return b"[" + b"".join(b"\\x%02x-\\x%02x" % (low, high) for low, high in ranges) + b"]"
