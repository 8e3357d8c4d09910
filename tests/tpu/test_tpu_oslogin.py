"""OS Login, as gcloud does it (issue 37, parts 1 and 5): a project or node with `enable-oslogin` TRUE
takes keys only through the Cloud OS Login API, for the account's POSIX user; `ssh-keys` metadata
counts for nothing there. The stand-in is checked first with the real gcloud's `tpu-vm ssh
--worker=all`, then podrun runs there as gcloud would. Run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from helpers import ZONE, Background, create, gcloud, job_id_in, podrun, stderr_lines_without_traceback, wait_until


@pytest.mark.gcloud
def test_the_real_gcloud_reaches_every_worker_as_the_os_login_user_and_metadata_keys_count_for_nothing(
        home, tpu_api, os_login, lab):
    create("olpod", "v4-32")
    ssh = subprocess.run(["gcloud", "compute", "tpus", "tpu-vm", "ssh", "olpod", "--worker=all", "--quiet",
                          "--command=echo who $(id -un) $(hostname -I)", f"--zone={ZONE}"],
                         capture_output=True, text=True, timeout=120)
    assert ssh.returncode == 0, ssh.stderr
    seen = sorted(line.split()[1:3] for line in ssh.stdout.splitlines() if line.startswith("who "))
    assert seen == sorted([os_login.user.username, host.ip] for host in lab.hosts)
    assert ("GET", "/v1/users/alice@example.com/loginProfile", "podrun-test") in [
        (method, unquote(path), query.get("projectId")) for method, path, query in os_login.stand_in.requests]
    assert os_login.stand_in.imports() == [os_login.user.email]
    # gcloud also wrote its key into the node's ssh-keys, for the OS Login user: under OS Login that counts
    # for nothing, so once the key is gone from the login profile, the workers refuse it
    assert f"{os_login.user.username}:ssh-" in json.loads(gcloud("describe", "olpod").stdout)["metadata"]["ssh-keys"]
    os_login.user.keys.clear()
    plain = subprocess.run(["ssh", "-i", str(Path(os.environ["HOME"]) / ".ssh" / "google_compute_engine"),
                            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                            f"{os_login.user.username}@{lab.hosts[0].external_ip}", "id -un"],
                           capture_output=True, text=True, timeout=60)
    assert plain.returncode == 255 and "Permission denied (publickey)" in plain.stderr, plain


def oslogin_spec(job_file, run: str, tpu: str = "name: olpod, accelerator_type: v4-32", **top: str) -> Path:
    """A spec on a TPU the stand-in has the lab's 4 hosts for; its commands use the system's tools only (the
    OS Login user cannot read this interpreter's directory, which lives under root's home)."""
    lines = [f"target: {{tpu: {{{tpu}}}}}", "env: {PATH: '/usr/bin:/bin'}", "run: |",
             *(f"  {line}" for line in run.splitlines()), *(f"{key}: {value}" for key, value in top.items())]
    return job_file("\n".join(lines) + "\n")


WHO = "echo who $PODRUN_WORKER $(id -un)"


def who_ran(output: str) -> list[tuple[int, str]]:
    """(worker, user) of each line WHO printed."""
    return sorted((int(words[-2]), words[-1]) for words in map(str.split, output.splitlines()) if "who" in words)


def test_a_tpu_exec_creates_in_an_os_login_project_runs_on_every_worker_as_the_os_login_user(
        home, tpu_api, os_login, lab, job_file):
    spec = oslogin_spec(job_file, WHO)
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert who_ran(result.stdout) == [(i, os_login.user.username) for i in range(4)]
    node = json.loads(gcloud("describe", "olpod").stdout)
    assert "ssh-keys" not in node.get("metadata", {})
    assert [body.get("metadata", {}) for _, body in tpu_api.node_requests()] == [{}]
    assert os_login.stand_in.imports() == [os_login.user.email]
    again = podrun("exec", spec)  # the key is in the profile now: nothing imported again
    assert again.returncode == 0 and os_login.stand_in.imports() == [os_login.user.email], again.stderr


def on_hosts(lab, command: str) -> list[str]:
    """`command`'s output on every lab host, in host order."""
    return [lab.run(host.index, command).stdout for host in lab.hosts]


def test_ssh_cp_stacks_logs_and_stop_reach_the_workers_as_the_os_login_user_on_a_node_whose_own_metadata_says_so(
        home, tpu_api, os_login, lab, job_file):
    os_login.set_project_metadata()  # the project says nothing: the node's own enable-oslogin decides
    create("olpod", "v4-32")
    with tpu_api.lock:
        tpu_api.nodes["projects/podrun-test/locations/us-central2-b/nodes/olpod"]["metadata"] = {"enable-oslogin": "TRUE"}
    user = os_login.user.username
    spec = oslogin_spec(job_file, "echo up; exec python3 -c 'import time; time.sleep(300)' oslogin-detached",
                        tpu="name: olpod")
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    wait_until(lambda: all("oslogin-detached" in out for out in on_hosts(lab, f"ps -u {user} -o args=")),
               "the job on every worker, as the OS Login user")

    shell = podrun("ssh", "--tpu", "olpod", "--worker", "2", "--", "id -un; hostname -I")
    assert shell.returncode == 0 and shell.stdout.split()[:2] == [user, lab.hosts[2].ip], shell.stderr
    (home.parent / "note.txt").write_text("copied\n")
    copied = podrun("cp", "--tpu", "olpod", home.parent / "note.txt", ":note.txt")
    assert copied.returncode == 0, copied.stderr
    for host in lab.hosts:
        note = host.homes / user / "note.txt"
        assert note.read_text() == "copied\n" and note.stat().st_uid == os_login.user.uid
    stacks = podrun("stacks", job_id, "--all")
    assert stacks.returncode == 0, stacks.stderr
    headers = re.findall(r"^=== pid \d+ \(parent \d+\): python3 -c .* oslogin-detached ===$", stacks.stdout, re.M)
    assert len(headers) == 4, stacks.stdout

    follower = Background("logs", "-f", job_id)
    follower.wait_for(r"\[w0-3\] up")
    stopped = podrun("stop", job_id)  # the workers' endpoints (user included) are the job's record's
    assert stopped.returncode == 0, stopped.stderr
    assert follower.finish() == 143
    assert on_hosts(lab, f"ps -u {user} -o args= | grep -c oslogin-detached || true") == ["0\n"] * 4
    assert "ssh-keys" not in json.loads(gcloud("describe", "olpod").stdout)["metadata"]
    assert os_login.stand_in.imports() == [os_login.user.email]


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, result.stderr
    lines = stderr_lines_without_traceback(result.stderr)
    assert lines[-1].startswith("podrun: error: ") and not lines[-1].endswith(":"), result.stderr
    return lines[-1]


def test_what_podrun_cannot_do_under_os_login_is_one_line_saying_what_to_do(
        home, tpu_api, os_login, lab, job_file, monkeypatch):
    create("olone", "v4-8")
    spec = oslogin_spec(job_file, WHO, tpu="name: olone")
    os_login.set_project_metadata(enable_oslogin="TRUE", enable_oslogin_2fa="TRUE")
    assert ("OS Login here requires 2-step verification at each login (enable-oslogin-2fa in the project "
            "podrun-test's metadata), which podrun cannot give; log in with `gcloud compute tpus tpu-vm ssh NAME "
            "--worker=all --zone us-central2-b --project podrun-test`, or set enable-oslogin-2fa=FALSE in the TPU "
            "VM's metadata") in one_error_line(podrun("exec", spec))
    os_login.set_project_metadata(enable_oslogin="TRUE", enable_oslogin_sk="true")
    assert "OS Login here requires a security key at each login (enable-oslogin-sk in the project podrun-test's" \
        in one_error_line(podrun("exec", spec))
    assert os_login.stand_in.imports() == []

    os_login.set_project_metadata(enable_oslogin="TRUE")
    os_login.user.login_role = False
    line = one_error_line(podrun("exec", spec))
    assert line.endswith(
        f"key refused for user {os_login.user.username} (identity file: {Path(os.environ['HOME'])}/.ssh/"
        f"google_compute_engine); OS Login took the key of alice@example.com, so most likely the account lacks "
        f"roles/compute.osLogin (or roles/compute.osAdminLogin) in project podrun-test: `gcloud projects "
        f"add-iam-policy-binding podrun-test --member=user:alice@example.com --role=roles/compute.osLogin`"), line
    os_login.user.login_role = True
    assert who_ran(podrun("exec", spec).stdout) == [(0, os_login.user.username)]  # the advice, followed

    monkeypatch.delenv("CLOUDSDK_CORE_ACCOUNT")
    assert one_error_line(podrun("exec", spec)).endswith(
        f"OS Login needs your Google account, and none was found: not in CLOUDSDK_CORE_ACCOUNT, not as core/account "
        f"in the active gcloud configuration (in {os.environ['CLOUDSDK_CONFIG']}), and the credentials in use are no "
        f"service account's; run `gcloud config set account EMAIL` or export CLOUDSDK_CORE_ACCOUNT=EMAIL")
    config = Path(os.environ["CLOUDSDK_CONFIG"])
    (config / "configurations").mkdir(parents=True, exist_ok=True)
    (config / "active_config").write_text("work\n")
    (config / "configurations" / "config_work").write_text("[core]\naccount = alice@example.com\n")
    assert who_ran(podrun("exec", spec).stdout) == [(0, os_login.user.username)]  # gcloud's configuration's account


def test_an_account_every_worker_refuses_is_one_line_for_all_of_them(home, tpu_api, os_login, lab, job_file):
    """The guest asks whether the account may log in: without the role, every worker refuses it alike."""
    create("olfour", "v4-32")
    os_login.set_project_metadata(enable_oslogin="TRUE")
    os_login.user.login_role = False
    result = podrun("exec", oslogin_spec(job_file, WHO, tpu="name: olfour"))
    assert result.returncode == 1
    assert one_error_line(result) == (
        f"podrun: error: 4 of 4 workers (w0-3) failed to connect: key refused for user {os_login.user.username} "
        f"(identity file: {Path(os.environ['HOME'])}/.ssh/google_compute_engine); OS Login took the key of "
        f"alice@example.com, so most likely the account lacks roles/compute.osLogin (or roles/compute.osAdminLogin) "
        f"in project podrun-test: `gcloud projects add-iam-policy-binding podrun-test "
        f"--member=user:alice@example.com --role=roles/compute.osLogin`")


@pytest.mark.slow
def test_a_preempted_multislice_recovers_with_every_worker_of_every_slice_as_the_os_login_user(
        home, tpu_api, os_login, lab, job_file):
    run = ('echo "attempt $PODRUN_ATTEMPT who $PODRUN_WORKER $(id -un)"\n'
           'if [ "$PODRUN_ATTEMPT" = 0 ]; then exec sleep 600; fi\n'
           'echo "resumed who $PODRUN_WORKER $(id -un)"')
    spec = oslogin_spec(job_file, run, tpu="name: olms, accelerator_type: v4-16, slices: 2, queued: true, spot: true",
                        restarts="{max: 1}", delete_after="always")
    job = Background("exec", spec)
    job.wait_for(r"\[w3\] +attempt 0")
    tpu_api.preempt("olms-1")
    assert job.finish(timeout=120) == 0, job.text
    assert "slice 1 (olms-1)" in job.text and "preempted" in job.text
    resumed = [line for line in job.text.splitlines() if "resumed who" in line]
    assert who_ran("\n".join(resumed)) == [(i, os_login.user.username) for i in range(4)]
    # both queued resources (the first, and the one made again) asked for no ssh-keys; the key went to OS Login once
    requests = tpu_api.node_requests()
    assert [node_id for node_id, _ in requests] == ["olms", "olms"]
    assert all("ssh-keys" not in body.get("metadata", {}) for _, body in requests)
    assert os_login.stand_in.imports() == [os_login.user.email]


def test_a_job_handed_to_a_supervisor_runs_as_the_os_login_user_of_the_supervisors_own_account(
        home, lab, tpu_api_on_lab, os_login_on_lab, supervisor, job_file):
    from oslogin_lab import SUPERVISOR_EMAIL

    # the host's own account, as `gcloud auth activate-service-account` leaves it in its configuration
    config = supervisor.home / ".config" / "gcloud" / "configurations" / "config_default"
    config.write_text(config.read_text() + f"[core]\naccount = {SUPERVISOR_EMAIL}\n")
    spec = oslogin_spec(job_file, WHO, tpu="name: life, accelerator_type: v4-16", delete_after="always")
    spec.write_text(spec.read_text() + f"ssh: {{identity_file: {lab.client_key}}}\n" + supervisor.spec)
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert who_ran(result.stdout) == [(0, os_login_on_lab.supervisor.username), (1, os_login_on_lab.supervisor.username)]
    assert os_login_on_lab.stand_in.imports() == [SUPERVISOR_EMAIL]  # never the laptop's account
    assert all("ssh-keys" not in body.get("metadata", {}) for _, body in tpu_api_on_lab.node_requests())


def test_the_account_is_gclouds_else_the_credentials_service_account_else_the_vms_from_the_metadata_server(
        monkeypatch, tmp_path):
    from metadata_stand_in import MetadataStandIn

    from podrun.cloud import oslogin
    from podrun.cloud.settings import Location
    from podrun.cloud.tpu_api import TpuApi

    server = MetadataStandIn()
    server.values["service-accounts/default/email"] = "vm-sa@proj.iam.gserviceaccount.com"
    monkeypatch.setenv("GCE_METADATA_HOST", server.serve("127.0.0.1"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    monkeypatch.delenv("CLOUDSDK_CORE_ACCOUNT", raising=False)
    (tmp_path / "token").write_text("a-token\n")
    monkeypatch.setenv("CLOUDSDK_AUTH_ACCESS_TOKEN_FILE", str(tmp_path / "token"))  # no service account's
    api = TpuApi(Location("proj", "us-central2-b"))
    try:
        assert oslogin.account(api) == "vm-sa@proj.iam.gserviceaccount.com"
        api.auth.credentials.service_account_email = "key-sa@proj.iam.gserviceaccount.com"  # as a key file's have
        assert oslogin.account(api) == "key-sa@proj.iam.gserviceaccount.com"
        monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "alice@example.com")
        assert oslogin.account(api) == "alice@example.com"
    finally:
        server.shutdown()
