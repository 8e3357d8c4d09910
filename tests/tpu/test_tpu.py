"""Cloud TPU: create/list/describe/delete through the real google-cloud-tpu client, and `target: tpu`
runs, against the API stand-in (tests/tpu_stand_in.py) whose TPU VM workers are lab hosts. The real
gcloud CLI reads what podrun made, which keeps the stand-in honest."""

from __future__ import annotations

import json
import math
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from podrun.cloud import accelerators
from podrun.errors import UsageError

from helpers import (
    REPO,
    ZONE,
    Background,
    crashed,
    create,
    gcloud,
    job_id_in,
    modules_imported_by,
    podrun,
    processes_of_job,
    stderr_lines_without_traceback,
)


def tpu_spec(job_file, name: str, run: str, **extra: str) -> Path:
    lines = [f"target: {{tpu: {{name: {name}}}}}", "ssh: {user: root}",
             f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}", "run: |",
             *(f"  {line}" for line in run.splitlines()), *(f"{key}: {value}" for key, value in extra.items())]
    return job_file("\n".join(lines) + "\n")


@pytest.mark.parametrize("name, generation, chips, hosts, runtime", [
    ("v2-8", "v2", 4, 1, "tpu-ubuntu2204-base"),
    ("v4-8", "v4", 4, 1, "tpu-ubuntu2204-base"),
    ("v4-32", "v4", 16, 4, "tpu-ubuntu2204-base"),
    ("v5p-12288", "v5p", 6144, 1536, "v2-alpha-tpuv5"),
    ("v5litepod-8", "v5litepod", 8, 1, "v2-alpha-tpuv5-lite"),
    ("v5litepod-16", "v5litepod", 16, 4, "v2-alpha-tpuv5-lite"),
    ("v6e-16", "v6e", 16, 4, "v2-alpha-tpuv6e"),
    ("v6e-4", "v6e", 4, 1, "v2-alpha-tpuv6e"),
])
def test_accelerator_types_give_chips_hosts_and_runtime(name, generation, chips, hosts, runtime):
    assert accelerators.parse(name) == accelerators.AcceleratorType(name, generation, chips, hosts, runtime)


@pytest.mark.parametrize("name, expected", [
    ("V4-8", "v4-8"), ("v5LitePod-16", "v5litepod-16"), (" v6e-4 ", "v6e-4")])
def test_accelerator_types_are_taken_in_any_case(name, expected):
    assert accelerators.parse(name).name == expected


@pytest.mark.parametrize("name, message", [
    ("v5e-8", "unknown accelerator type 'v5e-8'; did you mean v5litepod-8?"),
    ("V5E-16", "unknown accelerator type 'V5E-16'; did you mean v5litepod-16?"),
    ("v6-8", "unknown accelerator type 'v6-8'; did you mean v6e-8?"),
    ("v4_8", "unknown accelerator type 'v4_8'; did you mean v4-8?"),
    ("tpu-v4-32", "unknown accelerator type 'tpu-v4-32'; did you mean v4-32?"),
    ("v4", "unknown accelerator type 'v4'; did you mean v4-8?"),
    ("v4-7", "accelerator type 'v4-7' has no valid size; did you mean v4-8?"),
    ("v4-12", "accelerator type 'v4-12' has no valid size; did you mean v4-8 or v4-16?"),
    ("v6e-12", "accelerator type 'v6e-12' has no valid size; did you mean v6e-8 or v6e-16?"),
    ("v5e-2", "unknown accelerator type 'v5e-2'; did you mean v5litepod-1 or v5litepod-4?"),
    ("v2-1024", "accelerator type 'v2-1024' has no valid size; did you mean v2-512?"),
    ("v7-8", "unknown accelerator type 'v7-8'; expected a generation and a size, such as v4-8, v5p-8, "
             "v5litepod-8 or v6e-8"),
    ("", "unknown accelerator type ''; expected a generation and a size"),
])
def test_a_mistyped_accelerator_type_gets_a_did_you_mean_in_one_line(name, message):
    with pytest.raises(UsageError) as refused:
        accelerators.parse(name)
    assert str(refused.value).startswith(message)
    assert str(refused.value).endswith(f"? {accelerators.SEE_HELP}" if "did you mean" in message
                                       else f" {accelerators.SEE_HELP}")


def test_a_bad_accelerator_type_is_refused_before_any_api_call(tpu_api):
    for typed, meant in (("v5e-8", "unknown accelerator type 'v5e-8'; did you mean v5litepod-8?"),
                         ("v4-7", "accelerator type 'v4-7' has no valid size; did you mean v4-8?")):
        result = podrun("create", typed)
        assert result.returncode == 2
        assert stderr_lines_without_traceback(result.stderr) == [
            f"podrun: error: {meant} (podrun create --help lists the generations)"]
    assert tpu_api.requests == []
    generations = podrun("create", "--help")
    assert "v5litepod-N (v5e)" in " ".join(generations.stdout.split())


def test_an_accelerator_type_in_capitals_creates_the_type_the_api_names(home, tpu_api):
    created = create("shouted", "V4-8")
    assert "creating TPU VM shouted (v4-8: 1 worker" in created.stderr
    assert "accelerator  v4-8, 1 worker(s)" in created.stdout


@pytest.mark.gcloud
def test_create_describe_list_delete_and_gcloud_reads_what_podrun_made(home, tpu_api, lab):
    created = create("my-pod", "v4-32", "--spot")
    assert "creating TPU VM my-pod (v4-32: 4 workers, runtime tpu-ubuntu2204-base, spot)" in created.stderr
    assert "my-pod is READY after" in created.stderr
    for index, host in enumerate(lab.hosts):
        assert f"worker {index:<5} internal {host.ip}  external {host.external_ip}" in created.stdout

    described = gcloud("describe", "my-pod")
    assert described.returncode == 0, described.stderr
    node = json.loads(described.stdout)
    assert node["name"] == f"projects/podrun-test/locations/{ZONE}/nodes/my-pod"
    assert (node["state"], node["acceleratorType"], node["runtimeVersion"]) == ("READY", "v4-32", "tpu-ubuntu2204-base")
    assert node["schedulingConfig"] == {"spot": True}
    assert [e["ipAddress"] for e in node["networkEndpoints"]] == [h.ip for h in lab.hosts]
    assert [e["accessConfig"]["externalIp"] for e in node["networkEndpoints"]] == [h.external_ip for h in lab.hosts]

    listed = podrun("list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr == "podrun: TPU VMs and queued resources in project podrun-test, zone us-central2-b:\n"
    assert listed.stdout.splitlines()[1].split() == ["my-pod", "READY", "v4-32", "4", "tpu-ubuntu2204-base", "spot"]
    assert podrun("describe", "my-pod").stdout == created.stdout

    deleted = podrun("delete", "my-pod", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert "podrun: waiting for my-pod to be deleted (at most 1800s; Ctrl-C stops the wait" in deleted.stderr
    assert "deleted my-pod after" in deleted.stderr
    empty = podrun("list", "--project", "other-proj", "--zone", "europe-west4-a")
    assert (empty.returncode, empty.stdout) == (0, "")
    assert empty.stderr == "podrun: no TPU VMs or queued resources in project other-proj, zone europe-west4-a\n"
    assert podrun("list").stderr == "podrun: no TPU VMs or queued resources in project podrun-test, zone us-central2-b\n"
    gone = gcloud("describe", "my-pod")
    assert gone.returncode != 0 and "NOT_FOUND" in gone.stderr


@pytest.mark.gcloud
def test_gcloud_tpu_vm_ssh_reaches_every_worker_of_a_node_podrun_made(home, tpu_api, lab):
    """The stand-in serves what gcloud's own `tpu-vm ssh --worker=all` asks for (the node, its guest
    attributes' host keys, the compute project, the ssh-keys PATCH), so gcloud is a peer to measure
    podrun against (scripts/bench_tpu_exec.py)."""
    create("my-pod", "v4-32")
    ssh = subprocess.run(["gcloud", "compute", "tpus", "tpu-vm", "ssh", "root@my-pod", "--worker=all", "--quiet",
                          "--command=echo worker-ip $(hostname -I)", f"--zone={ZONE}"],
                         capture_output=True, text=True, timeout=120)
    assert ssh.returncode == 0, ssh.stderr
    printed = [line.split() for line in ssh.stdout.splitlines()]  # also ssh-keygen's report on gcloud's new key
    assert sorted(words[1] for words in printed if words[:1] == ["worker-ip"]) == sorted(h.ip for h in lab.hosts)
    known_hosts = (Path(os.environ["HOME"]) / ".ssh" / "google_compute_known_hosts").read_text()
    assert all(" ".join(host.host_key().split()[:2]) in known_hosts for host in lab.hosts)
    assert ("PATCH", "/v2/projects/podrun-test/locations/us-central2-b/nodes/my-pod") in tpu_api.requests


def test_google_errors_are_one_line_each_saying_what_to_do(home, tpu_api, tmp_path, monkeypatch):
    def error_of(*args: str) -> str:
        result = podrun(*args)
        assert result.returncode == 1, result.stderr
        lines = stderr_lines_without_traceback(result.stderr)
        assert lines[-1].startswith("podrun: error: ")
        return lines[-1]

    create("taken", "v4-8")
    assert "a TPU VM named taken already exists in podrun-test/us-central2-b; pick another --name" in error_of(
        "create", "v4-8", "--name", "taken")
    assert "no capacity in us-central2-b right now" in error_of("create", "v4-64", "--name", "too-big")
    assert "no TPU VM named ghost in podrun-test/us-central2-b" in error_of("describe", "ghost")
    assert "no TPU VM named ghost" in error_of("delete", "ghost", "--yes")
    assert "invalid request: Runtime version 'bogus' is not available" in error_of(
        "create", "v4-8", "--name", "bad-runtime", "--version", "bogus")
    tpu_api.quota_exhausted_projects.add("small")
    assert "quota exceeded in small/us-central2-b" in error_of("create", "v4-8", "--project", "small")
    tpu_api.denied_projects.add("no-api")
    assert "`gcloud services enable tpu.googleapis.com --project no-api`" in error_of("list", "--project", "no-api")
    assert "refusing without --yes" in error_of("delete", "taken")

    monkeypatch.delenv("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    assert "no Google credentials found: run `gcloud auth application-default login`" in error_of("list")
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT")
    result = podrun("list")
    assert result.returncode == 2 and "no Google Cloud project: pass --project" in result.stderr

    monkeypatch.setenv("CLOUDSDK_CORE_PROJECT", "podrun-test")
    monkeypatch.setenv("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE", str(tmp_path / "token"))
    with socket.socket() as closed:  # a port nothing listens on: the one read (describe) and the client (list)
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        monkeypatch.setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU", f"{endpoint}/")
        assert f"reading TPU VM taken: cannot reach the Cloud TPU API at {endpoint} (" in error_of("describe", "taken")
        assert f"listing TPU VMs: cannot reach the Cloud TPU API at {endpoint} (" in error_of("list")

        # Application Default Credentials that cannot be refreshed for want of a network, as exec and
        # describe read the node (a service account key names its token endpoint: the closed port)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        (tmp_path / "adc.json").write_text(json.dumps({
            "type": "service_account", "project_id": "podrun-test", "private_key_id": "1",
            "private_key": key.decode(), "client_email": "ci@podrun-test.iam.gserviceaccount.com",
            "client_id": "1", "token_uri": f"{endpoint}/token"}))
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "adc.json"))
        monkeypatch.delenv("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE")
        assert "reading TPU VM taken: cannot reach Google to refresh the credentials (" in error_of("describe", "taken")


def no_answer(doing: str, timeout: int = 2) -> str:
    endpoint = os.environ["CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU"].rstrip("/")
    return (f"podrun: error: no answer from the Cloud TPU API ({endpoint}) after {timeout}s while {doing} in "
            f"podrun-test/us-central2-b; check your network or CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU "
            f"(PODRUN_API_TIMEOUT sets the seconds to wait)")


def timed(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    result = podrun(*args, timeout=60)
    return result, time.monotonic() - started


def test_an_api_that_never_answers_ends_each_command_in_one_line_after_the_timeout(home, tpu_api, monkeypatch):
    create("pod", "v4-8")
    monkeypatch.setenv("PODRUN_API_TIMEOUT", "2")
    tpu_api.stall_s = math.inf  # the connection is accepted, the request read, and nothing ever answered
    for args, doing in ((("list",), "listing TPU VMs"), (("describe", "pod"), "reading TPU VM pod"),
                        (("delete", "pod", "--yes"), "reading queued resource pod"),
                        (("create", "v4-8", "--name", "other"), "reading queued resource other")):
        result, seconds = timed(*args)
        assert result.returncode == 1, result.stderr
        assert stderr_lines_without_traceback(result.stderr)[-1] == no_answer(doing)
        assert 2 <= seconds < 2 + 8, f"podrun {' '.join(args)} took {seconds:.1f}s"


def test_a_slow_api_is_waited_for_up_to_the_timeout(home, tpu_api, monkeypatch):
    create("pod", "v4-8")
    tpu_api.stall_s = 1.5
    monkeypatch.setenv("PODRUN_API_TIMEOUT", "6")
    listed, seconds = timed("list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[0] == "pod"
    assert seconds >= 1.5
    monkeypatch.setenv("PODRUN_API_TIMEOUT", "1")
    assert stderr_lines_without_traceback(podrun("list").stderr)[-1] == no_answer("listing TPU VMs", timeout=1)
    monkeypatch.setenv("PODRUN_API_TIMEOUT", "soon")
    refused = podrun("list")
    assert refused.returncode == 2
    assert stderr_lines_without_traceback(refused.stderr) == [
        "podrun: error: PODRUN_API_TIMEOUT='soon': expected a number of seconds above 0, e.g. 30"]


def test_an_api_that_stops_answering_while_podrun_waits_for_an_operation_ends_in_one_line(home, tpu_api, monkeypatch):
    monkeypatch.setenv("PODRUN_API_TIMEOUT", "2")
    tpu_api.operation_delay_s = 60
    creating = Background("create", "v4-8", "--name", "slow")
    creating.wait_for(r"^podrun: waiting for slow to be READY \(at most 1800s; Ctrl-C deletes it\)$")
    tpu_api.stall_s = math.inf
    assert creating.finish() == 1
    assert creating.lines[-1] == no_answer("creating TPU VM slow")


def test_a_wait_past_its_deadline_deletes_what_podrun_asked_for_as_ctrl_c_does(home, tpu_api, monkeypatch):
    tpu_api.operation_delay_s = 60
    monkeypatch.setenv("PODRUN_WAIT_TIMEOUT", "2")
    creating = Background("create", "v4-8", "--name", "slow")
    creating.wait_for(r"^podrun: waiting for slow to be READY \(at most 2s; Ctrl-C deletes it\)$")
    tpu_api.operation_delay_s = 0.3  # the deletion is quick
    assert creating.finish() == 1
    assert not crashed(creating.text)
    assert creating.lines[-1] == "podrun: error: slow was not READY within 2s (PODRUN_WAIT_TIMEOUT); podrun deleted " \
                                 "it", creating.text
    assert "podrun: deleting TPU VM slow" in creating.text
    assert "no TPU VM named slow" in podrun("describe", "slow").stderr


def test_a_queued_request_waits_no_longer_than_the_wait_timeout_and_is_deleted(home, tpu_api, monkeypatch):
    tpu_api.withhold_capacity(3600)
    monkeypatch.setenv("PODRUN_WAIT_TIMEOUT", "3")
    result, seconds = timed("create", "v4-8", "--name", "queue", "--queued")
    assert result.returncode == 1, result.stderr
    assert "waiting for queue to be READY (at most 3s (PODRUN_WAIT_TIMEOUT); Ctrl-C deletes the request)" in result.stderr
    assert "as long as the request is valid" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == ("podrun: error: queue was not READY within 3s "
                                                       "(PODRUN_WAIT_TIMEOUT); podrun deleted the request")
    assert seconds < 3 + 10
    assert tpu_api.queued == {} and tpu_api.nodes == {}


def on_a_terminal(*args: str) -> tuple[subprocess.Popen, int]:
    """podrun with its stderr on a pseudo-terminal, as in a user's shell; returns the process and
    the terminal's other end, to read what it shows."""
    reader, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "podrun", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=terminal)
    os.close(terminal)
    return process, reader


def read_terminal(reader: int, until: str | None, timeout: float = 30) -> str:
    """What the terminal shows, until `until` matches it (None: until podrun closes it)."""
    shown = ""
    deadline = time.monotonic() + timeout
    while until is None or not re.search(until, shown):
        assert time.monotonic() < deadline, f"no {until!r} on the terminal within {timeout}s; got {shown!r}"
        if select.select([reader], [], [], 0.1)[0]:
            try:
                shown += os.read(reader, 4096).decode(errors="replace")
            except OSError:  # EIO: podrun has exited and the terminal is closed
                assert until is None, f"no {until!r} on the terminal; got {shown!r}"
                break
    return shown


def test_a_wait_shows_the_node_state_on_a_terminal_and_ctrl_c_says_the_deletion_goes_on(home, tpu_api):
    create("pod", "v4-8")
    tpu_api.operation_delay_s = 60
    deleting, reader = on_a_terminal("delete", "pod", "--yes")
    try:
        read_terminal(reader, r"\rpodrun: waiting for pod to be deleted: DELETING, [1-9]\d*s")
        deleting.send_signal(signal.SIGINT)
        assert deleting.wait(timeout=30) == 130
        lines = read_terminal(reader, None).splitlines()  # \r too ends a line here
    finally:
        os.close(reader)
    assert lines[-1] == ("podrun: interrupted: podrun stopped waiting, but the deletion of pod goes on at Google: "
                         "`podrun describe pod --zone us-central2-b --project podrun-test` shows its state until it "
                         "is gone")
    assert not crashed("\n".join(lines))


def test_project_and_zone_come_from_the_active_gcloud_configuration(home, tpu_api, tmp_path, monkeypatch):
    config_dir = Path(os.environ["CLOUDSDK_CONFIG"])
    (config_dir / "configurations").mkdir(parents=True)
    (config_dir / "active_config").write_text("work")
    (config_dir / "configurations" / "config_work").write_text(
        "[core]\nproject = from-config\n[compute]\nzone = europe-west4-a\n")
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT")
    monkeypatch.delenv("CLOUDSDK_COMPUTE_ZONE")
    create("configured", "v4-8")
    assert ("POST", "/v2/projects/from-config/locations/europe-west4-a/nodes") in tpu_api.requests
    assert podrun("describe", "configured", "--zone", "europe-west4-a").returncode == 0
    assert podrun("describe", "configured", "--zone", ZONE).returncode == 1  # the flag wins


def test_create_no_wait_returns_at_once_and_exec_refuses_a_node_that_is_not_ready(home, tpu_api, job_file):
    tpu_api.operation_delay_s = 60
    result = podrun("create", "v4-8", "--name", "slow", "--no-wait")
    assert result.returncode == 0, result.stderr
    assert ("creation of slow started; `podrun describe slow --zone us-central2-b --project podrun-test` shows when "
            "it is READY") in result.stderr
    assert "state        CREATING" in podrun("describe", "slow").stdout
    refused = podrun("exec", tpu_spec(job_file, "slow", "true"))
    assert refused.returncode == 1
    assert "TPU VM slow is CREATING, not READY" in refused.stderr


@pytest.mark.slow
@pytest.mark.gcloud
def test_the_example_runs_on_every_worker_of_a_pod_slice_with_the_key_added_to_its_metadata(
        home, tpu_api, lab, tmp_path):
    create("my-pod", "v4-32", "--zone", "us-central2-b")
    spec = yaml.safe_load((REPO / "configs" / "tpu-hello.yaml").read_text())
    spec["ssh"] = {"user": "root"}  # the lab's hosts have root only
    spec["workdir"] = str(tmp_path)
    (tmp_path / "tpu-hello.yaml").write_text(yaml.safe_dump(spec))
    dry = podrun("exec", tmp_path / "tpu-hello.yaml", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"# worker 1: {lab.hosts[1].external_ip} (internal IP {lab.hosts[1].ip})" in dry.stdout
    assert dry.stdout.startswith("# target: TPU VM my-pod (v4-32, runtime tpu-ubuntu2204-base, READY) in "
                                 "podrun-test/us-central2-b: 4 TPU workers\n")
    assert not any(method == "PATCH" for method, _ in tpu_api.requests)  # a dry run changes nothing
    assert not (Path(os.environ["HOME"]) / ".ssh" / "google_compute_engine").exists()  # nor makes a key

    result = podrun("exec", tmp_path / "tpu-hello.yaml")
    assert result.returncode == 0, result.stderr
    for index in range(4):
        assert (f"[w{index}] worker {index} of 4, PJRT_DEVICE=TPU, on {lab.hosts[index].hostname}, rendezvous at "
                f"{lab.hosts[0].ip}") in result.stdout
    assert "4 TPU workers" in result.stderr
    assert all((host.home / "podrun" / "tpu-hello").is_dir() for host in lab.hosts)  # each worker its own host
    public_key = (Path(os.environ["HOME"]) / ".ssh" / "google_compute_engine.pub").read_text().split()[:2]
    ssh_keys = json.loads(gcloud("describe", "my-pod").stdout)["metadata"]["ssh-keys"]
    assert ssh_keys == f"root:{public_key[0]} {public_key[1]} root"
    assert processes_of_job(job_id_in(result.stderr)) == []

    again = podrun("exec", tmp_path / "tpu-hello.yaml")
    assert again.returncode == 0, again.stderr
    assert sum(method == "PATCH" for method, _ in tpu_api.requests) == 1  # the key was there already
    # with the key there, exec reads the node with one GET and never loads Google's generated client
    # or the requests library it runs on
    generated_client = ("google.cloud.tpu_v2", "google.api_core", "requests")
    assert modules_imported_by(["exec", tmp_path / "tpu-hello.yaml"], generated_client) == []


@pytest.mark.slow
def test_a_failing_tpu_worker_stops_the_others(home, tpu_api, lab, job_file):
    create("pod", "v4-32")
    result = podrun("exec", tpu_spec(job_file, "pod", 'if [ "$PODRUN_WORKER" = 2 ]; then echo dying; exit 7; fi\n'
                                                      "sleep 60"))
    assert result.returncode == 7, result.stderr
    assert f"worker 2 ({lab.hosts[2].external_ip}) exited with code 7 in run" in result.stderr
    assert processes_of_job(job_id_in(result.stderr)) == []


@pytest.mark.slow
def test_processes_holding_the_tpu_are_named_and_killed_only_when_asked(home, tpu_api, lab, job_file, monkeypatch):
    create("pod", "v4-32")
    for host in lab.hosts:  # every TPU VM worker has its devices
        (host.home / "accel0").write_text("")
    monkeypatch.setenv("PODRUN_ACCELERATOR_FILES", "/root/accel*")
    # its argv holds a newline and a tab: the probe's "pid TAB file TAB command" lines must still parse
    holder = lab.popen(1, [sys.executable, "-c", "import time; f = open('/root/accel0'); print('holding', flush=True); "
                                                 "time.sleep(600)", "line one\nline\ttwo"])
    try:
        assert holder.stdout.readline() == "holding\n"
        spec = tpu_spec(job_file, "pod", "echo ran")
        refused = podrun("exec", spec)
        assert refused.returncode == 1
        lines = stderr_lines_without_traceback(refused.stderr)
        assert "podrun: error: the TPU is in use on the workers (left from an earlier run?):" in lines
        assert (f"  worker 1 ({lab.hosts[1].external_ip}): pid {holder.pid} holds /root/accel0: {sys.executable} -c "
                "import time; f = open('/root/accel0');") in "\n".join(lines)
        assert any(line.endswith("time.sleep(600) line one\\nline\\ttwo") for line in lines), lines
        assert sum("holds /root/accel0" in line for line in lines) == 1  # the same path on other hosts is free
        assert "[w0] ran" not in refused.stdout
        assert holder.poll() is None

        killed = podrun("exec", spec, "--kill-stale", "--no-collapse")
        assert killed.returncode == 0, killed.stderr
        assert "killed 1 process(es) that held the TPU" in killed.stderr
        assert holder.wait(timeout=10) != 0
        assert killed.stdout.count("] ran") == 4
    finally:
        holder.kill()
        holder.wait()


def test_ctrl_c_while_creating_deletes_the_node_podrun_asked_for(home, tpu_api):
    tpu_api.operation_delay_s = 60
    creating = Background("create", "v4-8", "--name", "slow")
    creating.wait_for(r"creating TPU VM slow")
    while ("POST", "/v2/projects/podrun-test/locations/us-central2-b/nodes") not in tpu_api.requests:
        assert creating.process.poll() is None
        time.sleep(0.05)
    tpu_api.operation_delay_s = 0.3  # the deletion's (the creation still takes 60 s)
    creating.process.send_signal(signal.SIGINT)
    assert creating.finish() == 130
    assert ("podrun: interrupted: deleting what podrun asked for (slow), so that nothing is left queued or "
            "billing") in creating.lines
    assert "podrun: deleting TPU VM slow" in creating.lines
    assert tpu_api.nodes == {}
    assert not crashed(creating.text)


def test_a_node_missing_workers_is_refused(home, tpu_api, job_file):
    create("pod", "v4-32")
    tpu_api.nodes[f"projects/podrun-test/locations/{ZONE}/nodes/pod"]["networkEndpoints"].pop()
    result = podrun("exec", tpu_spec(job_file, "pod", "true"))
    assert result.returncode == 1
    assert "TPU VM pod (v4-32) reports 3 of its 4 workers" in result.stderr


def test_docker_on_tpu_runs_privileged(home, tpu_api, job_file):
    create("pod", "v4-8")
    result = podrun("exec", tpu_spec(job_file, "pod", "python3 train.py", docker="{image: 'xla:r2.5'}"), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "docker run --rm --net=host --name=podrun-" in result.stdout
    assert " --privileged " in result.stdout
