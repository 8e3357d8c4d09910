"""What the benchmarks share: timing a command, a job spec for lab hosts, a markdown table."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from lab import BRIDGE, Lab, require_lab_tools  # noqa: E402,F401  (re-exported for the benchmarks)


def timed(command: list[str] | str, env: dict | None = None) -> float:
    """Seconds a command takes as a whole process (a string runs through the shell)."""
    return timed_with_cpu(command, env)[0]


def timed_with_cpu(command: list[str] | str, env: dict | None = None) -> tuple[float, float, float]:
    """Seconds, the CPU seconds of the command's own processes (the launcher side), and the CPU
    seconds of the whole machine (every lab host's sshd and processes included)."""
    own_before, machine_before = _children_cpu_seconds(), busy_cpu_seconds()
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                   shell=isinstance(command, str))
    return (time.perf_counter() - started, _children_cpu_seconds() - own_before,
            busy_cpu_seconds() - machine_before)


def busy_cpu_seconds() -> float:
    """CPU time this machine (every lab host included) spent on anything but idling, so far."""
    user, nice, system, idle, iowait, irq, softirq = map(int, Path("/proc/stat").read_text().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def podrun_at(revision: str, folder: Path) -> Path:
    """`folder`, holding podrun/ as it was at git `revision` (git archive), to run with PYTHONPATH=folder and
    `python -P` (which keeps the current directory, this checkout perhaps, off sys.path)."""
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(repo), "archive", revision, "podrun"], check=True, capture_output=True)
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def all_at_once(commands: list[str]) -> str:
    """A shell script running the commands in parallel that fails if any of them fails (a plain
    `a & b & wait` would hide a failed contender behind a fast time)."""
    started = "".join(f"{command} & pids=\"$pids $!\"\n" for command in commands)
    return f"pids=\n{started}for pid in $pids; do wait $pid || exit 1; done"


def write_lab_spec(path: Path, lab: Lab, workdir: str, run: str, hosts=None) -> Path:
    """A spec on `hosts` (default: all of the lab's)."""
    path.write_text(f"target: {{hosts: [{', '.join(h.ip for h in hosts or lab.hosts)}]}}\n"
                    f"ssh: {{user: root, identity_file: {lab.client_key}}}\n"
                    f"workdir: {workdir}\nrun: '{run}'\n")
    return path


def stand_in_env(work: Path, url: str) -> dict[str, str]:
    """podrun's and gcloud's environment for the Cloud TPU API stand-in serving at `url`, with their
    state (podrun's home, gcloud's config, the user's home) under `work`."""
    (work / "token").write_text("token")
    (work / "user-home").mkdir(exist_ok=True)
    return {**os.environ, "PODRUN_HOME": str(work / "home"), "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": f"{url}/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{url}/compute/v1/",
            "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(work / "token"), "CLOUDSDK_CONFIG": str(work / "gcloud"),
            "CLOUDSDK_CORE_PROJECT": "bench", "CLOUDSDK_COMPUTE_ZONE": "us-central2-b",
            "HOME": str(work / "user-home"), "NO_GCE_CHECK": "True"}


def print_table(title: str, columns: list[str], rows: dict[str, list[str]]) -> None:
    print(title)
    print("| " + " | ".join(columns) + " |")
    print("| --- |" + " ---: |" * (len(columns) - 1))
    for label, cells in rows.items():
        print(f"| {label} | " + " | ".join(cells) + " |")
