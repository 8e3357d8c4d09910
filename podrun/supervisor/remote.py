"""A supervised job from the laptop: `podrun logs`, `stop` and `stacks` run the same command on the
job's supervisor host (its podrun, over SSH) and show what it prints, made harmless for the terminal
as the workers' output is (escapes.py: a host's word is not trusted); `podrun jobs` reads the state
there, within REFRESH_TIMEOUT_S, and keeps it in the laptop's pointer record: a supervisor that does
not answer leaves its jobs as last known, read `running (on HOST, supervisor unreachable)`, with one
line, and asked again the next time; a job it kept a record of once and keeps none of now (removed
there) reads `lost`, and says so. Its podrun runs past what the host's
login prints (transport/past_login.py), and what it says is checked (answers.py)."""

from __future__ import annotations

import asyncio
import json
import sys

from podrun import escapes, exits, jobstore
from podrun.errors import PodrunError
from podrun.output import colour_wanted, counted, say
from podrun.supervisor import answers, warm
from podrun.transport import past_login, transport_for
from podrun.transport.base import Channel, ChannelLost, Transport

REFRESH_TIMEOUT_S = 10  # as for a detached job's workers (launch/detached.py)
# in a pointer's supervised_by: its supervisor has recorded the job (it was read there, or its run started)
RECORDED = "recorded"
READ_SIZE = 1 << 16


async def connect(transport: Transport, host: str) -> None:
    try:
        await transport.connect()
    except PodrunError as error:
        raise PodrunError(f"supervisor {host}: {error}") from None


def forward(record: jobstore.JobRecord, supervisor: dict, argv: list[str], raw: bool = False) -> int:
    """Run `podrun ARGV` on the record's `supervisor` ({host, endpoint, podrun}: handles/supervisor_host.py),
    showing its output (its stdout as it is, with `raw`); its exit code. A running job's record is read again
    afterwards (a stop or the end that `logs -f` saw changed it)."""
    async def run() -> int:
        transport = transport_for(supervisor["endpoint"])
        try:
            await connect(transport, supervisor["host"])
            channel = await transport.start(_podrun_command(supervisor, argv))
            channel.stdin.write_eof()
            code = await relay(channel, raw)
            if record.state == jobstore.RUNNING:
                await refresh_one(record, supervisor, transport)
            return code
        except ChannelLost as lost:
            raise PodrunError(f"supervisor {supervisor['host']}: the link broke ({lost})") from None
        finally:
            await transport.close()

    return asyncio.run(run())


async def relay(channel: Channel, raw: bool = False, stdout_begun: bool = False) -> int:
    """Copy a begun() command's stdout and stderr to ours as they come, past what the host's login printed
    (stdout's from where it is, if `stdout_begun`), made harmless for the terminal (stdout as it is, with
    `raw`: the workers' output the user asked for so; stderr is podrun's words, never raw); its exit code
    as a shell gives it."""
    return exits.of_process(await relay_status(channel, raw, stdout_begun))


async def relay_status(channel: Channel, raw: bool = False, stdout_begun: bool = False) -> int:
    """relay(), returning the command's status as the channel gives it: -N where signal N ended it."""
    async def copy(source, target, begun: bool, raw: bool) -> None:
        shown = None if raw else escapes.Stream(colour_wanted(target))
        chunk = b"" if begun else await past_login.past_login(source)
        while True:
            target.write(shown.feed(chunk) if shown else chunk)
            target.flush()
            if not (chunk := await source.read(READ_SIZE)):
                break
        if shown:
            target.write(shown.end())
            target.flush()

    await asyncio.gather(copy(channel.stdout, sys.stdout.buffer, stdout_begun, raw),
                         copy(channel.stderr, sys.stderr.buffer, False, False))
    return await channel.wait()


def reread(record: jobstore.JobRecord, supervisor: dict) -> None:
    """The pointer's fields as its supervisor keeps them now, whatever the job's state (`podrun report`)."""
    async def run() -> None:
        transport = transport_for(supervisor["endpoint"])
        try:
            await connect(transport, supervisor["host"])
            await refresh_one(record, supervisor, transport)
        except ChannelLost as lost:
            raise PodrunError(f"supervisor {supervisor['host']}: the link broke ({lost})") from None
        finally:
            await transport.close()

    asyncio.run(run())


def refresh(pointers: list[tuple[jobstore.JobRecord, dict]]) -> set[str]:
    """Bring running supervised jobs' pointers up to date from their supervisors (each pointer with its
    supervisor, as forward() takes it), one connection each; the ids of those whose supervisor could not
    be asked (their pointers are left as they were)."""
    by_host: dict[str, list[tuple[jobstore.JobRecord, dict]]] = {}
    unreachable: set[str] = set()
    for record, supervisor in pointers:
        by_host.setdefault(supervisor["host"], []).append((record, supervisor))

    async def refresh_host(host: str, pointers: list[tuple[jobstore.JobRecord, dict]]) -> None:
        transport = transport_for(pointers[0][1]["endpoint"])
        try:
            await asyncio.wait_for(_refresh_all(transport, host, pointers), REFRESH_TIMEOUT_S)
        except (PodrunError, ChannelLost, asyncio.TimeoutError) as error:
            unreachable.update(record.id for record, _ in pointers)
            say(f"supervisor {host}: {counted(len(pointers), 'job')} shown as last known; it could not be asked "
                f"({str(error) or f'no answer within {REFRESH_TIMEOUT_S}s'})")
        finally:
            await transport.close()

    async def refresh_all() -> None:
        await asyncio.gather(*(refresh_host(host, pointers) for host, pointers in by_host.items()))

    if by_host:
        asyncio.run(refresh_all())
    return unreachable


async def _refresh_all(transport: Transport, host: str, pointers: list[tuple[jobstore.JobRecord, dict]]) -> None:
    await connect(transport, host)
    for record, supervisor in pointers:
        try:
            await refresh_one(record, supervisor, transport)
        except answers.Refused as refused:  # that job stays as last known; the others are read on
            say(f"{refused}, shown as last known")


async def refresh_one(record: jobstore.JobRecord, supervisor: dict, transport: Transport) -> bool:
    """The pointer's fields from the record its supervisor keeps (`podrun jobs --json ID` there); False
    if it keeps none (yet)."""
    channel = await transport.start(_podrun_command(supervisor, ["jobs", "--json", record.id]))
    channel.stdin.write_eof()

    async def output() -> bytes:
        await past_login.past_login(channel.stdout)
        return await channel.stdout.read()

    printed, _, _ = await asyncio.gather(output(), channel.stderr.read(), channel.wait())
    try:
        listed = [job for job in json.loads(printed) if job["id"] == record.id]
    except (ValueError, TypeError, KeyError):
        raise PodrunError(f"supervisor {supervisor['host']}: `podrun jobs --json` gave no job list") from None
    if not listed and supervisor.get(RECORDED):  # removed there: nothing will ever end it
        say(f"supervisor {supervisor['host']}: job {record.id} has no record there any more; it reads {jobstore.LOST}")
        record.finish(jobstore.LOST, exits.LOST, f"the supervisor {supervisor['host']} has no record of it")
        return False
    if not listed:  # not recorded yet: its TPU is being created, or the handover failed before the job began
        return False
    record.take_fields(answers.record(listed[0], record.id, supervisor["host"]))
    supervisor[RECORDED] = True
    supervisor[jobstore.SUPERVISOR_NOTES] = listed[0].get("notes") or []  # checked with the record: a list of texts
    record.save()
    return True


def recorded(record: jobstore.JobRecord, supervisor: dict) -> None:
    """Mark the pointer's job as recorded by its `supervisor` (its run has started there): from now on, a
    supervisor with no record of it has lost it."""
    supervisor[RECORDED] = True
    record.save()


def _podrun_command(supervisor: dict, argv: list[str]) -> str:
    return past_login.begun(warm.command(supervisor["podrun"], argv))
