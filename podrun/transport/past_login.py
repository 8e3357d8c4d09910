"""Reading a remote command's own output past what the host's login printed before it.

A login may print on a command's stdout and stderr before the command starts: a motd, a warning from
~/.ssh/rc, a line from ~/.bashrc (Debian's bash reads it for every command sshd runs). So what podrun
reads from a command begins with a line of the command's own form (a report), and a reader takes the
first line of that form and leaves out the lines before it: the detached follower's report on
stderr, the relay receiver's `port N`, and, where a command's whole output is to be shown or parsed
(the supervisor's podrun), a BEGIN line the command's shell prints on each stream before it runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from podrun.transport.base import ChannelOutput

T = TypeVar("T")

MARK = "@podrun:"  # podrun's own lines that a login shell's script prints start so
BEGIN = f"{MARK}begin"


def report_in(text: str, parse: Callable[[str], T | None]) -> tuple[T, str] | None:
    """The first line of `text` that `parse` takes as a report (what parse made of it), and the text
    after that line; None if no line is one."""
    lines = text.split("\n")
    for number, line in enumerate(lines):
        report = parse(line)
        if report is not None:
            return report, "\n".join(lines[number + 1:])
    return None


async def read_report(stream: ChannelOutput, parse: Callable[[bytes], T | None],
                      skipped: list[bytes] | None = None) -> T | None:
    """Read `stream` up to its first line that `parse` takes as a report: what parse made of it; None
    if the stream ended first. The lines before it go to `skipped`, if given."""
    while line := await stream.readline():
        report = parse(line)
        if report is not None:
            return report
        if skipped is not None:
            skipped.append(line)
    return None


def begun(command: str) -> str:
    """`command` after a BEGIN line on its stdout and on its stderr, printed by the shell that runs it."""
    return f"printf '%s\\n' {BEGIN} && printf '%s\\n' {BEGIN} >&2 && {command}"


async def past_login(stream: ChannelOutput) -> bytes:
    """Read a begun() command's stream past its BEGIN line. Returns b"", or everything the stream held
    if it ended without one (the shell failed before it: what it said is all there is)."""
    skipped: list[bytes] = []
    found = await read_report(stream, lambda line: True if line.rstrip(b"\r\n") == BEGIN.encode() else None,
                              skipped)
    return b"" if found else b"".join(skipped)
