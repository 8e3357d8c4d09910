"""Use the installed podrun once the way a new user does, and fail on any traceback or Python warning.

CI runs this first, in a bare virtualenv holding only `pip install .` (no test extras, no torch),
because a test dependency once hid a package podrun needs (the TPU commands crashed on a clean
install while the suite passed). It runs the `podrun` command on PATH from outside the clone, so
the installed package is what runs: every subcommand's --help, validate and --dry-run of every
spec in configs/, a real local job, jobs and logs, bad input, and create/list/describe/delete
against the Cloud TPU API stand-in the suite uses (tests/tpu_stand_in.py, started here as a
script). Its workers' addresses are documentation addresses (192.0.2.0/24): nothing here connects
to them.

The virtualenv holds the newest releases, as a user's does, where the suite runs against the lock
(.ci/constraints.txt). So when a release breaks podrun (a warning on its stderr, a crash), the failure
names the installed packages whose versions are not the lock's: the release to look at, in one line.

    python scripts/user_path.py        # with the virtualenv to check activated
    python scripts/user_path.py --lock FILE   # name the releases that differ from another lock
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CRASH_MARKS = ("Traceback (most recent call last)", "podrun: internal error:")
WARNING_LINE = re.compile(r"^.+:\d+: [\w.]*Warning: ", re.MULTILINE)  # warnings.formatwarning's first line
LOCK = REPO / ".ci" / "constraints.txt"
VENV_OWN = {"podrun", "pip", "setuptools", "wheel"}  # what pip freeze leaves out of the lock
STAND_IN_WORKERS = [f"192.0.2.{10 + i},198.51.100.{10 + i}" for i in range(4)]


class Check:
    def __init__(self, env: dict[str, str], cwd: Path):
        self.env, self.cwd = env, cwd
        self.failures: list[str] = []

    def run(self, *args: str, expect: int = 0, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
        """Run `podrun ARGS` (with `env` added to the environment); record a failure on a traceback or
        an unexpected exit code."""
        failures_before = len(self.failures)
        result = subprocess.run(["podrun", *args], capture_output=True, text=True, env={**self.env, **(env or {})},
                                cwd=self.cwd, input=stdin, timeout=120)
        output = result.stdout + result.stderr
        shown = " ".join(args)
        if any(mark in output for mark in CRASH_MARKS):
            self.failures.append(f"podrun {shown}: crashed:\n{output}")
        elif WARNING_LINE.search(result.stderr):
            self.failures.append(f"podrun {shown}: a Python warning on stderr:\n{result.stderr}")
        elif result.returncode != expect:
            self.failures.append(f"podrun {shown}: exit {result.returncode}, expected {expect}:\n{output}")
        print(f"{'ok' if len(self.failures) == failures_before else 'FAIL':>4}  podrun {shown}", flush=True)
        return output


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lock", type=Path, default=LOCK, help="the lock the releases are compared with")
    lock = parser.parse_args(argv).lock
    podrun = shutil.which("podrun")
    if podrun is None:
        print("user_path: no podrun on PATH; activate the virtualenv that holds `pip install .`")
        return 1
    with tempfile.TemporaryDirectory(prefix="podrun-user-path-") as scratch:
        scratch_dir = Path(scratch)
        env = {**os.environ, "PODRUN_HOME": str(scratch_dir / "home"), "HOME": str(scratch_dir),
               "CLOUDSDK_CONFIG": str(scratch_dir / "gcloud")}
        check = Check(env, scratch_dir)  # outside the clone: the installed package runs, not the source tree
        commands_and_specs(check, scratch_dir)
        with stand_in(env) as url:
            tpu_commands(check, env, url, scratch_dir)
        with stand_in(env, "--stall", "inf") as url:  # an API that never answers: one line after the timeout
            check.run("list", expect=1, env={"CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": f"{url}/", "PODRUN_API_TIMEOUT": "2"})
    print(f"user_path: {podrun}: " + ("no crash, no warning, every exit code as expected" if not check.failures else
                                      f"{len(check.failures)} problem(s)"))
    for failure in check.failures:
        print(f"\n{failure}")
    if check.failures:
        print(f"\nuser_path: {len(check.failures)} problem(s); {releases_off_the(lock)}")
    return 1 if check.failures else 0


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def releases_off_the(lock: Path) -> str:
    """The installed packages whose versions the suite has not proven (PEP 503 names), as one clause."""
    from importlib import metadata

    pins = (line.split("==", 1) for line in lock.read_text().splitlines() if "==" in line and not line.startswith("#"))
    locked = {canonical(name): version for name, version in pins}
    installed = {canonical(dist.metadata["Name"]): dist.version for dist in metadata.distributions()}
    off = [f"{name} {version} ({'lock ' + locked[name] if name in locked else 'not in the lock'})"
           for name, version in sorted(installed.items()) if name not in VENV_OWN and locked.get(name) != version]
    shown = lock.relative_to(REPO) if lock.is_relative_to(REPO) else lock
    if not off:
        return f"every installed release is the lock's ({shown}): the cause is in podrun"
    return f"releases that differ from the lock ({shown}): {', '.join(off)}"


def commands_and_specs(check: Check, scratch: Path) -> None:
    check.run("--help")
    check.run("--version")
    for command in ("create", "list", "describe", "delete", "exec", "ssh", "cp", "validate", "schema", "logs", "jobs",
                    "stop", "disk", "stacks"):
        check.run(command, "--help")
    check.run("schema")
    for config in sorted((REPO / "configs").glob("*.yaml")):
        check.run("validate", str(config))
        if "tpu:" not in config.read_text():  # the TPU spec's dry run reads its node: tpu_commands()
            check.run("exec", str(config), "--dry-run")
    job_dir = scratch / "job"
    job_dir.mkdir()
    (job_dir / "hello.yaml").write_text("run: echo hello from $PODRUN_WORKER\n")
    (job_dir / "typo.yaml").write_text("run: echo\ntarget: {local: {wrokers: 2}}\n")
    check.run("exec", str(job_dir / "hello.yaml"))
    check.run("jobs")
    check.run("logs")
    check.run("validate", str(job_dir / "typo.yaml"), expect=2)
    check.run("exec", str(job_dir / "absent.yaml"), expect=2)
    check.run("logs", "no-such-job", expect=1)
    check.run("exec", "--local", "2", "--", "echo", "ad hoc on $PODRUN_WORKER")
    check.run("cp", "--local", "2", str(job_dir / "hello.yaml"), ":hello.yaml")
    check.run("cp", "--local", "2", ":hello.yaml", str(scratch / "copies"))
    check.run("ssh", "--local", "2", "--worker", "1", "--", "cat hello.yaml")
    check.run("exec", "--local", "2", expect=2)
    check.run("stacks", expect=1)  # no job runs: one line
    check.run("exec", str(job_dir / "hello.yaml"), "--stall", "soon", expect=2)
    # a handover loads the SSH transport and builds this podrun's wheel from the installed package
    check.run("exec", str(job_dir / "hello.yaml"), "--supervisor", "root@127.0.0.1:1", expect=1)
    wheel_check = ("import sys, zipfile; from podrun.supervisor.wheel import build_wheel; "
                   "w = zipfile.ZipFile(build_wheel(sys.argv[1])); "
                   "m = next(n for n in w.namelist() if n.endswith('/METADATA')); "
                   "assert 'Requires-Dist: asyncssh' in w.read(m).decode(), m")
    built = subprocess.run([sys.executable, "-c", wheel_check, str(scratch / "wheels")], capture_output=True,
                           text=True, cwd=scratch)
    if built.returncode:
        check.failures.append(f"the wheel a supervisor host installs: {built.stderr.strip()}")


class stand_in:
    """tests/tpu_stand_in.py as a server process, for as long as the `with` block runs."""

    def __init__(self, env: dict[str, str], *options: str):
        self.env, self.options = env, options

    def __enter__(self) -> str:
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "tpu_stand_in.py"), "--hosts", *STAND_IN_WORKERS, "--delay", "0.2",
             *self.options], stdout=subprocess.PIPE, text=True, env=self.env)
        return self.process.stdout.readline().strip()  # it prints its URL once it listens

    def __exit__(self, *exc) -> None:
        self.process.kill()
        self.process.wait()


def tpu_commands(check: Check, env: dict[str, str], url: str, scratch: Path) -> None:
    token = scratch / "token"
    token.write_text("stand-in-token\n")
    env.update(CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU=f"{url}/", CLOUDSDK_AUTH_ACCESS_TOKEN_FILE=str(token),
               CLOUDSDK_CORE_PROJECT="user-path", CLOUDSDK_COMPUTE_ZONE="us-central2-b")
    check.run("create", "v4-32", "--name", "my-pod")
    check.run("list")
    check.run("describe", "my-pod")
    check.run("exec", str(REPO / "configs" / "tpu-hello.yaml"), "--dry-run")
    check.run("create", "v4-8", "--name", "my-pod", expect=1)  # exists already: Google's 409, one line
    check.run("describe", "absent", expect=1)
    check.run("delete", "my-pod", "--yes")
    check.run("create", "v4-8", "--name", "inside", "--internal-ips")
    check.run("delete", "inside", "--yes")
    check.run("create", "v9-8", expect=2)
    check.run("create", "v5e-8", expect=2)  # did you mean v5litepod-8


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
