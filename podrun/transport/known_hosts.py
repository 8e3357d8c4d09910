"""Host keys on record: podrun's own known-hosts file (PODRUN_HOME/known_hosts, where a key seen on first
contact is kept) and the user's OpenSSH ones (~/.ssh/known_hosts, and the spec's ssh.known_hosts).

A host that any of them knows must present a key one of them holds for it, as OpenSSH's
StrictHostKeyChecking=accept-new requires; only a host none knows is trusted on first contact.
A host is known by the name podrun uses for it: `host`, `[host]:port` off port 22, or its alias (a
TPU worker's, as gcloud names it). In the user's files, a line names it as OpenSSH matches one:
comma-separated patterns with `*` and `?`, a `!` pattern that excludes, case-insensitive, or a hashed
name (`|1|salt|hash`, HMAC-SHA1, as HashKnownHosts writes it).

A job handed to a supervisor host carries the lines this machine's files hold for the job's hosts
(for_handover); the supervisor checks those hosts against them as against its own files (handed_over),
so that it does not trust on first use a host this machine already knows.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from functools import cache
from pathlib import Path
from typing import NamedTuple

from podrun import paths
from podrun.errors import PodrunError

USER_KNOWN_HOSTS = "~/.ssh/known_hosts"


class KnownLine(NamedTuple):
    """A line of a known-hosts file that names a host: where it is, and what it says of the host."""

    path: str
    number: int
    marker: str  # "" or "@cert-authority " / "@revoked "
    key: str  # "ssh-ed25519 AAAA..."
    elsewhere: bool = False  # a line of the machine that handed the job over (path and number are there)

    def as_known(self, known_as: str) -> str:
        """The line with the host's own name in place of the patterns that matched it (asyncssh matches
        `[` and `]` in a pattern as a character class, OpenSSH as themselves)."""
        return f"{self.marker}{known_as} {self.key}\n"


def podrun_known_hosts() -> Path:
    return Path(paths.podrun_home()) / "known_hosts"


def user_files(spec_file: str | None) -> list[str]:
    """The user's known-hosts files podrun reads: the spec's ssh.known_hosts (load_spec checked that it
    exists), then ~/.ssh/known_hosts where there is one."""
    files = [os.path.expanduser(spec_file)] if spec_file is not None else []
    default = os.path.expanduser(USER_KNOWN_HOSTS)
    if os.path.isfile(default) and default not in files:
        files.append(default)
    return files


def lines_for(known_as: str, files: list[str]) -> list[KnownLine]:
    """The lines of `files` that name the host, in file order."""
    return [line for path in files for line, patterns in _lines(path) if _names(patterns, known_as)]


@cache
def _lines(path: str) -> list[tuple[KnownLine, str]]:
    """Each entry of a known-hosts file, with its host patterns (read once per process)."""
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode(errors="replace")
    except OSError as error:
        raise PodrunError(f"{path}: cannot read it ({error.strerror or error}); expected a known-hosts file") from None
    return _parsed(text.splitlines(), path, 1)


def _parsed(lines: list[str], path: str, first_number: int, elsewhere: bool = False) -> list[tuple[KnownLine, str]]:
    entries = []
    for number, line in enumerate(lines, first_number):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = f"{fields.pop(0)} " if fields[0].startswith("@") else ""
        if len(fields) >= 3:
            entries.append((KnownLine(path, number, marker, " ".join(fields[1:3]), elsewhere), fields[0]))
    return entries


def _names(patterns: str, known_as: str) -> bool:
    if patterns.startswith("|1|"):
        salt, _, digest = patterns[3:].partition("|")
        try:
            expected = base64.b64decode(digest, validate=True)
            mac = hmac.new(base64.b64decode(salt, validate=True), known_as.encode(), hashlib.sha1).digest()
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(mac, expected)
    name = known_as.lower()
    named = False
    for pattern in patterns.lower().split(","):
        negated = pattern.startswith("!")
        if _wildcard(pattern.lstrip("!")).fullmatch(name):
            if negated:
                return False
            named = True
    return named


@cache
def _wildcard(pattern: str) -> re.Pattern[str]:
    return re.compile(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."))


def where(lines: list[KnownLine]) -> str:
    """`FILE line N` for each line."""
    return " and ".join(f"{line.path} line {line.number}" + (" on the machine that handed this job over"
                                                              if line.elsewhere else "") for line in lines)


def for_handover(hosts: list[str], spec_file: str | None) -> list[dict]:
    """The lines that the user's files and podrun's own hold for these hosts (as SshTransport.known_as
    names them), each as {path, number, line}: public keys only, for a job's handover to carry."""
    files = user_files(spec_file)
    if podrun_known_hosts().is_file():
        files.append(str(podrun_known_hosts()))
    return [{"path": line.path, "number": line.number, "line": line.as_known(known_as).strip()}
            for known_as in dict.fromkeys(hosts) for line in lines_for(known_as, files)]


_handed_over: list[tuple[KnownLine, str]] = []  # on a supervisor host: the lines the job came with, by host


def take_handed_over(entries: list[dict]) -> None:
    """Keep the lines a handed-over job carries (for_handover) for this process and those it forks."""
    _handed_over[:] = [(line, patterns) for entry in entries
                       for line, patterns in _parsed([entry["line"]], entry["path"], entry["number"], elsewhere=True)]


def handed_over(known_as: str) -> list[KnownLine]:
    """The lines the handed-over job carries for this host."""
    return [line for line, patterns in _handed_over if patterns == known_as]


def podrun_lines(known_as: str) -> bytes:
    """The lines of podrun's known-hosts file for this host (host[:port] or alias), or b"" if it was never seen."""
    try:
        lines = podrun_known_hosts().read_bytes().splitlines(keepends=True)
    except FileNotFoundError:
        return b""
    pattern = known_as.encode()
    return b"".join(line for line in lines if line.split(b" ", 1)[0] == pattern)


def remember(known_as: str, keys: list[str]) -> None:
    """Add `known_as key` lines ("ssh-ed25519 AAAA...") to podrun's known-hosts file."""
    if not keys:
        return
    path = podrun_known_hosts()
    paths.make_private_dir(str(path.parent))
    lines = "".join(f"{known_as} {key}\n" for key in keys).encode()
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as error:
        raise paths.unusable_home(error) from None
    try:
        os.write(descriptor, lines)  # one small append: parallel connects never interleave
    finally:
        os.close(descriptor)
