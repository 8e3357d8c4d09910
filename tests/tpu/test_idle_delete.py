"""idle_delete (README, docs/targets/tpu.md: A TPU that deletes itself): a TPU podrun created, with no job on it
for that long, is deleted by its worker 0 with the VM's own credentials (the GCE metadata stand-in's token),
never by the laptop; a job on it holds that off; where the VM's service account may not delete it, it stays,
labelled, and `podrun list --orphans` shows it. Against the Cloud TPU stand-in on the lab's bridge, whose
workers are lab hosts, which reach the metadata stand-in as GCE_METADATA_HOST (sshd's SetEnv, as a VM's
environment would have it). Run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import pytest
from metadata_stand_in import VM_TOKEN

from helpers import idle_watchers, lifecycle_spec, podrun, stderr_lines_without_traceback, wait_until

IDLE_LOG = ".podrun/idle_delete.log"
WHERE = "podrun-test/us-central2-b"
PARENT = "projects/podrun-test/locations/us-central2-b"


def nodes(tpu_api) -> list[str]:
    with tpu_api.lock:
        tpu_api._advance()
        return sorted(name.rsplit("/", 1)[1] for name in tpu_api.nodes)


def idle_log(lab, tpu_api_host: int) -> str:
    path = lab.hosts[tpu_api_host].home / IDLE_LOG
    return path.read_text() if path.exists() else ""


def create(name: str, idle: str) -> str:
    created = podrun("create", "v4-16", "--name", name, "--idle-delete", idle)
    assert created.returncode == 0, created.stderr
    said = [line for line in created.stderr.splitlines() if "deletes itself" in line]
    assert said == [f"podrun: the TPU deletes itself after {idle} with no job on it: worker 0 watches, with the VM's "
                    f"own credentials (its service account needs roles/tpu.admin; what came of it: "
                    f"~/{IDLE_LOG} there)"], created.stderr
    return created.stderr


@pytest.mark.slow
def test_a_created_tpu_with_no_job_on_it_is_deleted_by_its_worker_0_with_the_vms_token(
        home, tpu_api_on_lab, lab, vm_metadata):
    from lab import BRIDGE_IP

    create("idle", "3s")
    labels = tpu_api_on_lab.nodes[f"{PARENT}/nodes/idle"]["labels"]
    assert labels["podrun-idle-delete"] == "3s" and labels["podrun-job"] == "create", labels
    worker_0 = tpu_api_on_lab.node_endpoints_of("idle")[0]
    since = len(tpu_api_on_lab.received)

    wait_until(lambda: nodes(tpu_api_on_lab) == [], "the TPU to be deleted", timeout=60)
    deleting = [r for r in tpu_api_on_lab.received[since:] if r.method == "DELETE"]
    assert [(r.client, r.token) for r in deleting] == [(worker_0.internal_ip, VM_TOKEN)]  # worker 0, the VM's token
    assert BRIDGE_IP not in {r.client for r in deleting}  # never the laptop
    log = idle_log(lab, worker_0.host_index)
    assert "watching: deletes this TPU after 3s with no job on it" in log
    assert f"no job for 3s: deleting TPU VM idle in {WHERE}: the Cloud TPU API accepted the request" in log, log
    wait_until(lambda: idle_watchers(lab) == [], "the watch to end")


@pytest.mark.slow
def test_a_job_on_the_tpu_holds_its_deletion_off_until_it_has_been_idle_that_long_after(
        home, tpu_api_on_lab, lab, vm_metadata):
    create("busy", "8s")
    ran = podrun("exec", "--tpu", "busy", "--user", "root", "--", "sleep 10; echo slept")
    assert ran.returncode == 0 and "slept" in ran.stdout, ran.stderr
    assert nodes(tpu_api_on_lab) == ["busy"]  # 10 s of job, longer than 8 s idle: still there

    gone_after = wait_until(lambda: nodes(tpu_api_on_lab) == [], "the TPU to be deleted once idle", timeout=60)
    assert gone_after >= 8 - 1, gone_after  # idle from the job's end (a look every 0.3 s may see it end late)


@pytest.mark.slow
def test_a_vm_whose_service_account_may_not_delete_leaves_the_tpu_labelled_for_orphans(
        home, tpu_api_on_lab, lab, vm_metadata):
    tpu_api_on_lab.deny(VM_TOKEN, "tpu.nodes.delete", "tpu.queuedResources.delete")
    create("denied", "3s")
    worker_0 = tpu_api_on_lab.node_endpoints_of("denied")[0]
    wait_until(lambda: "TPU VM denied" in idle_log(lab, worker_0.host_index), "the watch to try", timeout=60)
    log = idle_log(lab, worker_0.host_index)
    assert (f"no job for 3s: cannot delete TPU VM denied in {WHERE}: PERMISSION_DENIED: the VM's service account may "
            f"not delete TPUs (it needs roles/tpu.admin, Cloud TPU Admin): Permission 'tpu.nodes.delete' denied on "
            f"resource '//tpu.googleapis.com/{PARENT}/nodes/denied' (or it may not "
            f"exist).; the TPU stays, labelled: `podrun list --orphans` shows it") in log, log
    wait_until(lambda: idle_watchers(lab) == [], "the watch to end")
    assert nodes(tpu_api_on_lab) == ["denied"]

    listed = podrun("list", "--orphans")
    assert listed.returncode == 0 and "1 orphan in project podrun-test" in listed.stderr, listed.stderr
    assert [line.split()[:2] for line in listed.stdout.splitlines()[1:]] == [["denied", "v4-16"]], listed.stdout
    assert podrun("delete", "--orphans", "--yes").returncode == 0
    assert nodes(tpu_api_on_lab) == []


@pytest.mark.slow
def test_a_tpu_exec_created_for_a_spec_with_idle_delete_goes_once_idle_after_the_job(
        home, tpu_api_on_lab, lab, vm_metadata, job_file):
    ran = podrun("exec", lifecycle_spec(job_file, "echo ran", idle_delete="3s"))
    assert ran.returncode == 0 and "[w0-1] ran" in ran.stdout, ran.stderr
    assert "podrun: the TPU deletes itself after 3s with no job on it: worker 0 watches" in ran.stderr, ran.stderr
    assert tpu_api_on_lab.node_requests()[0][1]["labels"]["podrun-idle-delete"] == "3s"
    wait_until(lambda: nodes(tpu_api_on_lab) == [], "the TPU to be deleted once idle", timeout=60)


@pytest.mark.slow
def test_a_multislice_deletes_its_queued_resource_with_every_slice(home, tpu_api_on_lab, lab, vm_metadata):
    created = podrun("create", "v4-8", "--name", "set", "--slices", "2", "--idle-delete", "3s")
    assert created.returncode == 0 and "deletes itself after 3s" in created.stderr, created.stderr
    assert nodes(tpu_api_on_lab) == ["set-0", "set-1"]
    wait_until(lambda: nodes(tpu_api_on_lab) == [] and not tpu_api_on_lab.queued, "every slice gone", timeout=60)
    with tpu_api_on_lab.lock:
        deleted = [(path, query) for method, path, query, _ in tpu_api_on_lab.bodies if method == "DELETE"]
    assert deleted == [(f"/v2/{PARENT}/queuedResources/set", {"force": ["true"]})]


def test_create_refuses_an_idle_delete_that_is_no_duration_and_one_without_waiting(home):
    bad = podrun("create", "v4-8", "--idle-delete", "soon")
    assert bad.returncode == 2 and stderr_lines_without_traceback(bad.stderr) == [
        "podrun: error: --idle-delete 'soon': expected a duration above 0 such as 2h, 30m or 90 (seconds), got 'soon'"]
    unwatched = podrun("create", "v4-8", "--idle-delete", "2h", "--no-wait")
    assert unwatched.returncode == 2 and stderr_lines_without_traceback(unwatched.stderr) == [
        "podrun: error: --idle-delete: worker 0 watches from the moment the TPU VM is READY; drop --no-wait"]


@pytest.mark.slow
def test_a_second_watch_on_the_vm_replaces_the_first(home, tpu_api_on_lab, lab, vm_metadata):
    from podrun.cloud.request import TpuRequest
    from podrun.cloud.settings import Location
    from podrun.launch import idle_watch
    from podrun.targets.tpu import created_tpu

    create("twice", "1h")
    worker_0 = tpu_api_on_lab.node_endpoints_of("twice")[0]
    (first,) = idle_watchers(lab)
    target = created_tpu(TpuRequest("twice", "v4-16", "tpu-ubuntu2204-base"), Location("podrun-test", "us-central2-b"))
    idle_watch.start(target, target.workers(dry_run=False), 2)  # as a later create's of the same VM would
    assert first not in idle_watchers(lab) and len(idle_watchers(lab)) == 1
    wait_until(lambda: nodes(tpu_api_on_lab) == [], "the second watch to delete the TPU", timeout=60)
    log = idle_log(lab, worker_0.host_index)
    tail = log[log.rindex("watching: deletes this TPU after 1h"):]
    assert "watching: deletes this TPU after 2s" in tail and "no job for 2s: deleting TPU VM twice" in tail, log
