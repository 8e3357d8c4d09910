"""`podrun supervisor install`: make this host run `podrun supervisor start` (adopt.py) at every boot,
so that the jobs it keeps are adopted again after its VM rebooted (a GCE maintenance event, a crash).

Where systemd runs this user's manager, a user unit (~/.config/systemd/user/UNIT), enabled, with
lingering on (`loginctl enable-linger`: the user's manager starts at boot, with no login); else a
crontab `@reboot` line, marked as podrun's (installed again, it replaces the old one). It says which.
Secrets a restart needs (the spec's secret_env) come from ENV_FILE, which the user writes: the unit
reads it, the crontab line sources it.
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import subprocess
import sys

from podrun import paths
from podrun.errors import PodrunError
from podrun.output import say_success

UNIT = "podrun-supervisor.service"
CRON_MARK = "# podrun supervisor start at boot"
ENV_FILE = "supervisor.env"  # in PODRUN_HOME: KEY=VALUE lines, the secrets' values a restart needs


def install() -> int:
    command = [sys.executable, "-m", "podrun", "supervisor", "start"]
    env_file = os.path.join(paths.podrun_home(), ENV_FILE)
    paths.make_private_dir(paths.podrun_home())  # where the boot's line logs
    if _systemd_user():
        path = _write_unit(command, env_file)
        _run(["systemctl", "--user", "daemon-reload"])
        _run(["systemctl", "--user", "enable", UNIT])
        _run(["loginctl", "enable-linger", getpass.getuser()])
        say_success(f"wrote the systemd user unit {path}, enabled, with lingering on: it runs `podrun supervisor "
                    f"start` at every boot (secrets for restarts: {env_file})")
        return 0
    if shutil.which("crontab"):
        _write_crontab(command, env_file)
        say_success(f"added an @reboot line to {getpass.getuser()}'s crontab (no systemd user manager here): it "
                    f"runs `podrun supervisor start` at every boot (secrets for restarts: {env_file})")
        return 0
    raise PodrunError("neither a systemd user manager (systemctl --user) nor cron (crontab) is on this host: run "
                      "`podrun supervisor start` at its boot by other means")


def _systemd_user() -> bool:
    if not shutil.which("systemctl"):
        return False
    return subprocess.run(["systemctl", "--user", "show-environment"], capture_output=True).returncode == 0


def _environment() -> dict[str, str]:
    """What `supervisor start` needs of this environment at boot: where podrun keeps its jobs, and where this
    podrun is (a PYTHONPATH that makes it this one)."""
    return {key: os.environ[key] for key in ("PODRUN_HOME", "PYTHONPATH") if key in os.environ}


def _write_unit(command: list[str], env_file: str) -> str:
    directory = os.path.expanduser("~/.config/systemd/user")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, UNIT)
    lines = ["[Unit]", "Description=podrun: adopt again the jobs this host supervises", "After=network-online.target",
             "", "[Service]", "Type=oneshot", "RemainAfterExit=yes",
             "KillMode=process",  # the supervisors it forks outlive the unit's stop
             *(f"Environment={shlex.quote(f'{key}={value}')}" for key, value in _environment().items()),
             f"EnvironmentFile=-{env_file}", f"ExecStart={shlex.join(command)}", "",
             "[Install]", "WantedBy=default.target", ""]
    with open(path, "w") as handle:
        handle.write("\n".join(lines))
    return path


def _write_crontab(command: list[str], env_file: str) -> None:
    listed = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    kept = [line for line in listed.stdout.splitlines() if not line.endswith(CRON_MARK)] if listed.returncode == 0 else []
    assignments = " ".join(shlex.quote(f"{key}={value}") for key, value in _environment().items())
    log = os.path.join(paths.podrun_home(), "supervisor-start.log")
    env = shlex.quote(env_file)
    script = f"set -a; [ -r {env} ] && . {env}; set +a; exec {shlex.join(command)}"
    line = (f"@reboot {'env ' + assignments + ' ' if assignments else ''}sh -c {shlex.quote(script)}"
            f" >> {shlex.quote(log)} 2>&1 {CRON_MARK}")
    _run(["crontab", "-"], "\n".join([*kept, line]) + "\n")


def _run(argv: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise PodrunError(f"`{shlex.join(argv)}` failed ({said[-1] if said else f'exit {done.returncode}'})")
