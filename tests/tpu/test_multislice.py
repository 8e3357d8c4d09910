"""Multislice (README: Multislice): one job over several TPU slices, created as one queued resource
(`slices: N`) or joined by name (`names: [...]`), run on every worker of every slice at once with
the slice variables and MEGASCALE_* that libtpu and JAX read, preemption of one slice named and the
whole multislice recovered, deleted as one unit. Against the Cloud TPU stand-in, whose workers are
the 4 lab hosts (2 x v4-16); run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import (
    BLOB_BYTES,
    WAIT_FOR_PREEMPTION,
    Background,
    bridge_sent_bytes,
    code_dirs,
    job_id_in,
    left_in_api,
    podrun,
    processes_of_job,
    tree_listing,
    wait_until,
    workdir_with_blob,
)

MEGASCALE_PORT = "8080"  # as the README documents it
VARIABLES = ('echo "vars $PODRUN_WORKER/$PODRUN_NUM_WORKERS slice $PODRUN_SLICE/$PODRUN_NUM_SLICES'
             ' in-slice $PODRUN_WORKER_IN_SLICE megascale $MEGASCALE_COORDINATOR_ADDRESS $MEGASCALE_NUM_SLICES'
             ' $MEGASCALE_SLICE_ID $MEGASCALE_PORT ip $(hostname -I | cut -d" " -f1)"')


def multislice_spec(job_file, run: str, tpu: str, **top: str) -> Path:
    lines = [f"target: {{tpu: {{{tpu}}}}}", "ssh: {user: root}",
             f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}", "run: |",
             *(f"  {line}" for line in run.splitlines()), *(f"{key}: {value}" for key, value in top.items())]
    return job_file("\n".join(lines) + "\n")


def slice_ips(tpu_api, node: str) -> list[str]:
    """A node's workers' internal IPs, in worker-id order, as the stand-in handed them out."""
    with tpu_api.lock:
        full = next(name for name in tpu_api.nodes if name.endswith(f"/nodes/{node}"))
        return [endpoint["ipAddress"] for endpoint in tpu_api.nodes[full]["networkEndpoints"]]


def printed_variables(stdout: str) -> dict[int, str]:
    """Each worker's `vars ...` line, by the index in its prefix."""
    return {int(found[1]): found[2] for found in re.finditer(r"^\[w(\d+)\] +vars (.*)$", stdout, re.M)}


def expected_variables(slices: list[list[str]]) -> dict[int, str]:
    coordinator = f"{slices[0][0]}:{MEGASCALE_PORT}"
    expected, index = {}, 0
    for slice_id, ips in enumerate(slices):
        for in_slice, ip in enumerate(ips):
            expected[index] = (f"{index}/4 slice {slice_id}/{len(slices)} in-slice {in_slice} megascale {coordinator} "
                               f"{len(slices)} {slice_id} {MEGASCALE_PORT} ip {ip}")
            index += 1
    return expected


@pytest.mark.slow
@pytest.mark.gcloud
def test_create_slices_runs_every_worker_of_every_slice_with_its_variables_and_deletes_them_as_one(
        home, tpu_api, lab, job_file):
    created = podrun("create", "v4-16", "--slices", "2", "--queued", "--spot", "--name", "ms")
    assert created.returncode == 0, created.stderr
    assert "2 x v4-16" in created.stderr

    listed = subprocess.run(["gcloud", "compute", "tpus", "tpu-vm", "list", "--format=value(name)"],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert sorted(line.rsplit("/", 1)[-1] for line in listed.stdout.split()) == ["ms-0", "ms-1"]
    ours = podrun("list")
    assert ours.returncode == 0, ours.stderr
    assert re.search(r"^ms +.*2 x v4-16", ours.stdout, re.M), ours.stdout

    result = podrun("exec", multislice_spec(job_file, VARIABLES, "name: ms, slices: 2"))
    assert result.returncode == 0, result.stderr
    assert printed_variables(result.stdout) == expected_variables([slice_ips(tpu_api, "ms-0"),
                                                                   slice_ips(tpu_api, "ms-1")])

    deleted = podrun("delete", "ms", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_slices_created_separately_are_joined_in_the_order_the_spec_names_them(home, tpu_api, lab, job_file):
    for name in ("pod-a", "pod-b"):
        assert podrun("create", "v4-16", "--name", name).returncode == 0
    result = podrun("exec", multislice_spec(job_file, VARIABLES, "names: [pod-b, pod-a]"))
    assert result.returncode == 0, result.stderr
    assert printed_variables(result.stdout) == expected_variables([slice_ips(tpu_api, "pod-b"),
                                                                   slice_ips(tpu_api, "pod-a")])


@pytest.mark.slow
def test_a_variable_the_user_sets_wins_over_podruns_megascale_value(home, tpu_api, lab, job_file):
    for name in ("pod-a", "pod-b"):
        assert podrun("create", "v4-16", "--name", name).returncode == 0
    spec = multislice_spec(job_file, 'echo "port $MEGASCALE_PORT"', "names: [pod-a, pod-b]")
    result = podrun("exec", spec, "--env", "MEGASCALE_PORT=9999", "--no-collapse")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("port 9999") == 4


@pytest.mark.slow
def test_preempting_one_slice_names_it_and_recovers_the_whole_multislice(home, tpu_api, lab, job_file):
    spec = multislice_spec(job_file, WAIT_FOR_PREEMPTION,
                           "name: ms, accelerator_type: v4-16, slices: 2, queued: true, spot: true",
                           restarts="{max: 1}", delete_after="always")
    job = Background("exec", spec)
    job.wait_for(r"\[w3\] +attempt 0")
    tpu_api.preempt("ms-1")
    assert job.finish(timeout=120) == 0, job.text
    assert "slice 1 (ms-1)" in job.text and "preempted" in job.text
    assert all(f"[w{index}] resumed on worker {index}" in re.sub(r"\] +", "] ", job.text) for index in range(4))
    creates = [path for method, path in tpu_api.requests if method == "POST" and path.endswith("/queuedResources")]
    assert len(creates) == 2  # the whole multislice, made again
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.slow
def test_with_recreate_slice_a_preempted_slice_is_made_again_alone(home, tpu_api, lab, job_file):
    """Each slice its own queued resource: slice 1's preemption suspends its request alone, as Google's would;
    podrun deletes and makes ms-1 again, never touching ms-0, whose workers keep their hosts; the job then
    runs again on both slices and succeeds."""
    spec = multislice_spec(job_file, WAIT_FOR_PREEMPTION,
                           "name: ms, accelerator_type: v4-16, slices: 2, spot: true, recreate: slice",
                           restarts="{max: 1}")
    job = Background("exec", spec)
    job.wait_for(r"\[w3\] +attempt 0")
    kept_ips = slice_ips(tpu_api, "ms-0")
    with tpu_api.lock:
        queued_states = {name.rsplit("/", 1)[1]: queued.resource["state"]["state"]
                         for name, queued in tpu_api.queued.items()}
    assert queued_states == {"ms-0": "ACTIVE", "ms-1": "ACTIVE"}  # a queued resource per slice
    tpu_api.preempt("ms-1")
    assert job.finish(timeout=120) == 0, job.text
    assert "making slice 1 (ms-1) again alone; the other slices stay" in job.text
    assert all(f"[w{index}] resumed on worker {index}" in re.sub(r"\] +", "] ", job.text) for index in range(4))
    touched = [(method, path) for method, path in tpu_api.requests if method in ("POST", "DELETE")]
    assert not [request for request in touched if request[1].rsplit("/", 1)[-1].startswith("ms-0")
                and request[0] == "DELETE"], touched
    creates = [path for method, path in touched if method == "POST" and path.endswith("/queuedResources")]
    assert len(creates) == 3, touched  # both slices, then ms-1 alone
    assert slice_ips(tpu_api, "ms-0") == kept_ips
    assert left_in_api(tpu_api) == (["ms-0", "ms-1"], ["ms-0", "ms-1"])
    for name in ("ms-0", "ms-1"):
        assert podrun("delete", name, "--yes").returncode == 0


@pytest.mark.slow
def test_code_leaves_the_launcher_once_for_every_slice_and_a_failure_in_one_slice_stops_all(
        home, tpu_api, lab, job_file):
    for name in ("pod-a", "pod-b"):
        assert podrun("create", "v4-16", "--name", name).returncode == 0
    spec = multislice_spec(job_file, '[ "$PODRUN_WORKER" = 3 ] && exit 3\nexec sleep 300',
                           "names: [pod-a, pod-b]")
    code = workdir_with_blob(spec)
    sent_before = bridge_sent_bytes()
    result = podrun("exec", spec)
    sent = bridge_sent_bytes() - sent_before
    assert result.returncode == 3, result.stderr
    assert "shipped code (4 files) to 4 workers" in result.stderr
    assert BLOB_BYTES < sent < 1.5 * BLOB_BYTES, sent  # one copy, relayed on by the workers of both slices
    assert all(tree_listing(code_dir) == tree_listing(code) for code_dir in code_dirs(lab, range(4), spec))
    assert "failed: worker 3 exited with code 3 in run; every other worker was stopped" in result.stderr
    assert processes_of_job(job_id_in(result.stderr)) == []


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_of_every_slice(home, tpu_api, lab, job_file):
    for name in ("pod-a", "pod-b"):
        assert podrun("create", "v4-16", "--name", name).returncode == 0
    job = Background("exec", multislice_spec(job_file, 'echo "up $PODRUN_WORKER"\nexec sleep 300',
                                             "names: [pod-a, pod-b]"))
    for index in range(4):
        job.wait_for(rf"\[w{index}\] +up {index}")
    job_id = job_id_in(job.text)
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130, job.text
    wait_until(lambda: processes_of_job(job_id) == [], "every worker of both slices to stop", timeout=10)


@pytest.mark.slow
def test_dry_run_of_a_multislice_not_created_yet_shows_every_slice_and_creates_nothing(home, tpu_api, job_file):
    spec = multislice_spec(job_file, "true", "name: ms, accelerator_type: v4-16, slices: 2, queued: true")
    result = podrun("exec", spec, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "2 x v4-16" in result.stdout
    assert "PODRUN_SLICE=1" in result.stdout and "MEGASCALE_NUM_SLICES=2" in result.stdout
    assert left_in_api(tpu_api) == ([], [])


@pytest.mark.parametrize("tpu, complaint", [
    ("{name: ms, slices: 1}", "target.tpu.slices"),
    ("{name: ms, names: [a, b]}", "name and names"),
    ("{names: [a]}", "target.tpu.names"),
    ("{names: [a, b], accelerator_type: v4-16}", "names"),
    ("{names: [pod-a, Pod_B]}", "target.tpu.names.1: expected a TPU VM name"),
])
def test_a_bad_multislice_target_is_one_line_naming_the_field(job_file, tpu, complaint):
    result = podrun("validate", job_file(f"target: {{tpu: {tpu}}}\nrun: 'true'\n"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and complaint in lines[0], result.stderr
