"""Issue 27, secrets and host keys: what a local user or a host with a forged key could get.

A secret written under `env:` in a spec that sits in its workdir, the TPU SSH key podrun makes, and a
host that the user's own ~/.ssh/known_hosts knows by another key.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

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
