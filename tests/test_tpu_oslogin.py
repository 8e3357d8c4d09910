"""OS Login, as gcloud does it (issue 37, parts 1 and 5): a project or node with `enable-oslogin` TRUE
takes keys only through the Cloud OS Login API, for the account's POSIX user; `ssh-keys` metadata
counts for nothing there. The stand-in is checked first with the real gcloud's `tpu-vm ssh
--worker=all`, then podrun runs there as gcloud would. Run under `flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from conftest import podrun
from helpers import ZONE, create, gcloud

pytestmark = pytest.mark.lab


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
