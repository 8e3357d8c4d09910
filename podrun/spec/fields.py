"""The building blocks of the job spec's models, shared by spec/model.py and each target's options
(targets/*_options.py): the base model, durations, host entries, and how a value is named in errors."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

_NUMBER = r"\d+(?:\.\d+)?"
# seconds, or hours, minutes and seconds; no named groups, for editors' (JavaScript) regular expressions too
DURATION = re.compile(rf"(?=\d)(?:({_NUMBER})|(?:({_NUMBER})h)?(?:({_NUMBER})m)?(?:({_NUMBER})s)?)")
DURATION_SCHEMA = {"anyOf": [{"type": "number", "exclusiveMinimum": 0},
                             {"type": "string", "pattern": f"^{DURATION.pattern}$"}]}
HOST_FORMS = "host, user@host, host:port or user@host:port"
HOST_ENTRY = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[^@:\s\[\]]+))"
                        r"(?::(?P<port>\d{1,5}))?\Z")


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def duration_s(text: str) -> float | None:
    """`30s`, `2m`, `1h`, `1m30s` or a plain number of seconds (`90`, `2.5`) -> seconds; None if none of those."""
    match = DURATION.fullmatch(text.strip())
    if not match:
        return None
    plain, hours, minutes, seconds = (float(part or 0) for part in match.groups())
    return plain + hours * 3600 + minutes * 60 + seconds


def parse_host(entry: str) -> tuple[str | None, str, int | None]:
    """`host`, `user@host`, `host:port`, `user@host:port` (IPv6 in brackets) -> (user, host, port)."""
    match = HOST_ENTRY.match(entry)
    if not match or (match["port"] and not 1 <= int(match["port"]) <= 65535):
        raise ValueError(f"expected {HOST_FORMS}, got {entry!r}")
    return match["user"], match["ipv6"] or match["host"], int(match["port"]) if match["port"] else None


JUMP_FORMS = "user@bastion[:port], several joined by commas (the first is reached first), or none"


def parse_jumps(text: str) -> list[tuple[str | None, str, int | None]]:
    """OpenSSH's ProxyJump, `user@bastion:port,user@inner` -> [(user, host, port), ...] in the order they are
    reached; `none` (no jump host, whatever ~/.ssh/config says) -> []."""
    if text.strip().lower() == "none":
        return []
    try:
        return [parse_host(entry.strip()) for entry in text.split(",")]
    except ValueError:
        raise ValueError(f"expected {JUMP_FORMS}, got {got(text)}") from None


def _host_entry(entry: str) -> str:
    parse_host(entry)
    return entry


HostEntry = Annotated[str, AfterValidator(_host_entry)]


def yaml_kind(value: Any) -> str:
    kinds = {type(None): "nothing", bool: "a boolean", int: "a number", float: "a number",
             str: "a string", list: "a list", dict: "a mapping"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def got(value: Any) -> str:
    """A value as an error message names it: `expected ..., got <this>`."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
    if type(value) in (int, float):
        return str(value)
    return ("an empty " + yaml_kind(value).removeprefix("a ")) if value in ([], {}) else yaml_kind(value)
