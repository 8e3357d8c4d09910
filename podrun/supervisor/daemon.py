"""The supervisor host's side of a handover: `podrun _supervise`, which handover.py starts over SSH.

After the greeting (greeting.py: the version the laptop wants, answered before podrun loads), it
reads the job from stdin (one JSON line: the spec's fields, the exec flags as the laptop's CLI
parsed them (launch/exec_options.py), the environment the job needs from the launcher: secret values,
the API endpoint, podrun's settings) with the launcher's known-hosts lines for the job's hosts (public
keys: a host's key that matched one is kept in this host's podrun known-hosts file, as one seen on
first use would be). It keeps all of it but the secrets' values in the job's directory (RESUME_FILE),
and forks the job's launcher into a session of its own, so that it outlives the SSH session: the
laptop may close. That launcher is a detached `podrun exec` of this host's (launch/run_here.py) whose
job is kept (launch/kept.py): it creates the TPU and starts the run; a supervisor process it forks
follows the run, restarts and deletes as the spec says, and keeps the job's record and every worker's
log in this host's job store. The job outlives that process too: its workers go on under their own
watch, and `podrun supervisor start` adopts it again (adopt.py).
What they print goes to files in the job's own directory, PODRUN_HOME/jobs/<id>/console/: they go with
the job's record. A job that ends before its record begins (its TPU could not be made) leaves nothing.

The process started over SSH relays those files to the laptop (stdout to stdout, stderr to stderr),
after a first stdout line `{"job": ID}`, until the run has started (--detach) or the job has ended;
it exits with the job's exit code. A line `interrupt` on its stdin is the laptop's Ctrl-C: the
launcher, or once it is done the supervisor, gets SIGINT, and stops the job and cleans up as after
Ctrl-C at its own terminal.
"""

from __future__ import annotations

import io
import json
import os
import select
import shutil
import signal
import sys
from pathlib import Path

from podrun import exits, jobstore, paths
from podrun.errors import PodrunError
from podrun.launch import kept
from podrun.launch.exec_options import ExecOptions
from podrun.launch.run_here import run_here
from podrun.output import say
from podrun.spec.model import JobSpec
from podrun.spec.problems import FieldProblems, SpecProblems, validate_fields
from podrun.transport import known_hosts

INTERRUPT = b"interrupt\n"
RUNNING = b"r"  # the launcher tells the relay that run has started everywhere
POLL_S = 0.1
READ_SIZE = 1 << 16


def main(pending: bytes) -> int:
    """`pending`: what the laptop sent after its wanted version (greeting.py), the job's start."""
    payload_line, more = _read_line(0, pending)
    payload = json.loads(payload_line)
    spec = spec_of(payload)
    # the job runs detached here, whatever the laptop asked: the laptop's --detach is how long it waits
    detach = payload["options"]["detach"]
    options = ExecOptions(**{**payload["options"], "supervisor": None, "detach": True})
    os.environ.update(payload["environ"])
    known_hosts.take_handed_over(payload["known_hosts"])
    if options.dry_run:
        return run_here(spec, payload["ships_code"], options)
    job_id = payload.get("job_id")  # the laptop's, recorded there before it handed the job over
    if not (isinstance(job_id, str) and jobstore.is_job_id(job_id, spec.name)) or os.path.exists(console_dir(job_id)):
        job_id = jobstore.new_job_id(spec.name)
    console = console_dir(job_id)
    paths.make_private_dir(console)
    _keep_for_adoption(os.path.dirname(console), payload, spec)
    running_read, running_write = os.pipe()
    launcher = os.fork()
    if launcher == 0:  # returns through the CLI, which says an error in one line and exits with its code
        os.close(running_read)
        return _launch(spec, payload["ships_code"], options, job_id, console, running_write, payload["host"], detach)
    os.close(running_write)
    _write_line(sys.stdout.buffer, json.dumps({"job": job_id, "launcher": launcher, "console": console}).encode())
    return _relay(launcher, console, running_read, detach, more)


def _keep_for_adoption(job_dir: str, payload: dict, spec: JobSpec) -> None:
    """What a supervisor started anew needs to adopt the job (adopt.py): the handover, less every secret's
    value (the spec's env and --env values of secret keys, secret_env's values from the laptop): those keys
    are secret_env's there, which a restart takes from that supervisor's environment. The webhook's URL is
    a secret too: notify.url_env's value is left out as secret_env's are, and a notify.url written in the
    spec is not kept at all (adopt.py says so). Less the known-hosts lines too: they are taken already."""
    fields, options = dict(payload["spec"]), dict(payload["options"])
    written = {key for key in {**spec.env, **options["env"]} if spec.is_secret(key)}
    fields["env"] = {key: value for key, value in spec.env.items() if key not in written}
    fields["secret_env"] = sorted({*spec.secret_env, *written})
    options["env"] = {key: value for key, value in options["env"].items() if key not in written}
    taken = {*fields["secret_env"], *([spec.notify.url_env] if spec.notify and spec.notify.url_env else [])}
    environ = {key: value for key, value in payload["environ"].items() if key not in taken}
    unkept = bool(spec.notify and spec.notify.url)
    if unkept:
        del fields["notify"]
    jobstore.write_json(os.path.join(job_dir, kept.RESUME_FILE),
                        {**payload, "spec": fields, "options": options, "environ": environ, "known_hosts": [],
                         "notify_unkept": unkept})


def console_dir(job_id: str) -> str:
    """Where a supervised job's launcher writes what it prints (stdout, stderr): in its job's directory,
    made before its record (jobstore.JobRecord.create)."""
    return os.path.join(paths.jobs_dir(), job_id, "console")


def spec_of(payload: dict) -> JobSpec:
    """The spec's fields as the laptop validated them; its workdir is the code shipped here."""
    path = Path(payload["spec_path"])
    try:
        spec = validate_fields(payload["spec"])
    except FieldProblems as error:  # a podrun of another version would not get this far (install.py)
        raise SpecProblems(path, error.problems) from None
    spec = spec.model_copy(update={"workdir": os.path.expanduser(spec.workdir)})
    key = spec.ssh.identity_file
    if key and not os.path.exists(os.path.expanduser(key)):
        say(f"ssh.identity_file: {key} is not on the supervisor {payload['host']}; it uses a key of its own "
            f"(a TPU's is added to the TPU's metadata; hosts must accept the supervisor's ~/.ssh/id_* keys)")
        spec = spec.model_copy(update={"ssh": spec.ssh.model_copy(update={"identity_file": None})})
    known = spec.ssh.known_hosts
    if known and not os.path.exists(os.path.expanduser(known)):  # what it holds for the job's hosts came along
        spec = spec.model_copy(update={"ssh": spec.ssh.model_copy(update={"known_hosts": None})})
    spec._path = path
    return spec


def _launch(spec: JobSpec, ships_code: bool, options: ExecOptions, job_id: str, console: str, running: int,
            host: str, detach: bool) -> int:
    """The forked launcher: in a session of its own, printing into the console files."""
    os.setsid()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        os.dup2(os.open(os.path.join(console, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), fd)
    for stream in (sys.stdout, sys.stderr):  # each line in its file as it is said: the laptop relays them
        assert isinstance(stream, io.TextIOWrapper)
        stream.reconfigure(line_buffering=True)

    def on_running() -> None:
        try:
            os.write(running, RUNNING)
        except OSError:  # the relay is gone (the laptop closed): nobody waits for it
            pass
        os.close(running)  # not the supervisor's to inherit: the relay reads the launcher's end from its end
        if detach:  # nobody follows the console from now on: the workers' lines are in their logs already
            sys.stdout.flush()
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)

    job_dir = os.path.dirname(console)
    kept.take_lock(job_dir)  # its supervisor inherits it
    try:
        return run_here(spec, ships_code, options, job_id, on_running, kept.Kept.here(shows_output=not detach))
    except PodrunError as error:  # the laptop shows it: where it happened is not where it was said
        error.args = (f"on the supervisor {host}: {error}",)
        raise
    finally:
        if not os.path.exists(os.path.join(job_dir, jobstore.RECORD_FILE)):  # it never began: none to adopt
            kept.forget(job_dir)


def _relay(launcher: int, console: str, running: int, detach: bool, pending: bytes) -> int:
    """Copy the console files to our stdout and stderr until the launcher ends (its exit code) or, with
    `detach`, until run has started (0); pass the laptop's interrupts on."""
    tails = [_Tail(os.path.join(console, name), stream) for name, stream in (("stdout", sys.stdout.buffer),
                                                                               ("stderr", sys.stderr.buffer))]
    job_dir = os.path.dirname(console)
    job = _Job(launcher, job_dir)
    inputs = [running, 0]
    job.interrupt(pending)
    while job.goes_on():
        ready, _, _ = select.select(inputs, [], [], POLL_S)
        for tail in tails:
            tail.copy()
        if 0 in ready:
            data = os.read(0, READ_SIZE)
            if data:
                job.interrupt(data)
            else:
                inputs.remove(0)  # the laptop closed its side: the job goes on
        if running in ready:
            if os.read(running, 1) == b"":  # the launcher ended: its supervisor, if it forked one, goes on
                inputs.remove(running)
                job.launcher_ended()
            elif detach:
                return 0
    for tail in tails:
        tail.copy()
    if not os.path.exists(os.path.join(job_dir, jobstore.RECORD_FILE)):  # said to the laptop: no job to keep it for
        shutil.rmtree(job_dir, ignore_errors=True)
    return job.exit_code()


class _Job:
    """The job the relay waits for: its launcher (this process's child), then the supervisor it forked."""

    def __init__(self, launcher_pid: int, job_dir: str):
        self.launcher_pid, self.job_dir = launcher_pid, job_dir
        self.launcher_code: int | None = None
        self.follower: dict | None = None  # the supervisor's process identity, once the launcher forked it

    def launcher_ended(self) -> None:
        _, status = os.waitpid(self.launcher_pid, 0)
        code = os.waitstatus_to_exitcode(status)
        self.launcher_code = code if code >= 0 else 128 - code
        record = self._record()
        if record and record.state == jobstore.RUNNING:
            self.follower = record.live_supervisor()

    def goes_on(self) -> bool:
        if self.launcher_code is None:
            return True
        return self.follower is not None and jobstore.is_alive(self.follower)

    def interrupt(self, data: bytes) -> None:
        for _ in range(data.count(INTERRUPT)):
            if self.launcher_code is None:
                os.kill(self.launcher_pid, signal.SIGINT)
            elif self.follower is not None:
                os.kill(self.follower["pid"], signal.SIGINT)

    def exit_code(self) -> int:
        """The job's, once its supervisor ended; else the launcher's."""
        record = self._record() if self.follower else None
        if record is None or record.exit_code is None:
            return self.launcher_code if self.launcher_code is not None else exits.LOST
        return record.exit_code

    def _record(self) -> jobstore.JobRecord | None:
        return jobstore.load_if_there(os.path.basename(self.job_dir))


class _Tail:
    """A console file, copied as it grows."""

    def __init__(self, path: str, stream):
        self.path, self.stream, self.offset = path, stream, 0

    def copy(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                while chunk := handle.read(READ_SIZE):
                    self.stream.write(chunk)
                    self.offset += len(chunk)
        except FileNotFoundError:
            return
        self.stream.flush()


def _read_line(fd: int, data: bytes) -> tuple[bytes, bytes]:
    """The first line of `data` and what `fd` gives after it, and what came after that line, read
    unbuffered: the relay reads on."""
    while b"\n" not in data:
        chunk = os.read(fd, READ_SIZE)
        if not chunk:
            raise PodrunError("the job's description ended early (the handover was cut off)")
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line, rest


def _write_line(stream, line: bytes) -> None:
    stream.write(line + b"\n")
    stream.flush()
