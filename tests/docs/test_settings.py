"""podrun's settings (podrun/settings.py) are what the code reads and what docs/limits.md shows (issue 52,
item 12: PODRUN_SUPERVISOR_AWAY and PODRUN_IDLE_POLL_S were read but listed nowhere)."""

from __future__ import annotations

import re
from pathlib import Path

from podrun import settings

REPO = Path(__file__).resolve().parents[2]
# the PODRUN_ names in the code that are not settings: what the job's environment holds (docs/spec.md),
# what an on_preempt command gets, and names of podrun's own protocols between its processes
JOB_ENVIRONMENT = {"PODRUN_WORKER", "PODRUN_NUM_WORKERS", "PODRUN_WORKER_IPS", "PODRUN_WORKER_IPS_FILE",
                   "PODRUN_JOB_ID", "PODRUN_JOB_DIR", "PODRUN_ATTEMPT", "PODRUN_SLICE", "PODRUN_NUM_SLICES",
                   "PODRUN_WORKER_IN_SLICE", "PODRUN_NOTICE"}
INTERNAL = {"PODRUN_FILE_END", "PODRUN_STEP_AT", "PODRUN_STEP_TOKEN"}


def podrun_sources() -> str:
    own = REPO / "podrun" / "settings.py"
    return "".join(path.read_text() for path in sorted((REPO / "podrun").rglob("*.py")) if path != own)


def test_every_podrun_variable_the_code_names_is_a_setting_or_the_jobs_environment():
    named = set(re.findall(r"\bPODRUN_[A-Z_]*[A-Z]\b", podrun_sources()))
    listed = {setting.name for setting in settings.SETTINGS}
    assert named - JOB_ENVIRONMENT - INTERNAL == listed


def test_the_job_environment_is_documented():
    documented = (REPO / "docs" / "spec.md").read_text() + (REPO / "docs" / "running-jobs.md").read_text()
    assert [name for name in sorted(JOB_ENVIRONMENT) if name not in documented] == []


def test_each_default_is_the_codes():
    """Where the code keeps a setting as ("PODRUN_X", default seconds), the table shows that default."""
    defaults = {name: value for name, value in re.findall(r'\("(PODRUN_[A-Z_]+)", ([0-9.]+)\)', podrun_sources())}
    assert len(defaults) >= 9
    shown = {setting.name: setting.default for setting in settings.SETTINGS}
    assert {name: f"{float(value):g}" for name, value in defaults.items()} == {name: shown[name] for name in defaults}


def test_docs_limits_shows_the_table():
    table = settings.markdown_table()
    assert table in (REPO / "docs" / "limits.md").read_text(), f"docs/limits.md's table should read:\n{table}"
