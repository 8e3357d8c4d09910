"""The checks on the spec's commands: what fits one `sh -c`, and the script that `run` names."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from podrun.errors import SpecError
from podrun.spec.model import JobSpec

# what `run` holds is guessed at only when it is one plain command
SHELL_SYNTAX = re.compile(r"[;&|$`\n()<>]")
# one word of a plain command, as the shell (and shlex.split, quadratic on a long word) reads it
SHELL_WORD = re.compile(r"""(?:[^ \t\r\n'"\\]+|\\.|'[^']*'|"(?:[^"\\]+|\\.)*")+""", re.S)
SHELL_BLANKS = re.compile(r"[ \t\r\n]*")
QUOTED_PART = re.compile(r"""\\(.)|'([^']*)'|"((?:[^"\\]+|\\.)*)"|([^'"\\]+)""", re.S)
ESCAPED_IN_DOUBLE_QUOTES = re.compile(r'\\(["\\])')
# Linux's MAX_ARG_STRLEN: the most one argument or variable (NAME=value) may hold, its final NUL included;
# the agent runs a command as `sh -c COMMAND`
MAX_ARG_BYTES = 128 * 1024
PYTHON = re.compile(r"^(?:.*/)?python(?:\d+(?:\.\d+)?)?\Z")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def refuse_python_under_torchrun(path: Path, run: str) -> None:
    words = run.split()
    if words and PYTHON.match(words[0]):
        script = _after_python(words)
        fix = f"drop it: run: {' '.join(script)}" if script else "drop it and name the script"
        raise SpecError(path, "run", f"with torchrun, run is the script and its arguments: torchrun starts Python "
                                     f"itself, so it would run {words[0]!r} as the script; {fix}")


def check_command_size(path: Path, field: str, command: str) -> None:
    """A command the agent can run as `sh -c COMMAND`: one argument, so at most MAX_ARG_BYTES."""
    size = len(command.encode(errors="surrogateescape"))
    if size >= MAX_ARG_BYTES:
        raise SpecError(path, field, f"{size} bytes, over the {MAX_ARG_BYTES // 1024} KiB "
                                     f"Linux allows one command; put it in a script in the workdir and run that")


def _after_python(words: list[str]) -> list[str] | None:
    """The script and its arguments of `python [options] script args...`; None with -m, -c or - (stdin)."""
    at = 1
    while at < len(words) and words[at].startswith("-"):
        option = words[at]
        at += 1
        if option == "--":
            break
        if option == "-" or option.startswith(("-m", "-c")):
            return None
        if option in ("-W", "-X"):  # the options that take their value as the next word
            at += 1
    return words[at:]


def check_run_script(spec: JobSpec) -> None:
    """Before a run: a script that `run` names (a relative path ending in .py or holding a /) is in the workdir."""
    script = _script_in(spec)
    # `setup` may make it: a download, a build, a checkout
    if script is None or script in (spec.setup or "") or (Path(spec.workdir) / script).exists():
        return
    folder = Path(spec.workdir) / os.path.dirname(script)
    names = sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []
    nearest = difflib.get_close_matches(os.path.basename(script), names, n=1)
    hint = f"; did you mean {os.path.join(os.path.dirname(script), nearest[0])}?" if nearest else ""
    raise SpecError(spec.path, "run", f"{script} is not in the workdir ({spec.workdir}){hint}")


def _script_in(spec: JobSpec) -> str | None:
    """The relative path of the file `run` starts, when it plainly names one; shell syntax is not guessed at."""
    if SHELL_SYNTAX.search(spec.run):
        return None
    words = _shell_words(spec.run)
    if words is None:  # unbalanced quotes: the shell will say so
        return None
    assignments = 0
    while assignments < len(words) and ASSIGNMENT.match(words[assignments]):  # `OMP_NUM_THREADS=1 python3 train.py`
        assignments += 1
    words = words[assignments:]
    if words and not spec.torchrun and PYTHON.match(words[0]):
        words = _after_python(words) or []
    if not words:
        return None
    script = words[0]
    looks_like_file = script.endswith(".py") or "/" in script
    return script if looks_like_file and not script.startswith(("/", "~")) else None


def _shell_words(command: str) -> list[str] | None:
    """shlex.split(command) in linear time (a command without shell syntax); None for unbalanced quotes."""
    words, at = [], 0
    while (at := SHELL_BLANKS.match(command, at).end()) < len(command):  # type: ignore[union-attr]
        word = SHELL_WORD.match(command, at)
        if word is None:
            return None
        words.append("".join(_unquoted(part) for part in QUOTED_PART.finditer(word[0])))
        at = word.end()
    return words


def _unquoted(part: re.Match[str]) -> str:
    escaped, single, double, plain = part.groups()
    if double is not None:
        return ESCAPED_IN_DOUBLE_QUOTES.sub(r"\1", double)
    return next(text for text in (escaped, single, plain) if text is not None)

