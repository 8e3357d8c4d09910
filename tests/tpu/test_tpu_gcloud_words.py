"""TPU commands in a gcloud user's words (issue 26, 3b): `podrun create` takes gcloud's order and the
flags that mean the same, and names podrun's equivalent for the others; accelerator types are checked
against each generation's real sizes; Google's refusals, podrun's waits and its advice say what is
true (a rejected token file, a node still CREATING, a wrong project, a stockout, a timeout); a dry run
refuses what exec refuses; a multislice missing a slice is not shown READY; MEGASCALE_PORT and the
coordinator address agree; the docs' whole-life example (the TPU page) runs as written. Against the Cloud TPU
stand-in (the real gcloud reads it too); run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from podrun.cloud import accelerators
from podrun.errors import UsageError

from helpers import crashed, documented_section, podrun, stderr_lines_without_traceback
from tpu_stand_in import ACCELERATOR_HOSTS

ZONE = "us-central2-b"
PROJECT = "podrun-test"


def gcloud(*args: str, project: str = PROJECT) -> subprocess.CompletedProcess:
    return subprocess.run(["gcloud", "compute", "tpus", *args, f"--zone={ZONE}", f"--project={project}",
                           "--format=json"], capture_output=True, text=True, timeout=120)


def one_error_line(result: subprocess.CompletedProcess, code: int) -> str:
    assert result.returncode == code, result.stderr
    lines = stderr_lines_without_traceback(result.stderr)
    assert lines[-1].startswith("podrun: error: "), result.stderr
    return lines[-1]


def tpu_spec(job_file, tpu: str, run: str = "echo hi", **top: str) -> Path:
    lines = [f"target: {{tpu: {{{tpu}}}}}", "ssh: {user: root}",
             f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}", f"run: {run}",
             *(f"{key}: {value}" for key, value in top.items())]
    return job_file("\n".join(lines) + "\n")


# --- create's arguments --------------------------------------------------------------------------
def test_create_takes_gclouds_order_name_then_accelerator_type_and_its_same_meaning_flags(home, tpu_api, lab):
    created = podrun("create", "gpod", "--accelerator-type=v4-8", "--version=tpu-ubuntu2204-base", "--spot",
                     "--internal-ips", "--quiet")
    assert created.returncode == 0, created.stderr
    assert "creating TPU VM gpod (v4-8: 1 worker, runtime tpu-ubuntu2204-base, spot, internal IPs only)" \
        in created.stderr
    node = json.loads(gcloud("tpu-vm", "describe", "gpod").stdout)
    assert (node["state"], node["acceleratorType"], node["schedulingConfig"]) == ("READY", "v4-8", {"spot": True})
    assert "enableExternalIps" not in node["networkConfig"]

    started = podrun("create", "--accelerator-type", "v4-8", "--name", "later", "--async")  # gcloud's --no-wait
    assert started.returncode == 0, started.stderr
    assert "creation of later started; `podrun describe later" in started.stderr
    assert "waiting for" not in started.stderr

    assert podrun("create", "v4-8", "--name", "podrun-order").returncode == 0  # the README's form holds


def test_a_name_where_podrun_takes_the_type_first_names_both_orders_in_one_line(home, tpu_api):
    line = one_error_line(podrun("create", "my-pod"), 2)
    assert line == ("podrun: error: unknown accelerator type 'my-pod': podrun create takes the type first "
                    "(`podrun create v4-8 --name my-pod`); to name the TPU first, as gcloud does, give the type "
                    "with --accelerator-type (`podrun create my-pod --accelerator-type v4-8`)")
    assert "two names, 'a' and --name 'b'" in one_error_line(
        podrun("create", "a", "--accelerator-type", "v4-8", "--name", "b"), 2)
    assert "no accelerator type" in one_error_line(podrun("create", "--name", "x"), 2)
    assert tpu_api.requests == []


@pytest.mark.parametrize("flags, expected", [
    (["--reserved"], "--reserved is gcloud's: podrun asks for a reservation by its name: --reservation NAME"),
    (["--preemptible"], "--preemptible is gcloud's: preemptible TPUs are the time-limited kind that Spot VMs "
                        "replaced; podrun creates Spot VMs: --spot"),
    (["--type", "v4", "--topology=2x2x4"], "--type is gcloud's: podrun takes an accelerator type"),
    (["--metadata=startup-script=x"], "--metadata is gcloud's: podrun writes the TPU VM's metadata itself"),
    (["--network", "my-vpc"], "podrun create has no --network: create the TPU VM with gcloud "
                              "(`gcloud compute tpus tpu-vm create NAME ... --network ...`), then run on it"),
])
def test_gcloud_flags_that_mean_something_else_get_podruns_equivalent_in_one_line(flags, expected):
    result = podrun("create", "v4-8", *flags)
    line = one_error_line(result, 2)
    assert line.startswith(f"podrun: error: {expected}"), line
    assert "unrecognized arguments" not in result.stderr and "usage:" not in result.stderr


# --- accelerator types ----------------------------------------------------------------------------
@pytest.mark.parametrize("name, meant", [
    ("v5litepod-24", "v5litepod-16 or v5litepod-32"),
    ("v6e-24", "v6e-16 or v6e-32"),
    ("v4-40", "v4-32 or v4-64"),
    ("v4-33", "v4-32 or v4-64"),
    ("v4-96", "v4-64 or v4-128"),
    ("v5p-200", "v5p-128 or v5p-256"),
    ("v5p-12416", "v5p-12288"),
    ("v2-64", "v2-32 or v2-128"),
    ("v3-16", "v3-8 or v3-32"),
])
def test_a_size_no_slice_comes_in_is_refused_with_the_nearest_real_sizes(name, meant):
    with pytest.raises(UsageError) as refused:
        accelerators.parse(name)
    assert f"accelerator type {name!r} has no valid size; did you mean {meant}?" in str(refused.value)
    for suggestion in meant.split(" or "):
        accelerators.parse(suggestion)


@pytest.mark.parametrize("name, hosts", [
    ("v4-384", 48), ("v4-8192", 1024), ("v5p-12288", 1536), ("v5p-32", 4), ("v3-2048", 256), ("v2-512", 64),
    ("v5litepod-256", 64), ("v6e-1", 1)])
def test_real_slice_sizes_are_taken(name, hosts):
    assert accelerators.parse(name).hosts == hosts


def test_every_type_the_stand_in_offers_is_one_podrun_takes_with_the_same_hosts():
    assert {name: accelerators.parse(name).hosts for name in ACCELERATOR_HOSTS} == ACCELERATOR_HOSTS


# --- Google's refusals, in podrun's words -----------------------------------------------------------
def test_a_rejected_access_token_file_is_named_with_what_to_put_there(home, tpu_api, tmp_path):
    token_file = tmp_path / "token"  # the fixture's CLOUDSDK_AUTH_ACCESS_TOKEN_FILE
    tpu_api.accepted_tokens = {"fresh-token"}
    by_gcloud = gcloud("tpu-vm", "list")  # the stand-in refuses gcloud as Google would
    assert by_gcloud.returncode != 0 and "invalid authentication credentials" in by_gcloud.stderr

    for args in (["list"], ["describe", "any"], ["create", "v4-8", "--name", "x"]):
        line = one_error_line(podrun(*args), 1)
        assert (f"Google rejected the access token in {token_file} (CLOUDSDK_AUTH_ACCESS_TOKEN_FILE): it has "
                f"expired or is not valid; put a new one there, e.g. `gcloud auth print-access-token > "
                f"{token_file}`") in line, line
        assert "refresh_token" not in line and "application-default login" not in line

    token_file.write_text("fresh-token\n")
    assert podrun("list").returncode == 0


def test_a_wrong_project_in_the_spec_is_named_in_the_advice(home, tpu_api, lab, job_file):
    assert podrun("create", "v4-8", "--name", "mine").returncode == 0
    line = one_error_line(podrun("exec", tpu_spec(job_file, "name: mine, project: other-proj")), 1)
    assert "no TPU VM named mine in other-proj/us-central2-b; `podrun list --zone us-central2-b --project other-proj`" \
        in line
    listed = podrun("list", "--zone", ZONE, "--project", "other-proj")  # the advice, followed, lists that project
    assert "in project other-proj" in listed.stderr


def test_a_stockout_suggests_a_queued_request(home, tpu_api):
    tpu_api.exhausted_zones.add(ZONE)
    line = one_error_line(podrun("create", "v4-8", "--name", "none-left"), 1)
    assert "no capacity in us-central2-b right now" in line
    assert "ask through a queued request, which waits for capacity (`podrun create ... --queued`, or " \
           "target.tpu.queued: true in a spec)" in line


# --- waits ------------------------------------------------------------------------------------------
def test_valid_for_under_a_minute_is_shown_as_given(home, tpu_api):
    result = podrun("create", "v4-8", "--name", "brief", "--queued", "--valid-for", "10s", "--no-wait")
    assert result.returncode == 0, result.stderr
    assert "queued for at most 10s)" in result.stderr
    queued = json.loads(gcloud("queued-resources", "describe", "brief").stdout)
    assert queued["queueingPolicy"]["validUntilDuration"] == "10s"


def test_the_wait_for_a_new_key_to_be_installed_is_announced(home, tpu_api, lab, job_file):
    assert podrun("create", "v4-8", "--name", "keyed").returncode == 0  # made without the user's key
    result = podrun("exec", tpu_spec(job_file, "name: keyed"))
    assert result.returncode == 0, result.stderr
    assert ("podrun: your SSH key is new in the metadata of TPU VM keyed: its workers' guest agents install it "
            "within seconds; until then a refused login is retried, for up to 60s") in result.stderr
    again = podrun("exec", tpu_spec(job_file, "name: keyed"))  # the key is there now: nothing to wait for
    assert again.returncode == 0 and "your SSH key is new" not in again.stderr


def test_a_node_still_creating_is_not_called_preempted(home, tpu_api, lab, job_file):
    tpu_api.operation_delay_s = 60
    assert podrun("create", "v4-8", "--name", "young", "--no-wait").returncode == 0
    line = one_error_line(podrun("exec", tpu_spec(job_file, "name: young")), 1)
    assert line == ("podrun: error: TPU VM young is CREATING, not READY; `podrun describe young --zone us-central2-b "
                    "--project podrun-test` shows its state; run again once it is READY")


def test_a_creation_timeout_under_delete_after_always_reports_the_timeout(home, tpu_api, lab, job_file, monkeypatch):
    tpu_api.operation_delay_s = 60  # neither the creation nor the deletion ends within the wait
    monkeypatch.setenv("PODRUN_WAIT_TIMEOUT", "2")
    result = podrun("exec", tpu_spec(job_file, "name: slow, accelerator_type: v4-8", delete_after="always"))
    line = one_error_line(result, 1)
    assert line.startswith("podrun: error: slow was not READY within 2s (PODRUN_WAIT_TIMEOUT); podrun asked Google to "
                           "delete it, which goes on there: `podrun describe slow --zone us-central2-b --project "
                           "podrun-test` shows it until it is gone; then, deleting the TPU (delete_after): slow is "
                           "still being deleted after 2s"), result.stderr


# --- dry run and multislice -------------------------------------------------------------------------
def test_dry_run_refuses_a_tpu_of_another_type_as_exec_does(home, tpu_api, lab, job_file):
    assert podrun("create", "v4-8", "--name", "life").returncode == 0
    spec = tpu_spec(job_file, "name: life, accelerator_type: v4-16")
    executed, dry = podrun("exec", spec), podrun("exec", spec, "--dry-run")
    expected = (f"podrun: error: {spec}: target.tpu.accelerator_type: life exists as a v4-8, but the spec declares "
                f"a v4-16; delete it (`podrun delete life --zone us-central2-b --project podrun-test`) or give the spec "
                f"another target.tpu.name")
    assert one_error_line(executed, 2) == expected
    assert one_error_line(dry, 2) == expected
    assert dry.stdout == ""


def test_list_does_not_show_a_multislice_missing_a_slice_as_ready(home, tpu_api, lab):
    created = podrun("create", "v4-8", "--slices", "2", "--queued", "--name", "ms")
    assert created.returncode == 0, created.stderr
    assert re.search(r"^ms +READY +2 x v4-8 ", podrun("list").stdout, re.M)

    assert podrun("delete", "ms-1", "--yes").returncode == 0  # one slice, by its node name
    queued = json.loads(gcloud("queued-resources", "describe", "ms").stdout)
    row = next(line for line in podrun("list").stdout.splitlines() if line.startswith("ms "))
    assert re.match(rf"^ms +READY, 1 of 2 slices gone, queued resource {queued['state']['state']} +2 x v4-8 +1 ", row), row


# --- MEGASCALE_PORT ---------------------------------------------------------------------------------
@pytest.mark.parametrize("env, address, port", [
    ([], "<worker 0 internal IP>:8080", "8080"),
    (["MEGASCALE_PORT=8081"], "<worker 0 internal IP>:8081", "8081"),
    (["MEGASCALE_COORDINATOR_ADDRESS=10.0.0.9:9000"], "10.0.0.9:9000", "9000"),
    (["MEGASCALE_PORT=8081", "MEGASCALE_COORDINATOR_ADDRESS=10.0.0.9:9000"], "10.0.0.9:9000", "8081"),  # both: as set
])
def test_megascale_port_and_the_coordinator_address_name_one_port(home, tpu_api, job_file, env, address, port):
    spec = tpu_spec(job_file, "name: ms, accelerator_type: v4-8, slices: 2")
    result = podrun("exec", spec, "--dry-run", *[arg for pair in env for arg in ("--env", pair)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(f"\nexport MEGASCALE_COORDINATOR_ADDRESS={shlex.quote(address)}\n") == 2  # 2 slices of 1
    assert result.stdout.count(f"\nexport MEGASCALE_PORT={port}\n") == 2


# --- the docs: the TPU page ---------------------------------------------------------------------------
def test_the_docs_whole_life_example_runs_as_written(home, tpu_api, lab):
    section = documented_section("A TPU's whole life: queued resources, spot, preemption")
    block = section[section.index("```sh\n") + 6:section.index("```", section.index("```sh\n") + 6)]
    commands = [line.split("#")[0].split() for line in block.splitlines() if line.strip()]
    assert [command[:2] for command in commands] == [["podrun", "create"], ["podrun", "list"], ["podrun", "delete"]]
    for command in commands:
        # delete asks first on a terminal; here there is none, so it is told yes
        result = podrun(*command[1:], *(["--yes"] if command[1] == "delete" else []))
        assert result.returncode == 0, (command, result.stderr)
        assert not crashed(result.stderr)
    assert podrun("list").stderr.startswith("podrun: no TPU VMs or queued resources")
