"""The labels podrun puts on every TPU VM and queued resource it creates (docs/targets/tpu.md: Labels
and orphans), so that `podrun list --orphans` finds what no live job owns:

- `podrun-job`: the job's id; `create` for a TPU that `podrun create` made (an id always ends in
  `-YYYYMMDD-HHMMSS-xxxx`, so no job's id reads `create`);
- `podrun-user`: the local user who made it;
- `podrun-delete-after`: `true` where podrun is to delete it after the job (delete_after success or
  always, exec --down), else `false`;
- `podrun-idle-delete`, only on a TPU made with `idle_delete` (`create --idle-delete`): the idle time
  after which its worker 0 deletes it (`2h`, `1h30m`), as request.duration_text writes it.

A queued resource has no labels of its own in the v2 API: its node spec's node carries them
(`tpu.nodeSpec[].node.labels`), and so do the nodes it makes. Values follow Google's label rules
(lowercase letters, digits, `_` and `-`, at most 63 characters): label_value lowers the text, makes
every other character `-` and keeps its last 63 characters (a job id's unique end).
"""

from __future__ import annotations

import getpass
import re

JOB, USER, DELETE_AFTER, IDLE_DELETE = "podrun-job", "podrun-user", "podrun-delete-after", "podrun-idle-delete"
CREATED_BY_COMMAND = "create"  # podrun-job of what `podrun create` made
MAX_VALUE = 63
NOT_IN_VALUE = re.compile(r"[^a-z0-9_-]")


def label_value(text: str) -> str:
    """`text` as a label value Google accepts: `Train.LM-20261127-...` -> `train-lm-20261127-...`."""
    return NOT_IN_VALUE.sub("-", text.lower())[-MAX_VALUE:]


def user() -> str:
    """The local user, as a label value (`unknown` where the system names none)."""
    try:
        return label_value(getpass.getuser()) or "unknown"
    except (KeyError, OSError):  # no name for this uid (a container's)
        return "unknown"


def owner_labels(job: str, delete_after: bool, idle_delete_s: float | None = None) -> dict[str, str]:
    """The labels of what podrun creates for `job` (a job id, or CREATED_BY_COMMAND): three, and the idle time
    after which it deletes itself, where it does."""
    from podrun.cloud.request import duration_text

    idle = {IDLE_DELETE: duration_text(idle_delete_s)} if idle_delete_s else {}
    return {JOB: label_value(job), USER: user(), DELETE_AFTER: "true" if delete_after else "false", **idle}
