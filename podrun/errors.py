"""The one error type the CLI turns into a single line on stderr and an exit code."""

USAGE_EXIT_CODE = 2


class PodrunError(Exception):
    """A problem the user can fix; `str(error)` is the whole message, one line."""

    exit_code = 1


class SpecError(PodrunError):
    """A job spec that cannot be run: names the file, the field path and what is expected."""

    exit_code = USAGE_EXIT_CODE

    def __init__(self, path, field: str | None, expected: str):
        where = f"{path}: {field}: " if field else f"{path}: "
        super().__init__(where + expected)


class UsageError(PodrunError):
    """A bad flag or argument on the command line."""

    exit_code = USAGE_EXIT_CODE
