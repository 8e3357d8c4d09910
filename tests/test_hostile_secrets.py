"""Issue 27, secrets and host keys: what a local user or a host with a forged key could get.

A secret written under `env:` in a spec that sits in its workdir, the TPU SSH key podrun makes, and a
host that the user's own ~/.ssh/known_hosts knows by another key.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from conftest import REPO, podrun

# records, at every audit event while ensure_key_pair runs, the mode of the key file if it exists by then
KEY_MODES_WATCHED = """
import os, sys
from pathlib import Path
from podrun.transport.ssh import ensure_key_pair
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
    result = podrun("exec", spec)
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
