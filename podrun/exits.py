"""Every exit code podrun gives, in one place (docs/exit-codes.md lists them).

A failed job exits with the code of the first worker that failed; podrun's own outcomes are these.
Standard library only, and no `signal`: the CLI imports this for every command.
"""

FAILURE = 1  # podrun could not go on (a PodrunError): one line says why
USAGE = 2  # bad usage, a bad spec, a setting podrun cannot use
INTERNAL_ERROR = 70  # EX_SOFTWARE (sysexits.h): not the user's input, a bug of podrun's
LOST = 255  # a worker's connection was lost mid-step: what ssh itself exits with then
# EX_TEMPFAIL (sysexits.h), "try again later": the TPU was preempted (the Cloud TPU API said so) and
# no restart was left; a script may retry on it
PREEMPTED = 75
# as `timeout` exits when its command ran out of time: no worker printed anything for the job's
# `stall` while run ran; every worker's stacks were saved and the job was stopped
STALLED = 124
# one past STALLED: the time that the job's capacity was given ran out (a Slurm job's time limit), and its
# scheduler ended the steps; not a stop (143), though the workers got SIGTERM
TIME_LIMIT = 125
# a stop by signal N exits 128 + N, as a shell reports a process that N ended
INTERRUPTED = 130  # SIGINT, Ctrl-C
BROKEN_PIPE = 141  # SIGPIPE: stdout's reader went away (`podrun exec job.yaml | head`)


def stopped_by(signum: int) -> int:
    """The exit code after a stop by signal `signum`: 130 for SIGINT, 143 for SIGTERM, 141 for SIGPIPE."""
    return 128 + signum


def of_process(returncode: int) -> int:
    """A process's exit code as a shell gives it: 128 + N where signal N ended it (Python's subprocesses
    and asyncssh say -N; as an exit status -9 would read 247)."""
    return stopped_by(-returncode) if returncode < 0 else returncode
