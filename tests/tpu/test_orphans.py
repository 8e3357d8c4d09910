"""Nothing podrun makes is left unowned (README: Orphans): every TPU VM and queued resource it creates
carries podrun-job, podrun-user and podrun-delete-after; a launcher killed with -9 during a create leaves
one that `podrun list --orphans` shows with its age and cost and `podrun delete --orphans` removes.
Against the Cloud TPU stand-in, whose workers are lab hosts; run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import getpass
import re

import pytest

from helpers import Background, job_id_in, left_in_api, lifecycle_spec, podrun, processes_of_job, wait_until

JOB_LABEL = re.compile(r"^[a-z0-9_-]+-\d{8}-\d{6}-[0-9a-f]{4}\Z")


def labels_of(tpu_api, name: str) -> dict[str, str]:
    """The labels the stand-in keeps on node `name` ({} while there is none)."""
    with tpu_api.lock:
        node = next((node for full, node in tpu_api.nodes.items() if full.endswith(f"/nodes/{name}")), {})
        return dict(node.get("labels", {}))


def queued_labels_of(tpu_api, name: str) -> dict[str, str]:
    """The labels of a queued resource's node spec, as the stand-in returns it ({} while there is none)."""
    with tpu_api.lock:
        queued = next((queued for full, queued in tpu_api.queued.items() if full.endswith(f"/queuedResources/{name}")),
                      None)
        return dict(queued.resource["tpu"]["nodeSpec"][0]["node"].get("labels", {})) if queued else {}


@pytest.mark.slow
def test_a_launcher_killed_during_a_create_leaves_an_orphan_that_list_shows_and_delete_removes(
        home, tpu_api, lab, job_file):
    tpu_api.operation_delay_s = 4  # the create's operation takes 4 s: time to look, then to kill the launcher
    job = Background("exec", lifecycle_spec(job_file, "echo ran", delete_after="always"))
    wait_until(lambda: labels_of(tpu_api, "life"), "the node to be asked for", timeout=30)
    labels = labels_of(tpu_api, "life")
    assert set(labels) == {"podrun-job", "podrun-user", "podrun-delete-after"}, labels
    assert JOB_LABEL.match(labels["podrun-job"]) and labels["podrun-delete-after"] == "true", labels
    assert labels["podrun-user"] == re.sub(r"[^a-z0-9_-]", "-", getpass.getuser().lower())
    alive = podrun("list", "--orphans")  # the launcher still creates it: it owns it
    assert alive.returncode == 0 and "no orphans" in alive.stderr and "life" not in alive.stdout, alive.stderr
    job.process.kill()
    job.process.wait(timeout=10)
    tpu_api.operation_delay_s = 0.3

    listed = podrun("list", "--orphans")
    assert listed.returncode == 0, listed.stderr
    assert "1 orphan in project podrun-test, zone us-central2-b" in listed.stderr, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith("life "))
    assert "v4-16 TPU VM" in row and labels["podrun-job"] in row and re.search(r"\$\d+\.\d\d$", row), listed.stdout
    assert listed.stdout.splitlines()[0].split() == ["NAME", "WHAT", "STATE", "JOB", "USER", "DELETE_AFTER", "AGE",
                                                     "COST", "SO", "FAR"]

    # a TPU made on purpose with `podrun create` is the user's: only --all shows it; create warns of the orphan
    created = podrun("create", "v4-8", "--name", "keep")
    assert created.returncode == 0, created.stderr
    warnings = [line for line in created.stderr.splitlines() if "orphan" in line]
    assert len(warnings) == 1 and "1 orphan TPU VM of yours" in warnings[0] and "(life)" in warnings[0], created.stderr
    assert labels_of(tpu_api, "keep") == {"podrun-job": "create", "podrun-user": labels["podrun-user"],
                                          "podrun-delete-after": "false"}
    assert "keep" not in podrun("list", "--orphans").stdout
    everything = podrun("list", "--orphans", "--all")
    assert re.search(r"^keep +v4-8 TPU VM +READY +create ", everything.stdout, re.M), everything.stdout

    # exec warns too, in one line, and runs
    ran = podrun("exec", "--tpu", "keep", "--user", "root", "--", "echo hi")
    assert ran.returncode == 0, ran.stderr
    assert [line for line in ran.stderr.splitlines() if "orphan" in line] == warnings, ran.stderr

    refused = podrun("delete", "--orphans", stdin=open("/dev/null"))  # no terminal, no --yes
    assert refused.returncode != 0 and "refusing without --yes" in refused.stderr.strip().splitlines()[-1]
    assert left_in_api(tpu_api) == ([], ["keep", "life"])
    deleted = podrun("delete", "--orphans", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert left_in_api(tpu_api) == ([], ["keep"])
    assert "no orphans" in podrun("list", "--orphans").stderr
    assert podrun("delete", "keep", "--yes").returncode == 0
    assert left_in_api(tpu_api) == ([], [])
    assert processes_of_job(labels["podrun-job"]) == []


@pytest.mark.slow
def test_a_queued_request_left_by_a_killed_launcher_is_an_orphan_with_its_node_specs_labels(
        home, tpu_api, lab, job_file):
    tpu_api.withhold_capacity(3600)
    job = Background("exec", lifecycle_spec(job_file, "true", "queued: true, spot: true"), "--down")
    job.wait_for("WAITING_FOR_RESOURCES")
    labels = queued_labels_of(tpu_api, "life")
    assert JOB_LABEL.match(labels["podrun-job"]) and labels["podrun-delete-after"] == "true", labels
    job.process.kill()
    job.process.wait(timeout=10)
    listed = podrun("list", "--orphans")
    assert re.search(r"^life +v4-16 queued resource +queued WAITING_FOR_RESOURCES .* \$0\.00$", listed.stdout,
                     re.M), listed.stdout
    assert podrun("delete", "--orphans", "--yes").returncode == 0
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
@pytest.mark.parametrize("delete_after, kept", [("always", []), ("never", ["life"])])
def test_after_a_clean_run_there_is_no_orphan(home, tpu_api, lab, job_file, delete_after, kept):
    result = podrun("exec", lifecycle_spec(job_file, "echo ran", delete_after=delete_after))
    assert result.returncode == 0, result.stderr
    assert "orphan" not in result.stderr
    assert left_in_api(tpu_api) == ([], kept)
    listed = podrun("list", "--orphans")
    assert listed.returncode == 0 and "no orphans" in listed.stderr and listed.stdout == "", listed.stderr
    assert processes_of_job(job_id_in(result.stderr)) == []
    if kept:  # kept on purpose (delete_after never): the user's, until --all
        assert "1 orphan" in podrun("list", "--orphans", "--all").stderr
        assert podrun("delete", "--orphans", "--all", "--yes").returncode == 0
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_a_multislice_is_one_orphan_row_whose_slices_carry_the_labels_and_delete_takes_it_whole(home, tpu_api, lab):
    created = podrun("create", "v4-8", "--name", "ms", "--slices", "2")
    assert created.returncode == 0, created.stderr
    assert labels_of(tpu_api, "ms-0") == labels_of(tpu_api, "ms-1") == queued_labels_of(tpu_api, "ms") != {}
    assert "no orphans" in podrun("list", "--orphans").stderr  # podrun create's: the user's
    listed = podrun("list", "--orphans", "--all")
    rows = [line for line in listed.stdout.splitlines()[1:]]
    assert len(rows) == 1 and re.match(r"ms +2 x v4-8 multislice +READY, queued ACTIVE +create ", rows[0]), listed.stdout
    assert podrun("delete", "--orphans", "--all", "--yes").returncode == 0
    assert left_in_api(tpu_api) == ([], [])
