"""The labels podrun puts on what it creates (cloud/labels.py) and who owns a labelled TPU (owners.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from podrun import jobstore, owners
from podrun.cloud import labels
from podrun.cloud.settings import Location
from podrun.cloud.tpu_resources import TpuNode

WHERE = Location("p", "us-central2-b")


def test_label_values_follow_googles_rules_and_keep_a_job_ids_unique_end():
    assert labels.label_value("Train.LM_x-20261127-120000-ab12") == "train-lm_x-20261127-120000-ab12"
    long_id = "a" * 80 + "-20261127-120000-ab12"
    assert labels.label_value(long_id) == long_id[-63:] and len(labels.label_value(long_id)) == 63


def node(name: str, job: str | None, delete_after: str = "true", user: str = "me") -> TpuNode:
    tagged = {labels.JOB: job, labels.USER: user, labels.DELETE_AFTER: delete_after} if job else {}
    return TpuNode(name, WHERE, "READY", "v4-8", "rt", "HEALTHY", False, [], labels=tagged,
                   created="2026-11-27T10:00:00.123456789Z")


def test_an_orphan_is_a_labelled_tpu_to_be_deleted_that_no_running_job_or_live_launcher_owns(home):
    running = jobstore.JobRecord(id="job-20261127-100000-aaaa", name="job", target="t", spec_path="s", workers=[],
                                 stop_grace_s=1)
    running.create()
    ended = jobstore.JobRecord(id="job-20261127-100000-bbbb", name="job", target="t", spec_path="s", workers=[],
                               stop_grace_s=1)
    ended.create()
    ended.finish(jobstore.SUCCEEDED, 0, "ok")
    lost = jobstore.JobRecord(id="job-20261127-100000-abcd", name="job", target="t", spec_path="s", workers=[],
                              stop_grace_s=1, launcher={"pid": 2 ** 22 + 1, "start": "1"})  # attached, launcher dead
    lost.create()
    nodes = [node("running", running.id), node("lost", lost.id), node("ended", ended.id),
             node("gone", "job-20261127-100000-cccc"),
             node("kept", "job-20261127-100000-dddd", "false"), node("created", labels.CREATED_BY_COMMAND, "false"),
             node("unlabelled", None), node("theirs", "job-20261127-100000-eeee", user="them")]
    assert [each.name for each in owners.orphans(nodes, [])] == ["lost", "ended", "gone", "theirs"]
    assert [each.name for each in owners.orphans(nodes, [], user="me")] == ["lost", "ended", "gone"]
    assert [each.name for each in owners.orphans(nodes, [], everything=True)] == [
        "lost", "ended", "gone", "kept", "created", "theirs"]
    made = datetime(2026, 11, 27, 10, tzinfo=timezone.utc).timestamp() + 0.123456  # nanoseconds cut
    assert owners.orphans(nodes, [])[1].billed_from == pytest.approx(made)


def test_a_claim_owns_while_its_process_lives(home):
    job_id = "job-20261127-100000-ffff"
    with owners.claim(job_id):
        assert owners.owned(job_id)
    assert not owners.owned(job_id)
    child = subprocess.run([sys.executable, "-c", "import os, sys; from podrun import owners\n"
                            f"with owners.claim({job_id!r}): os._exit(0)"], env={**os.environ}, check=False)
    assert child.returncode == 0
    assert os.listdir(owners.claims_dir()) == ["job-20261127-100000-ffff.json"]  # killed: its claim stays
    assert not owners.owned(job_id)  # ... and owns nothing
