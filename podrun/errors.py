"""The one error type the CLI turns into a single line on stderr and an exit code."""

from podrun import exits


class PodrunError(Exception):
    """A problem the user can fix; `str(error)` is the whole message, one line."""

    exit_code = exits.FAILURE
    # the message without the host it names, where the cause is none of the host's (an account that every
    # worker refuses alike): the workers that fail alike are said in one line (launch/endings.py)
    alike: str | None = None


class SpecError(PodrunError):
    """A job spec that cannot be run: names the file, the field path and what is expected."""

    exit_code = exits.USAGE

    def __init__(self, path, field: str | None, expected: str):
        where = f"{path}: {field}: " if field else f"{path}: "
        super().__init__(where + expected)


class UsageError(PodrunError):
    """A bad flag or argument on the command line."""

    exit_code = exits.USAGE


class WaitTimedOut(PodrunError):
    """A wait for Google ran past PODRUN_WAIT_TIMEOUT; what was waited for goes on at Google."""


class WorkersUnreachable(PodrunError):
    """Workers that could not be reached when an attempt began (`workers`: their indexes)."""

    def __init__(self, message: str, workers: list[int]):
        super().__init__(message)
        self.workers = workers


class WorkersUnhealthy(WorkersUnreachable):
    """Workers that failed the preflight health check (launch/health.py): left out as unreachable ones are,
    where spares can take their place."""


class NoCapacity(PodrunError):
    """Google has no capacity for the request in its zone (RESOURCE_EXHAUSTED), or a queued request gave
    up or waited past its zone's bound: `why` in Google's words, or the wait's."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why
