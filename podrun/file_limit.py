"""The launcher's limit on open files, for the commands that reach every worker at once.

Such a command holds a few files per worker at once: its connection, the pipes of the processes it
runs there (a local worker's commands are processes here), its log. A laptop's default soft limit of
256 (macOS; often 1024 on Linux) would end `podrun exec` on a few dozen local workers with "Too many
open files". So, as servers do, podrun raises its own soft limit to the hard one, and first works out
what the job needs: if even the hard limit is too low, it stops before connecting to any worker, with
one line saying how many it needs and how to raise the limit. A local worker's processes get back the
soft limit podrun was given (local_command).

The counts below were measured: the peak of /proc/PID/fd during `podrun exec` (docs/benchmarks.md,
"Open files").
"""

from __future__ import annotations

import os
import pwd
import resource
import sys
from collections.abc import Iterable

from podrun.errors import UsageError

# measured: 11 at one local worker, 7 at one SSH host (stdio, the event loop, a process being started);
# the rest is room for what comes and goes: DNS look-ups in asyncio's threads (up to 32 at once), the
# Cloud TPU API's connections, a file being packed or written
BASE = 64
# a command on a local worker is a process here with three pipes (stdin, stdout, stderr); on Linux,
# Python 3.12's asyncio waits for each through a pidfd as well
LOCAL_PROCESS = 3 + (sys.version_info >= (3, 12) and hasattr(os, "pidfd_open"))
# an SSH worker: its connection's socket, and the ssh-agent's socket while it authenticates; its
# commands are channels on the connection, which take none
SSH_CONNECTION = 2
LIMITS_HOW_TO = {
    "darwin": "`ulimit -n {need}`; if that is refused, raise the system's limits: `sudo launchctl limit maxfiles "
              "{need} unlimited` and `sudo sysctl kern.maxfilesperproc={need}`",
    "linux": "`ulimit -n {need}` in a shell whose hard limit allows it, or raise the hard limit: "
             "`{user} hard nofile {need}` in /etc/security/limits.conf (then log in again), or "
             "LimitNOFILE={need} for a systemd service",
}

_given_soft: int | None = None  # the soft limit podrun started with, once it raised its own


def needed(kinds: Iterable[str], processes: int, files: int = 0, here: int = 0) -> int:
    """The open files a command needs that runs `processes` commands at once on each worker (of these
    transport kinds, as Transport.endpoint() says), `here` processes of its own on
    this machine for each, and keeps `files` open for each."""
    # over SSH a worker is one connection, its channels included; a local worker's processes hold pipes here
    return BASE + sum((SSH_CONNECTION if kind == "ssh" else processes * LOCAL_PROCESS) + here * LOCAL_PROCESS + files
                      for kind in kinds)


def make_room(need: int, what: str) -> None:
    """Raise podrun's soft limit on open files to its hard limit (where the kernel refuses that, to
    `need`); UsageError if `need` does not fit even so. `what`: what they are for ("200 local workers")."""
    global _given_soft
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return
    unlimited = hard == resource.RLIM_INFINITY
    # macOS: the hard limit is often RLIM_INFINITY, yet the kernel refuses a soft limit over
    # kern.maxfilesperproc (setrlimit(2): EINVAL); then podrun asks for what it needs, not more
    for wanted in (hard, need):
        if wanted != resource.RLIM_INFINITY and (wanted <= soft or (wanted > hard and not unlimited)):
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):  # macOS: over kern.maxfilesperproc
            continue
        if _given_soft is None:
            _given_soft = soft
        soft = wanted
        break
    if soft != resource.RLIM_INFINITY and soft < need:
        how = LIMITS_HOW_TO.get(sys.platform, LIMITS_HOW_TO["linux"]).format(
            need=need, user=pwd.getpwuid(os.getuid()).pw_name)
        limit = "unlimited" if unlimited else f"{hard:,}"
        raise UsageError(f"{what} need about {need:,} open files at once, but podrun may open only {soft:,} "
                         f"(hard limit: {limit}); raise the limit: {how}")


def local_command(command: str) -> str:
    """`command` (a shell string) as podrun starts it here: with the soft limit podrun was given, as
    systemd advises for a program that raised its own: a child using select() breaks on descriptors
    over 1024, and the job should meet the limit it would meet without podrun."""
    return f"ulimit -S -n {_given_soft} 2>/dev/null; {command}" if _given_soft is not None else command
