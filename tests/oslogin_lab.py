"""OS Login on the lab (tests/oslogin_stand_in.py): the fixtures `os_login` (beside `tpu_api`) and
`os_login_on_lab` (beside `tpu_api_on_lab`, for a supervisor host) turn `enable-oslogin` on in the
project's metadata, give the test process an account (CLOUDSDK_CORE_ACCOUNT, its token the laptop's)
and the supervisor host's service account its own token, and put every lab host in OS Login mode, as
the guest agent does: its sshd takes keys from the OS Login stand-in only (AuthorizedKeysCommand), and
each account's POSIX user exists there (a user of this machine, made for the test and removed after,
with a home of its own on every lab host). Registered for every test module by conftest.py."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from oslogin_stand_in import Account, OsLoginStandIn

PROJECT = "podrun-test"
USER_EMAIL = "alice@example.com"
SUPERVISOR_EMAIL = "podrun-supervisor@podrun-test.iam.gserviceaccount.com"
# sshd runs AuthorizedKeysCommand only from a path that root alone can write to, up to /: not under /tmp
PROGRAM_DIR = Path("/run/podrun-lab-oslogin")


@dataclass
class OsLogin:
    stand_in: OsLoginStandIn
    user: Account  # the test process's account (CLOUDSDK_CORE_ACCOUNT)
    supervisor: Account  # the supervisor host's service account
    tpu_api: object  # the TPU stand-in, whose project metadata holds enable-oslogin

    def set_project_metadata(self, **items: str) -> None:
        """The project's metadata (compute projects.get): `enable_oslogin="TRUE"` is `enable-oslogin`."""
        with self.tpu_api.lock:
            self.tpu_api.project_metadata[PROJECT] = {key.replace("_", "-"): value for key, value in items.items()}


@pytest.fixture
def os_login(lab, tpu_api, monkeypatch):
    yield from _os_login(lab, tpu_api, monkeypatch)


@pytest.fixture
def os_login_on_lab(lab, tpu_api_on_lab, monkeypatch):
    yield from _os_login(lab, tpu_api_on_lab, monkeypatch)


def _os_login(lab, tpu_api, monkeypatch):
    from helpers import LAPTOP_TOKEN, SUPERVISOR_TOKEN
    from lab import BRIDGE_IP

    stand_in = OsLoginStandIn()
    url = stand_in.serve(BRIDGE_IP)
    accounts = [stand_in.add_account(USER_EMAIL, LAPTOP_TOKEN), stand_in.add_account(SUPERVISOR_EMAIL, SUPERVISOR_TOKEN)]
    state = OsLogin(stand_in, *accounts, tpu_api)
    try:
        for account in accounts:
            _remove_user(account.username, lab)
            # password `*`, as OS Login's NSS module gives it: sshd without PAM refuses a locked (`!`) account
            subprocess.run(["useradd", "--no-create-home", "--password", "*", "--uid", str(account.uid), "--user-group",
                            "--home-dir", f"/home/{account.username}", "--shell", "/bin/bash", account.username],
                           check=True, capture_output=True)
            for host in lab.hosts:
                home = host.homes / account.username
                home.mkdir(mode=0o700)
                shutil.chown(home, account.username, account.username)
        program = stand_in.authorized_keys_command(PROGRAM_DIR)
        lab.set_sshd_extra(f"AuthorizedKeysCommand {program} %u\nAuthorizedKeysCommandUser nobody\n")
        state.set_project_metadata(enable_oslogin="TRUE")
        monkeypatch.setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_OSLOGIN", f"{url}/")
        monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", USER_EMAIL)
        yield state
    finally:
        lab.set_sshd_extra("")
        for account in accounts:
            _remove_user(account.username, lab)
        shutil.rmtree(PROGRAM_DIR, ignore_errors=True)
        stand_in.shutdown()


def _remove_user(name: str, lab) -> None:
    """The user (left by an earlier run, too) and its homes on the lab hosts, gone."""
    subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["groupdel", name], capture_output=True)
    for host in lab.hosts:
        shutil.rmtree(host.homes / name, ignore_errors=True)
