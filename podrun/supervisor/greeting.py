"""The first exchange of a handover, before the job: the laptop names the podrun version it needs, and
the supervisor host's `podrun _supervise` answers with its own, before it loads the rest of podrun.

So a handover needs no version check of its own (a login shell and `podrun --version` there, a round
trip and a Python start): the laptop remembers which podrun answered (early.remember) and starts
that one the next time; one that answers another version, or nothing (a podrun from before this
exchange fails on the line: it is not the job it reads), is asked no further, and the laptop finds or
installs the right one (install.podrun_on_host). The job, secrets included, goes only to a podrun
that answered this version. Light on purpose: the host's side runs before anything heavy is imported.
"""

from __future__ import annotations

import os

from podrun import __version__

ANSWER = "@podrun:version="  # a line of past_login.MARK's form (importing podrun.transport loads asyncio)
READ_SIZE = 1 << 16


def this_version() -> str:
    return f"podrun {__version__}"


def wanted_line() -> bytes:
    """The laptop's first line to `_supervise`."""
    return this_version().encode() + b"\n"


def answered(line: bytes) -> str | None:
    """The version in `_supervise`'s first line (after BEGIN); None if it is not an answer."""
    text = line.decode(errors="replace").rstrip("\r\n")
    return text[len(ANSWER):] if text.startswith(ANSWER) else None


def answer(fd: int = 0) -> bytes | None:
    """The host's side: read the wanted version from `fd`, say this podrun's on stdout. What came after the
    line (the job, if the laptop sent it already), or None if another version was wanted."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(fd, READ_SIZE)
        if not chunk:
            return None  # the laptop went away before it said what it wants
        data += chunk
    wanted, _, rest = data.partition(b"\n")
    os.write(1, f"{ANSWER}{this_version()}\n".encode())
    return rest if wanted.decode(errors="replace") == this_version() else None
