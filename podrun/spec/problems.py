"""What is wrong with a spec's fields, a line each: pydantic's errors in podrun's words."""

from __future__ import annotations

import difflib
import re
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from podrun.errors import PodrunError, SpecError
from podrun.spec.fields import got
from podrun.spec.messages import EXPECTED, NAME_RULES
from podrun.spec.model import JobSpec

PLAIN_KEY = re.compile(r"^[\w-]+\Z")


class SpecProblems(SpecError):
    """Every problem found in one spec, one line each, as a SpecError says one."""

    def __init__(self, path: Path, problems: list[tuple[str | None, str]]):
        PodrunError.__init__(self, "\n".join(str(SpecError(path, field, expected)) for field, expected in problems))


class FieldProblems(Exception):
    """What is wrong with a spec's fields: (field path, what is expected) for each problem."""

    def __init__(self, problems: list[tuple[str | None, str]]):
        super().__init__(problems)
        self.problems = problems


def validate_fields(data: dict) -> JobSpec:
    """A spec's fields, checked (raises FieldProblems); load_spec reads them from a file, the
    command line's ad-hoc targets build them (adhoc.py)."""
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        raise FieldProblems(_problems(error)) from None


def field_path(parts: tuple[str, ...] | list[str]) -> str | None:
    """`target.hosts.0`; a key that is not a plain name (a generated or mistyped one may hold
    anything, newlines included) quoted, to keep the message on one line."""
    return ".".join(part if PLAIN_KEY.match(part) else repr(part) for part in parts) or None


def _problems(error: ValidationError) -> list[tuple[str | None, str]]:
    """(field path, what is expected) for each of pydantic's errors, in podrun's words, without repeats."""
    problems: list[tuple[str | None, str]] = []
    for detail in error.errors():
        loc = [str(part) for part in detail["loc"]]
        if detail["type"] == "invalid_key":  # a key that is no text (`? ` alone, `1: x`): the mapping is at fault
            loc = loc[:-1]
        problem = (field_path([part for part in loc if part != "[key]"]), _in_plain_words(detail, loc))
        if problem not in problems:
            problems.append(problem)
    return problems


def _in_plain_words(detail: Any, loc: list[str]) -> str:
    kind, value = detail["type"], detail.get("input")
    if kind == "value_error":  # raised by podrun's own validators: already in its words
        return detail["msg"].removeprefix("Value error, ").replace("\n", "\\n")
    if kind == "invalid_key":
        return f"every key must be a field name, got {got(value)} as a key"
    if kind == "extra_forbidden":
        known = _field_names(loc[:-1])
        nearest = difflib.get_close_matches(loc[-1], known, n=1)
        return "unknown field; " + (f"did you mean {nearest[0]!r}?" if nearest else f"expected one of: {', '.join(known)}")
    shape = _shape(loc)
    if kind == "string_pattern_mismatch":
        noun, rule = NAME_RULES[shape]
        return f"{got(value)} is not {noun}: {rule}"
    expected = EXPECTED.get(shape) or "{} ({})".format(*NAME_RULES[shape])
    if kind == "missing":
        return f"required field is missing; expected {expected}"
    return f"expected {expected}, got {got(value)}"


def _shape(loc: list[str]) -> str:
    """`loc` with each list index and mapping key that is not a field as `*`: `target.hosts.*`, `env.*.[key]`."""
    return ".".join(part if part == "[key]" or part in _field_names(loc[:index]) else "*"
                    for index, part in enumerate(loc))


def _field_names(loc: list[str]) -> list[str]:
    """The valid field names (as written in a spec) of the model found at `loc` inside JobSpec."""
    model: type[BaseModel] | None = JobSpec
    for part in loc:
        field = _fields(model).get(part) if model else None
        model = _model_in(field.annotation) if field else None
    return list(_fields(model)) if model else []


def _fields(model: type[BaseModel]) -> dict[str, Any]:
    return {field.alias or name: field for name, field in model.model_fields.items()}


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
