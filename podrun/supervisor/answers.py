"""What a supervisor host says, checked before the laptop uses any of it: its job id becomes a directory
in the laptop's job store, and its record's fields reach `podrun jobs`, report.html and every later
listing. Whatever else it says is refused in one line naming the host and the field.

The laptop never reaches a supervised job's workers itself (logs, stop and stacks go through the
supervisor): the workers' endpoints it sends are kept as nothing, and of the processes it names (its
launcher, a local supervisor, a cleanup command) none is taken.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from podrun import jobstore
from podrun.errors import PodrunError

SHOWN_CHARS = 60  # of a refused value
MISSING = object()  # a required field's value, where it has none


class Refused(PodrunError):
    """What a supervisor host said is not what its podrun says: one line, ending `refused`."""


def started(line: bytes, host: str, name: str) -> tuple[str, str]:
    """The job id and console directory of `_supervise`'s first line (daemon.py), for a job of this name: the
    id handed over, or one of the host's own where its store had that one already."""
    try:
        fields = json.loads(line)
    except ValueError:
        fields = None
    if not isinstance(fields, dict) or not isinstance(fields.get("console"), str):
        raise Refused(f"supervisor {host}: its first line {_shown(line.decode(errors='replace'))} is not the job it "
                      f"started ({{\"job\": ID, \"console\": DIR}}); refused")
    job_id = fields.get("job")
    if not isinstance(job_id, str) or not jobstore.is_job_id(job_id, name):
        raise Refused(f"supervisor {host}: its job id {_shown(job_id)} is not one (expected {name}-YYYYMMDD-HHMMSS-XXXX, "
                      f"as podrun makes them); refused")
    return job_id, fields["console"]


class _Bad(Exception):
    """A field that is not what it must be: its dotted path, its value and what was expected."""

    def __init__(self, path: str, value: object, expected: str):
        super().__init__(path, value, expected)
        self.path, self.value, self.expected = path, value, expected


def record(fields: object, job_id: str, host: str) -> jobstore.JobRecord:
    """The record that the supervisor `host` keeps of job `job_id` (an entry of its `podrun jobs --json`),
    checked, its workers' endpoints kept as nothing; the pointer takes its fields but where the job lives
    (JobRecord.take_fields)."""
    try:
        _check_object(fields, RECORD, "")
        assert isinstance(fields, dict)
        if fields["id"] != job_id:
            raise _Bad("id", fields["id"], f"{job_id}, the job it was asked about")
    except _Bad as bad:
        raise Refused(f"supervisor {host}: job {job_id}: its {bad.path} is {_shown(bad.value)}; expected "
                      f"{bad.expected}; refused") from None
    workers = [jobstore.WorkerRecord(**{**worker, "endpoint": {}}) for worker in fields["workers"]]
    kept = {name: value for name, value in fields.items() if name not in DERIVED}
    return jobstore.JobRecord(**{**kept, "workers": workers})


def _shown(value: object) -> str:
    if value is MISSING:
        return "missing"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."


# --- what each field must be: a check raises _Bad(path, value, expected)

Check = Callable[[object, str], None]


def _kind(test: Callable[[object], bool], expected: str, nullable: bool = False) -> Check:
    def check(value: object, path: str) -> None:
        if not (value is None and nullable or test(value)):
            raise _Bad(path, value, f"{expected} or null" if nullable else expected)
    return check


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _at_least(low: float, high: float = math.inf, whole: bool = False) -> Callable[[object], bool]:
    def test(value: object) -> bool:
        if whole and not isinstance(value, int):
            return False
        return _is_number(value) and low <= value <= high  # type: ignore[operator]
    return test


SECONDS = _kind(_at_least(0), "epoch seconds")
MAYBE_SECONDS = _kind(_at_least(0), "epoch seconds", nullable=True)
COUNT = _kind(_at_least(0, whole=True), "a count (0 or more)")
MAYBE_COUNT = _kind(_at_least(0, whole=True), "a count (0 or more)", nullable=True)
EXIT_CODE = _kind(_at_least(-255, 255, whole=True), "an exit code (-255 to 255)", nullable=True)
DURATION = _kind(_at_least(0), "a number of seconds (0 or more)")
POSITIVE = _kind(lambda value: _is_number(value) and value != 0 and _at_least(0)(value), "a number of seconds above 0")
TEXT = _kind(lambda value: isinstance(value, str), "text")
MAYBE_TEXT = _kind(lambda value: isinstance(value, str), "text", nullable=True)
FLAG = _kind(lambda value: isinstance(value, bool), "true or false")
ANY_OBJECT = _kind(lambda value: isinstance(value, dict), "an object", nullable=True)
STATE = _kind(lambda value: value in jobstore.STATES, f"one of {', '.join(jobstore.STATES)}")


def _list_of(item: Check) -> Check:
    def check(value: object, path: str) -> None:
        if not isinstance(value, list):
            raise _Bad(path, value, "a list")
        for index, entry in enumerate(value):
            item(entry, f"{path}.{index}")
    return check


def _object(fields: dict[str, Check], required: tuple[str, ...] = (), more: bool = False) -> Check:
    """An object of these fields (`required` ones present); others only with `more` (a phase's details)."""
    def check(value: object, path: str) -> None:
        _check_object(value, (fields, required, more), path)
    return check


def _check_object(value: object, shape: tuple[dict[str, Check], tuple[str, ...], bool], path: str) -> None:
    fields, required, more = shape
    if not isinstance(value, dict):
        raise _Bad(path or "record", value, "an object")
    prefix = f"{path}." if path else ""
    for name in required:
        if name not in value:
            raise _Bad(f"{prefix}{name}", MISSING, "a value")
    for name, entry in value.items():
        if name in fields:
            fields[name](entry, f"{prefix}{name}")
        elif not more:
            raise _Bad(f"{prefix}{name}", entry, "no such field")


def _or_null(check: Check) -> Check:
    def or_null(value: object, path: str) -> None:
        if value is not None:
            check(value, path)
    return or_null


def _mapping_of_workers(item: Check) -> Check:
    """An object whose keys are worker indexes ("0", "1", ...)."""
    def check(value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise _Bad(path, value, "an object")
        for key, entry in value.items():
            if not (isinstance(key, str) and key.isdigit()):
                raise _Bad(path, key, "worker indexes as keys")
            item(entry, f"{path}.{key}")
    return check


def _span(value: object, path: str) -> None:
    """A worker's part of a phase: [start, end or null]."""
    if not (isinstance(value, list) and len(value) == 2):
        raise _Bad(path, value, "[start, end or null]")
    SECONDS(value[0], f"{path}.0")
    MAYBE_SECONDS(value[1], f"{path}.1")


def _counts(value: object, path: str) -> None:
    """timeline.keep_lines's counts: at most MAX_SLOTS numbers, space-separated."""
    from podrun.timeline import MAX_SLOTS

    if not (isinstance(value, str) and len(value.split()) <= MAX_SLOTS and all(c.isdigit() for c in value.split())):
        raise _Bad(path, value, f"at most {MAX_SLOTS} counts, space-separated")


WORKER = _object({"index": COUNT, "address": TEXT, "exit_code": EXIT_CODE, "signal": MAYBE_TEXT,
                  "endpoint": ANY_OBJECT, "stop_reason": MAYBE_TEXT, "rank": MAYBE_COUNT, "output_at": MAYBE_SECONDS,
                  "killed": FLAG, "step": MAYBE_COUNT, "step_at": MAYBE_SECONDS}, required=("index", "address"))
CAUSE = _object({"class": TEXT, "worker": COUNT, "rank": MAYBE_COUNT, "step": MAYBE_COUNT, "text": TEXT},
                required=("class", "worker", "text"))  # launch/causes.py
STRAGGLER = _object({"worker": COUNT, "held": COUNT, "samples": COUNT, "in": TEXT, "others": TEXT, "said": TEXT,
                     "sample_s": DURATION}, required=("worker", "said"))  # launch/stragglers.py
ATTEMPT = _object({"attempt": COUNT, "state": STATE, "exit_code": EXIT_CODE, "summary": MAYBE_TEXT,
                   "started_at": SECONDS, "ended_at": MAYBE_SECONDS, "cause": _or_null(CAUSE),
                   "straggler": _or_null(STRAGGLER)},
                  required=("attempt", "state", "exit_code", "summary", "started_at", "ended_at"))
PHASE = _object({"phase": TEXT, "attempt": COUNT, "start": SECONDS, "end": MAYBE_SECONDS,
                 "workers": _mapping_of_workers(_span),
                 "lines": _mapping_of_workers(_object({"start": SECONDS, "every_s": POSITIVE, "counts": _counts},
                                                      required=("start", "every_s", "counts")))},
                required=("phase", "attempt", "start", "end"), more=True)


def _samples(value: object, path: str) -> None:
    """progress.py's samples: at most MAX_SAMPLES + 1 pairs of epoch seconds and a step, flat."""
    from podrun.progress import MAX_SAMPLES

    if not (isinstance(value, list) and len(value) % 2 == 0 and len(value) <= 2 * MAX_SAMPLES + 2):
        raise _Bad(path, value, f"at most {MAX_SAMPLES + 1} pairs of epoch seconds and a step")
    for index, number in enumerate(value):
        (COUNT if index % 2 else SECONDS)(number, f"{path}.{index}")


EPOCH = _object({"epoch": COUNT, "step": COUNT, "first": COUNT, "steps": COUNT},
                required=("epoch", "step", "first", "steps"))  # an epoch group's count (progress.py)
STEPS = _object({"attempt": COUNT, "first": COUNT, "first_at": SECONDS, "last": COUNT, "last_at": SECONDS,
                 "samples": _samples, "epoch": EPOCH, "firsts": _mapping_of_workers(COUNT)},
                required=("attempt", "first", "first_at", "last", "last_at", "samples"))
PRICE = _object({"per_hour": _kind(_at_least(1e-9), "a price above 0", nullable=True),
                 "source": TEXT, "why": TEXT}, required=("per_hour",))  # JobRecord.price, where it has one
DERIVED = ("cost", "notes")  # what `jobs --json` adds to a record: worked out again here, or kept apart
EVENT = _object({"event": TEXT, "attempt": COUNT, "at": SECONDS, "to": TEXT, "by": TEXT, "delivered": FLAG,
                 "tries": COUNT, "error": MAYBE_TEXT}, required=("event", "attempt", "delivered"))  # notify.py
RECORD = ({"id": TEXT, "name": TEXT, "target": TEXT, "spec_path": TEXT, "workers": _list_of(WORKER), "state": STATE,
           "started_at": SECONDS, "ended_at": MAYBE_SECONDS, "exit_code": EXIT_CODE, "summary": MAYBE_TEXT,
           "launcher": ANY_OBJECT, "detached": FLAG, "stop_grace_s": DURATION, "attempt": COUNT,
           "attempts": _list_of(ATTEMPT), "supervisor": ANY_OBJECT, "cleanup": MAYBE_TEXT,
           "supervised_by": ANY_OBJECT, "phases": _list_of(PHASE), "shared_root": FLAG, "steps": _list_of(STEPS),
           "events": _list_of(EVENT), "price": _or_null(PRICE), "giving_back": MAYBE_TEXT, "cost": ANY_OBJECT,
           "notes": _list_of(TEXT), "cause": _or_null(CAUSE), "total_steps": MAYBE_COUNT,
           "straggler": _or_null(STRAGGLER)},
          ("id", "name", "target", "spec_path", "workers"), False)
