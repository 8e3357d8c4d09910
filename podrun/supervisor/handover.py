"""Handing a job to a supervisor host (`exec --supervisor HOST`, the spec's `supervisor:`): the laptop
connects to HOST as to any SSH host (the spec's ssh: settings, ~/.ssh/config, podrun's host-key
rules), starts `podrun _supervise` (daemon.py) there, and once that podrun has answered that it is of
this version (greeting.py) sends the job on its stdin; the code ships to HOST's code store meanwhile,
once, as to a worker. Which podrun: the one this laptop found there before (early.py, which starts it
while this podrun loads the spec), else the one install.py finds or installs. HOST runs the job's
whole life from then on; the laptop keeps a pointer to the record HOST keeps (jobstore's `supervised_by`).

What travels: the spec's fields, the exec flags, and from this machine's environment only what the
job's plan takes from it (secret_env values) and what says which API to use: the project, zone and
endpoints (TPU, Compute, OS Login) podrun resolved here, and podrun's own settings. Never an access
token, a key, a gcloud credential or account: HOST uses its own. Everything goes over the channel's
stdin, never in a file or on a command line. With it go the public host keys this machine's
known-hosts files hold for the spec's SSH hosts: HOST checks them against these, not trusting on
first use what this machine knows.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import sys

from podrun import __version__, exits, jobstore, settings
from podrun.cloud.settings import COMPUTE_ENDPOINT, OSLOGIN_ENDPOINT, PROJECT, TPU_ENDPOINT, ZONE, gcloud_property
from podrun.errors import PodrunError, UsageError
from podrun.launch.exec_options import ExecOptions
from podrun.notify import url_from_launcher
from podrun.output import say, say_failure, say_success
from podrun.paths import remote_code_dir
from podrun.plan import secrets_from_launcher
from podrun.shipping import archive, scan
from podrun.spec.fields import HOST_FORMS, parse_host, parse_jumps
from podrun.spec.model import JobSpec
from podrun.supervisor import answers, early, greeting, install, remote
from podrun.targets.base import Worker, target_for
from podrun.transport import known_hosts, past_login
from podrun.transport.base import Channel, ChannelLost, Transport
from podrun.transport.ssh import SshTransport, host_transport, known_as_of

# which APIs to use; never the account, which is the host's own (as its credentials are)
GCLOUD_SETTINGS = (PROJECT, ZONE, TPU_ENDPOINT, COMPUTE_ENDPOINT, OSLOGIN_ENDPOINT)


def hand_over(spec: JobSpec, host: str, tree: scan.Tree | None, options: ExecOptions,
              begun: early.Begun | None = None) -> int:
    """Run the job on `host`'s podrun; returns the job's exit code (0 once run started, with --detach).
    `begun`: the handover begun before the spec was loaded (early.py), taken if it reaches `host` as the
    spec does."""
    transport = supervisor_transport(spec, host, "--supervisor" if options.supervisor else "supervisor.host")
    payload = _payload(spec, host, tree, options)
    configured = spec.supervisor.podrun if spec.supervisor else None
    if begun is not None and not begun.serves(host, configured, _endpoint(transport)):
        begun.close()
        begun = None
    if begun is not None:
        begun.taken = True
    loop = begun.loop if begun else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(_hand_over(spec, host, begun.transport if begun else transport, tree, payload,
                                                  options, begun))
    finally:  # what asyncio.run does last
        if pending := asyncio.all_tasks(loop):
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()


def supervisor_transport(spec: JobSpec, host: str, named_by: str) -> SshTransport:
    """The SSH transport to the supervisor host, as to any of the spec's hosts."""
    try:
        user, address, port = parse_host(host)
    except ValueError:
        raise UsageError(f"{named_by} {host!r}: expected {HOST_FORMS}") from None
    return host_transport(spec.ssh, user, address, port)


def _payload(spec: JobSpec, host: str, tree: scan.Tree | None, options: ExecOptions) -> dict:
    fields = spec.model_dump(mode="json", by_alias=True, exclude={"supervisor"}, exclude_none=True)
    fields["workdir"] = f"~/{remote_code_dir(spec.name, tree.digest)}" if tree else "~"
    environ = {**secrets_from_launcher(spec, os.environ), **url_from_launcher(spec, os.environ),
               **{key: os.environ[key] for key in settings.handed_over() if key in os.environ},
               **{f"CLOUDSDK_{section}_{key}".upper(): value for section, key in GCLOUD_SETTINGS
                  if (value := gcloud_property((section, key)))}}
    return {"host": host, "spec": fields, "spec_path": str(spec.path), "ships_code": tree is not None,
            "options": {**vars(options), "supervisor": None}, "environ": environ,
            "known_hosts": known_hosts.for_handover(_known_as(spec), spec.ssh.known_hosts)}


def _known_as(spec: JobSpec) -> list[str]:
    """The names the known-hosts files know the spec's SSH hosts and the jump hosts on their way by (a
    TPU's workers publish their keys; the jump hosts of spec.ssh.proxy_jump on the way to them do not)."""
    hosts = [host_transport(spec.ssh, *parse_host(entry)) for entry in target_for(spec).ssh_hosts()]
    jumps = parse_jumps(spec.ssh.proxy_jump) if spec.ssh.proxy_jump else []
    return [*(name for host in hosts for name in host.route_known_as()), *known_as_of(jumps)]


async def _hand_over(spec: JobSpec, host: str, transport: Transport, tree: scan.Tree | None, payload: dict,
                     options: ExecOptions, begun: early.Begun | None) -> int:
    record: jobstore.JobRecord | None = None  # the job's pointer here, made before the host may begin anything of it
    try:
        if begun is None:
            await remote.connect(transport, host)
        # the code goes to the supervisor's store while its podrun starts
        shipped = asyncio.ensure_future(_ship(transport, host, tree, spec.name)) if tree is not None else None
        try:
            podrun, channel = await _supervise(transport, host, spec.supervisor.podrun if spec.supervisor else None,
                                               begun)
        finally:
            if shipped is not None:
                await shipped
        if options.dry_run:
            channel.stdin.write(json.dumps(payload).encode() + b"\n")
            return await remote.relay(channel, options.raw, stdout_begun=True)
        # the job's id chosen and recorded here first: once the host has the job it may make a TPU and bill it,
        # and `podrun jobs` shows it (`on HOST`) whatever becomes of the link from here on
        supervisor = {"host": host, "endpoint": transport.endpoint(), "podrun": podrun}
        record = _pointer(spec, jobstore.new_job_id(spec.name), supervisor, options.detach)
        job_id = record.id
        channel.stdin.write(json.dumps({**payload, "job_id": job_id}).encode() + b"\n")
        started = await channel.stdout.readline()
        if not started:  # it refused the job before starting it (its one line says why), or the link broke
            refused = await remote.relay(channel, stdout_begun=True)
            shutil.rmtree(record.dir)
            return refused
        try:
            job_id, console = answers.started(started, host, spec.name)
        except answers.Refused:
            shutil.rmtree(record.dir)  # nothing of a job the host named wrongly is kept
            raise
        if job_id != record.id:  # the host's store held the id handed over: the pointer takes the host's
            shutil.rmtree(record.dir)
            record = _pointer(spec, job_id, supervisor, options.detach)
        say(f"job {job_id}: handed over to the supervisor {host}, which keeps its record and logs (what podrun says "
            f"there: {os.path.join(console, 'stderr')}); this machine may close once it runs")
        code = await _follow(channel, host, job_id, options.raw)
        if code is None:  # the link broke: the job goes on there, as far as anyone here knows
            return exits.LOST
        if options.detach and code == 0:  # the next `podrun jobs` reads the record there (a podrun started: 0.15 s)
            remote.recorded(record, supervisor)
            say_success(f"job {job_id} runs under the supervisor {host}; follow it with `podrun logs -f {job_id}`, "
                        f"stop it with `podrun stop {job_id}`")
            return code
        if not await remote.refresh_one(record, supervisor, transport) and code != 0:
            shutil.rmtree(record.dir)  # it failed before its job began there (no TPU API, a worker refused it)
        return code
    except ChannelLost as lost:  # before the job's console began (its check, its code, its start)
        if record is None:
            raise PodrunError(f"supervisor {host}: the link broke ({lost})") from None
        say_failure(f"the link to the supervisor {host} broke as it took job {record.id} ({lost}); it may run there "
                    f"(and make its TPU): `podrun jobs` shows it, on {host}, until the host answers; "
                    f"`podrun stop {record.id}` stops it")
        return exits.LOST
    finally:
        await transport.close()


async def _supervise(transport: Transport, host: str, configured: str | None,
                     begun: early.Begun | None) -> tuple[str, Channel]:
    """`podrun _supervise` started on the host, past its answer that it is of this version (greeting.py):
    its path there and its channel, ready for the job. The one begun early, else the podrun this laptop
    found there last time, is started at once; the host is asked for one (install.py) only if that one
    does not answer so."""
    known = early.remembered(host, configured)
    if begun is not None:
        if await _answer(begun.channel) == greeting.this_version():
            return begun.podrun, begun.channel
    elif known is not None:
        channel = await early.start(transport, known["podrun"])
        if await _answer(channel) == greeting.this_version():
            return known["podrun"], channel
    podrun = await install.podrun_on_host(transport, host, configured)
    channel = await early.start(transport, podrun)
    answer = await _answer(channel)
    if answer != greeting.this_version():
        raise PodrunError(f"supervisor {host}: {podrun} there says it is {greeting.this_version()} (--version), but "
                          f"`{podrun} _supervise` answered {answer or 'nothing'} to the handover; install "
                          f"podrun {__version__} there")
    early.remember(host, configured, podrun, _endpoint(transport))
    return podrun, channel


async def _answer(channel: Channel) -> str | None:
    """The version `_supervise` answered (None: it said nothing so, such as a shell that found no such
    podrun, or a podrun from before greeting.py)."""
    if await past_login.past_login(channel.stdout):  # its shell failed before it ran podrun
        return None
    return greeting.answered(await channel.stdout.readline())


def _endpoint(transport: Transport) -> dict:
    """How the laptop reaches the host, as early.remember keeps it (JSON)."""
    return json.loads(json.dumps(transport.endpoint()))


async def _ship(transport: Transport, host: str, tree: scan.Tree, name: str) -> None:
    """The code, to the supervisor's code store, unless it has it already; from there it ships to the workers."""
    directory = remote_code_dir(name, tree.digest)
    check = await transport.start(f"test -d {shlex.quote(directory)}")
    check.stdin.write_eof()
    if await check.wait() != 0:
        await archive.ship(tree, remote_code_dir(name, tree.digest), [Worker(0, host, "", transport)])


def _pointer(spec: JobSpec, job_id: str, supervisor: dict, detached: bool) -> jobstore.JobRecord:
    """The record here of a job handed to `supervisor` ({host, endpoint, podrun}: remote.forward)."""
    record = jobstore.JobRecord(id=job_id, name=spec.name, target=spec.target.kind, spec_path=str(spec.path),
                                workers=[], detached=detached, supervised_by=supervisor)
    record.create()
    return record


async def _follow(channel, host: str, job_id: str, raw: bool) -> int | None:
    """The job's console until it ends (or runs, detached): its exit code, None if the link broke.
    Ctrl-C goes to the supervisor as an interrupt. `raw`: its stdout as it is (remote.relay)."""
    loop = asyncio.get_running_loop()

    def interrupt() -> None:
        say(f"interrupt: the supervisor {host} stops the job and cleans up")
        try:
            channel.stdin.write(b"interrupt\n")
        except ChannelLost:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupt)
    try:
        status = await remote.relay_status(channel, raw, stdout_begun=True)
        if status < 0:  # killed there (`kill -9`, a reboot): the job is not over
            say(f"podrun on the supervisor {host} was killed ({signal.Signals(-status).name}); job {job_id} goes on "
                f"under its workers' watch, and `podrun supervisor start` there adopts it again (README: the "
                f"supervisor's life)")
            return None
        return status
    except ChannelLost as lost:
        say(f"the link to the supervisor {host} broke ({lost}); job {job_id} goes on there: `podrun logs -f {job_id}` "
            f"follows it, `podrun stop {job_id}` stops it (if the host rebooted, `podrun supervisor start` there adopts "
            f"it again)")
        return None
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        sys.stdout.flush()
