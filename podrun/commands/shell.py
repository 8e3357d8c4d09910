"""`podrun ssh`: a shell on one worker, or a command there, at the user's own terminal."""

from __future__ import annotations

import os
import sys

from podrun.errors import PodrunError, UsageError
from podrun.spec.adhoc import TargetFlags, command_line, target_spec
from podrun.targets.base import target_for


def ssh(spec_path: str | None, flags: TargetFlags, worker_index: int, command: list[str]) -> int:
    """Replace podrun with the worker's shell (ssh, or a local shell in a local worker's directory):
    its exit code is the command's, its terminal the user's."""
    spec = target_spec(spec_path, flags)
    workers = target_for(spec).workers(dry_run=False)
    if worker_index >= len(workers):
        raise UsageError(f"--worker {worker_index}: this target has workers 0 to {len(workers) - 1}")
    argv, cwd = workers[worker_index].transport.interactive(command_line(command) if command else None,
                                                            terminal=sys.stdin.isatty())
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if cwd is not None:
            os.chdir(cwd)
        os.execvp(argv[0], argv)
    except OSError as error:
        raise PodrunError(f"cannot start {argv[0]}: {error.strerror or error}"
                          + ("; install the OpenSSH client" if argv[0] == "ssh" else "")) from None
