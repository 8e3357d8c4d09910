"""Issue 27, secrets and host keys: what a local user or a host with a forged key could get.

A secret written under `env:` in a spec that sits in its workdir, the TPU SSH key podrun makes, and a
host that the user's own ~/.ssh/known_hosts knows by another key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, lab_flags, podrun, stderr_lines_without_traceback

# records, at every audit event while ensure_key_pair runs, the mode of the key file if it exists by then
KEY_MODES_WATCHED = """
import os, sys
from pathlib import Path
from podrun.transport.client_keys import ensure_key_pair
key = Path(sys.argv[1])
seen = set()
def watch(event, args):
    try:
        seen.add(os.stat(key).st_mode & 0o777)
    except OSError:
        pass
sys.addaudithook(watch)
os.umask(0)
ensure_key_pair(key, "me", create=True)
print(sorted(seen), os.stat(key.parent).st_mode & 0o777)
"""


def test_the_generated_ssh_key_is_never_readable_by_others(tmp_path):
    """Under umask 0, the private key was 0666 until a chmod made it 0600: any local user could read it meanwhile."""
    key = tmp_path / "home" / ".ssh" / "google_compute_engine"
    result = subprocess.run([sys.executable, "-c", KEY_MODES_WATCHED, str(key)], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    modes, directory_mode = result.stdout.split("] ")
    assert json.loads(modes + "]") == [0o600]
    assert int(directory_mode) == 0o700


SECRET = "sk-live-4f9a1c2e8b7d"
SPEC_WITH_A_WRITTEN_SECRET = f"""\
name: leaky
target: {{local: {{workers: 2}}}}
workdir: .
run: python3 -c "import os; print('key set:', bool(os.environ['WANDB_API_KEY']))"
env: {{WANDB_API_KEY: {SECRET}, WANDB_MODE: offline}}
"""


def files_holding(root: Path, value: str) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")
                  if path.is_file() and not path.is_symlink() and value.encode() in path.read_bytes())


def test_a_secret_written_in_the_spec_reaches_no_file_on_any_worker(tmp_path, home):
    """The spec sat in its workdir and shipped with the code, its secret readable by all (0444 files in
    0755 directories) in each kept version; now it stays home and the code directories are 0700."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('training')\n")
    spec = workdir / "leaky.yaml"
    spec.write_text(SPEC_WITH_A_WRITTEN_SECRET)
    result = podrun("exec", spec, "--no-collapse")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("key set: True") == 2
    assert files_holding(home, SECRET) == []
    assert f"{spec}: env.WANDB_API_KEY: a secret's value is written in the spec" in result.stderr
    workers = home / "local"
    for worker in ("w0", "w1"):
        podrun_dir = workers / worker / "podrun"
        assert (podrun_dir / "leaky" / "run" / "train.py").exists()
        assert not (podrun_dir / "leaky" / "run" / "leaky.yaml").exists()
        versions = [path for path in (podrun_dir / "leaky").iterdir() if path.is_dir() and path.name != "run"]
        assert len(versions) == 1
        for directory in (podrun_dir, podrun_dir / "leaky", *versions):
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory


def test_code_directories_an_older_podrun_left_open_are_made_private(tmp_path, home):
    """Directories of a name shipped before are closed on the next run, with the versions they keep."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('training')\n")
    spec = workdir / "open.yaml"
    spec.write_text("target: {local: {workers: 1}}\nworkdir: .\nrun: python3 train.py\n")
    assert podrun("exec", spec).returncode == 0
    name_dir = home / "local" / "w0" / "podrun" / "open"
    for directory in (name_dir.parent, name_dir):
        directory.chmod(0o755)
    assert podrun("exec", spec).returncode == 0
    assert [stat.S_IMODE(path.stat().st_mode) for path in (name_dir.parent, name_dir)] == [0o700, 0o700]


def test_validate_warns_of_a_secret_written_in_the_spec(tmp_path):
    spec = tmp_path / "leaky.yaml"
    spec.write_text(SPEC_WITH_A_WRITTEN_SECRET.replace("env: {", "secret_env: [WANDB_MODE]\nenv: {"))
    result = podrun("validate", spec)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "a secret's value is written in the spec" in line]
    assert warnings == [
        f"podrun: {spec}: env.WANDB_API_KEY: a secret's value is written in the spec, readable by whoever can read "
        f"the file; keep it out: drop it from env, list it in secret_env ([WANDB_API_KEY]) and `export "
        f"WANDB_API_KEY=...` before podrun runs (secret_env takes it from podrun's environment)",
        f"podrun: {spec}: env.WANDB_MODE: a secret's value is written in the spec, readable by whoever can read "
        f"the file; keep it out: drop it from env, list it in secret_env ([WANDB_MODE]) and `export "
        f"WANDB_MODE=...` before podrun runs (secret_env takes it from podrun's environment)"]
    assert SECRET not in result.stderr + result.stdout


def test_validate_is_quiet_about_secrets_taken_from_podruns_environment(tmp_path):
    spec = tmp_path / "clean.yaml"
    spec.write_text("run: python3 train.py\nworkdir: .\nsecret_env: [WANDB_API_KEY]\nenv: {WANDB_MODE: offline}\n")
    (tmp_path / "train.py").write_text("")
    result = podrun("validate", spec)
    assert result.returncode == 0, result.stderr
    assert "secret" not in result.stderr


def hashed(name: str) -> str:
    """A known-hosts name as OpenSSH's HashKnownHosts writes it."""
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


@pytest.fixture
def user_home(tmp_path, monkeypatch) -> Path:
    """A HOME of the test's own, with an empty ~/.ssh, for the podrun subprocesses."""
    path = tmp_path / "user-home"
    (path / ".ssh").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("HOME", str(path))
    return path


def another_hosts_key(lab) -> str:
    return " ".join((lab.hosts[1].dir / "ssh_host_ed25519_key.pub").read_text().split()[:2])


def assert_refused_by_record(spec: Path, host_ip: str, record: Path, line: int) -> None:
    refused = podrun("exec", spec)
    assert (refused.returncode, stderr_lines_without_traceback(refused.stderr)[-1]) == (1, (
        f"podrun: error: {host_ip}: host key differs from the one recorded for it in {record} line {line}; if the "
        f"host was rebuilt, remove that record (ssh-keygen -R {host_ip} -f {record})"))


@pytest.mark.slow
def test_a_host_the_users_known_hosts_knows_by_another_key_is_refused(home, lab, hosts_spec, user_home):
    """podrun trusted any key on first contact, though ~/.ssh/known_hosts held another for the host
    (OpenSSH's accept-new refuses); it is refused now, naming the file and line, and nothing runs."""
    host = lab.hosts[0]
    spec = hosts_spec("run: echo ran > ~/ran-here", hosts=(0,))
    own_key = " ".join(host.host_key().split()[:2])
    users = user_home / ".ssh" / "known_hosts"
    users.write_text(f"# hosts of the cluster\n{hashed(host.ip)} {another_hosts_key(lab)}\n")
    assert_refused_by_record(spec, host.ip, users, 2)
    assert not (host.home / "ran-here").exists()
    assert not (home / "known_hosts").exists()  # nothing trusted on first contact either

    users.write_text(f"10.99.*,!{lab.hosts[1].ip} {own_key}\n")  # a pattern that names it, with its own key
    assert podrun("exec", spec).returncode == 0
    assert (host.home / "ran-here").exists()
    assert not (home / "known_hosts").exists()  # the user's file is its record: podrun keeps no copy


@pytest.mark.slow
def test_the_specs_known_hosts_file_is_read_too_and_podrun_ssh_keeps_it(home, lab, hosts_spec, user_home):
    host = lab.hosts[0]
    cluster = user_home / "cluster_known_hosts"
    cluster.write_text(f"{host.ip},{lab.hosts[2].ip} {another_hosts_key(lab)}\n")
    spec = hosts_spec("run: echo ok", hosts=(0,))
    spec.write_text(spec.read_text().replace("ssh: {", f"ssh: {{known_hosts: {cluster}, "))
    assert_refused_by_record(spec, host.ip, cluster, 1)
    (user_home / ".ssh" / "known_hosts").write_text(f"{host.ip} {another_hosts_key(lab)}\n")
    shell = podrun("ssh", *lab_flags(lab, (0,)), "--", "echo reached")  # OpenSSH, with podrun's rules
    assert shell.returncode == 255
    assert "reached" not in shell.stdout and "HOST IDENTIFICATION HAS CHANGED" in shell.stderr


def test_a_missing_known_hosts_file_named_by_the_spec_is_one_line(home, tmp_path, user_home):
    spec = tmp_path / "job.yaml"
    spec.write_text("target: {hosts: [10.99.0.250]}\nssh: {known_hosts: ~/nowhere}\nworkdir: .\nrun: echo hi\n")
    result = podrun("exec", spec)
    assert (result.returncode, result.stderr) == (
        2, f"podrun: error: {spec}: ssh.known_hosts: expected an existing known-hosts file, ~/nowhere is not one\n")


def test_known_hosts_lines_name_a_host_as_openssh_matches_them(tmp_path):
    from podrun.transport.known_hosts import lines_for

    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHh"
    path = tmp_path / "known_hosts"
    path.write_text("\n".join([
        "# a comment",
        f"10.0.0.2 {key}1",
        f"node-a,10.0.0.3 {key}2",
        f"10.0.0.* {key}3",
        f"10.0.0.*,!10.0.0.9 {key}4",
        f"[10.0.0.2]:2222 {key}5",
        f"{hashed('10.0.0.4')} {key}6",
        f"NODE-B {key}7",
        f"@revoked 10.0.0.5 {key}8",
        f"10.0.0.? {key}9",
        "",
    ]))
    def named(known_as: str) -> list[int]:
        return [line.number for line in lines_for(known_as, [str(path)])]

    assert named("10.0.0.2") == [2, 4, 5, 10]
    assert named("10.0.0.9") == [4, 10]  # the ! pattern leaves it out of line 5
    assert named("[10.0.0.2]:2222") == [6]  # a port's brackets are no character class
    assert named("10.0.0.4") == [4, 5, 7, 10]
    assert named("node-b") == [8]
    assert named("10.0.0.5") == [4, 5, 9, 10]
    assert named("10.0.0.10") == [4, 5]
    assert named("tpu.4001-0") == []
