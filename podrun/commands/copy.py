"""`podrun cp`: files to and from workers, with gcloud's `tpu-vm scp` conventions: a remote path is
written `:PATH` (relative to the login directory; `~` is the remote home), `--worker` picks the
workers (default all), `--recurse` copies directories.

One connection per worker, all at once. An upload is packed once and delivered through the relay
(shipping/relay.py): the launcher's uplink carries it once, whatever the number of workers. A
download from several workers lands in DEST/w<i>/. Either way a copy is all or nothing across the
workers: the files arrive in a staging directory on every worker (or, downloading, beside DEST),
every placement is checked (remote/placement.py), and only then are they put in place, so a copy that
fails on one worker leaves every destination as it was. What cannot be checked beforehand (a disk
that fills while files move) is named: which workers have the copy and which may hold part of it.
On a terminal one line shows the bytes, the rate and the workers done.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shlex
import shutil
import stat
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from podrun import file_limit
from podrun.errors import PodrunError, UsageError
from podrun.output import counted, say, size_text
from podrun.plan import parse_worker_selection
from podrun.remote import placement
from podrun.shipping import archive, relay
from podrun.shipping.scan import Tree
from podrun.spec.adhoc import TargetFlags, target_spec
from podrun.targets.base import Worker, target_for
from podrun.transport.base import ChannelLost

REMOTE = ":"
READ_BYTES = 1 << 16
# as root, tar would keep the archive's owners and setuid bits: what a worker sends is owned by the
# user running podrun, with their umask, as for any other user (tar's default for them)
UNPACK = ("tar", "-x", "--no-same-owner", "--no-same-permissions", "-f", "-", "-C")
SPECIAL_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a fifo",
                 stat.S_IFSOCK: "a socket"}
SPECIALS_NAMED = 5


def cp(spec_path: str | None, flags: TargetFlags, worker_selection: str | None, recurse: bool,
       paths: list[str]) -> int:
    if not flags.given and spec_path is None:  # then the first argument is the spec
        spec_path, paths = (paths[0], paths[1:]) if paths else (None, paths)
    if len(paths) < 2:
        raise UsageError("expected SRC... DEST, one side remote (written :PATH)")
    *sources, dest = paths
    upload = dest.startswith(REMOTE)
    if any(source.startswith(REMOTE) == upload for source in sources):
        raise UsageError(f"{' '.join(paths)}: expected every SRC remote (:PATH) and DEST local, or every SRC "
                         f"local and DEST remote")
    tree = _local_tree(sources, recurse) if upload else None  # a missing source is named before connecting
    spec = target_spec(spec_path, flags)
    target = target_for(spec)
    workers = target.workers(dry_run=False)
    workers = [workers[index] for index in sorted(parse_worker_selection(worker_selection, len(workers)))]
    if tree is not None:
        if target.shares_root:  # one directory for every worker (a cluster's shared home): copied there once
            workers = workers[:1]
        into = dest.removeprefix(REMOTE) or "."  # `:` alone is the login directory, as in scp
        sent = asyncio.run(_connected(workers, lambda: _upload(tree, sources, into, workers)))
        say(f"copied {counted(len(sources), 'path')} to {counted(len(workers), 'worker')}: {size_text(sent)} sent")
    else:
        remote = [source.removeprefix(REMOTE) for source in sources]
        # each worker's tar has one here that unpacks what it sends
        received = asyncio.run(_connected(workers, lambda: _download(remote, recurse, dest, workers), here=1))
        say(f"copied {counted(len(sources), 'path')} from {counted(len(workers), 'worker')}: "
            f"{size_text(received)} received")
    return 0


async def _connected(workers: list[Worker], work: Callable[[], Awaitable[int]], here: int = 0) -> int:
    """What `work` makes, with every worker's connection open (all at once) until it is done; `work`
    runs one command at a time on each worker, and `here` processes on this machine for each."""
    file_limit.make_room(file_limit.needed([worker.transport.endpoint()["kind"] for worker in workers], 1, here=here),
                         counted(len(workers), "worker"))
    try:
        await asyncio.gather(*(worker.transport.connect() for worker in workers))
        return await work()
    finally:
        await asyncio.gather(*(worker.transport.close() for worker in workers), return_exceptions=True)


def _local_tree(sources: list[str], recurse: bool) -> Tree:
    """What an upload sends, by absolute path (relative to /): each source, and under a directory
    everything in it, empty directories and links included."""
    entries = []
    for source in sources:
        path = os.path.abspath(source)
        if not os.path.lexists(path):
            raise UsageError(f"{source}: no such file or directory")
        entries.append(path)
        if os.path.isdir(path) and not os.path.islink(path):
            if not recurse:
                raise UsageError(f"{source}: is a directory (use --recurse)")
            for folder, folders, files in os.walk(path):
                entries += [os.path.join(folder, name) for name in folders + files]
    specials = [f"{entry} is {kind}" for entry in sorted(entries) if (kind := _special_kind(entry))]
    if specials:
        raise UsageError(_specials_refused(specials))
    return Tree(Path("/"), sorted({entry.lstrip("/") for entry in entries}), digest="")


def _special_kind(path: str) -> str | None:
    """What path is if it is none of a file, a directory or a symbolic link ("a fifo"), else None."""
    return SPECIAL_KINDS.get(stat.S_IFMT(os.lstat(path).st_mode))


def _specials_refused(specials: list[str]) -> str:
    more = f" (and {len(specials) - SPECIALS_NAMED} more)" if len(specials) > SPECIALS_NAMED else ""
    return f"{', '.join(specials[:SPECIALS_NAMED])}{more}: podrun cp copies files, directories and symbolic links only"


async def _upload(tree: Tree, sources: list[str], dest: str, workers: list[Worker]) -> int:
    staging = f".podrun/cp/{secrets.token_hex(8)}"
    entries = [f"{staging}/{os.path.abspath(source).lstrip('/')}" for source in sources]
    try:
        try:
            sent = await relay.deliver(archive.shipment(tree, staging, "files"), workers)
        except PodrunError as error:
            raise PodrunError(f"{error}; nothing was copied to any worker") from None
        _raise_for(await asyncio.gather(*(_placement(worker, "--check", staging, dest, *entries) for worker in workers),
                                        return_exceptions=True), workers, "nothing was copied to any worker")
    except BaseException:
        await asyncio.gather(*(_discard(worker, staging) for worker in workers), return_exceptions=True)
        raise
    placed = await asyncio.gather(*(_placement(worker, staging, dest, *entries) for worker in workers),
                                  return_exceptions=True)
    _raise_for(placed, workers, _partly_copied(placed, workers, "to"))
    return sent


async def _discard(worker: Worker, staging: str) -> None:
    channel = await worker.transport.start(f"rm -rf {shlex.quote(staging)}")
    channel.stdin.write_eof()
    await channel.wait()


async def _placement(worker: Worker, *args: str) -> None:
    """remote/placement.py on the worker: a check (--check) or the placement itself."""
    channel = await worker.transport.start_python("placement", *args)
    try:
        channel.stdin.write_eof()
        errors = await channel.stderr.read()  # before wait(): asyncssh's wait() takes what is left unread
        code = await channel.wait()
    except ChannelLost as lost:
        raise PodrunError(f"worker {worker.index} ({worker.address}) lost its connection ({lost})") from None
    if code != 0:
        raise PodrunError(f"worker {worker.index} ({worker.address}): {_last_line(errors, code)}")


def _raise_for(outcomes: list, workers: list[Worker], what_happened: str) -> None:
    """A PodrunError naming every worker that failed (each error names its worker) and what happened
    to the copy, if any outcome is an exception."""
    failed = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if any(not isinstance(outcome, PodrunError) for outcome in failed):
        raise next(outcome for outcome in failed if not isinstance(outcome, PodrunError))  # Ctrl-C, a bug
    if failed:
        copied = f"; {what_happened}" if len(workers) > 1 else ""
        raise PodrunError("; ".join(map(str, failed)) + copied)


def _partly_copied(outcomes: list, workers: list[Worker], direction: str) -> str:
    """What a placement that failed on some workers after every check passed leaves behind."""
    done = [worker.index for worker, outcome in zip(workers, outcomes) if not isinstance(outcome, BaseException)]
    copied = f"copied {direction} {counted(len(done), 'worker')} ({', '.join(map(str, done))})" if done else \
        "copied nowhere"
    return f"{copied}; a worker named here may hold part of the copy"


async def _download(sources: list[str], recurse: bool, dest: str, workers: list[Worker]) -> int:
    """Every worker's copy into its own staging directory beside `dest`; then, only if all arrived and
    every placement checks out, each put in place: into DEST/w<i> with several workers."""
    progress = relay.Progress(len(workers), "copying", "received")
    per_worker = len(workers) > 1
    made: list[str] = []  # DEST and DEST/w<i> made here, removed again if the copy stops before placing
    try:
        stagings = await asyncio.gather(*(_download_from(worker, sources, recurse, dest, progress)
                                          for worker in workers), return_exceptions=True)
    finally:
        progress.clear()
    arrived = [staging for staging in stagings if isinstance(staging, str)]
    try:
        _raise_for(stagings, workers, "nothing was copied from any worker")
        intos = [os.path.join(dest, f"w{worker.index}") if per_worker else dest for worker in workers]
        entries = [[os.path.join(staging, os.path.basename(source.rstrip("/"))) for source in sources]
                   for staging in arrived]
        try:
            for folder in ([dest, *intos] if per_worker else []):
                if not os.path.lexists(folder):
                    os.mkdir(folder)
                    made.append(folder)
            for worker, staging, into, its_entries in zip(workers, arrived, intos, entries):
                _check_locally(worker, staging, into, its_entries)
        except (OSError, PodrunError) as error:
            for folder in reversed(made):
                os.rmdir(folder)
            reason = error if isinstance(error, PodrunError) else f"{dest}: cannot copy there: {error.strerror}"
            raise PodrunError(f"{reason}; nothing was copied" + " from any worker" * per_worker) from None
        placed = [_place_locally(worker, staging, into, its_entries)
                  for worker, staging, into, its_entries in zip(workers, arrived, intos, entries)]
        _raise_for(placed, workers, _partly_copied(placed, workers, "from"))
    finally:
        for staging in arrived:
            shutil.rmtree(staging, ignore_errors=True)  # placement removed it, unless the copy stopped before
    return progress.sent


def _check_locally(worker: Worker, staging: str, into: str, entries: list[str]) -> None:
    try:
        placement.check(staging, into, entries)
    except placement.PlacementError as error:
        raise PodrunError(f"worker {worker.index} ({worker.address}): {error}") from None


def _place_locally(worker: Worker, staging: str, into: str, entries: list[str]) -> PodrunError | None:
    try:
        placement.place(staging, into, entries)
    except placement.PlacementError as error:
        return PodrunError(f"worker {worker.index} ({worker.address}): {error}")
    return None


async def _download_from(worker: Worker, sources: list[str], recurse: bool, dest: str,
                         progress: relay.Progress) -> str:
    """The sources packed by the worker's tar, unpacked here by tar into a new staging directory
    beside `dest`, which is returned (removed again if the copy failed)."""
    try:
        staging = tempfile.mkdtemp(prefix=".podrun-cp-", dir=os.path.dirname(os.path.abspath(dest)))
    except OSError as error:
        raise PodrunError(f"{dest}: cannot copy there: {error.strerror}") from None
    try:
        channel = await worker.transport.start(_tar_command(sources, recurse))
        unpacker = await asyncio.create_subprocess_exec(*UNPACK, staging, stdin=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
        assert unpacker.stdin is not None and unpacker.stderr is not None
        try:
            channel.stdin.write_eof()
            errors = asyncio.ensure_future(channel.stderr.read())
            while chunk := await channel.stdout.read(READ_BYTES):
                unpacker.stdin.write(chunk)
                await unpacker.stdin.drain()
                progress.add(sent=len(chunk))
            error_text = await errors  # before wait(), which takes what is left unread (asyncssh)
            code = await channel.wait()
        except ChannelLost as lost:
            raise PodrunError(f"worker {worker.index} ({worker.address}) lost its connection ({lost})") from None
        finally:
            unpacker.stdin.close()
            unpacked = await unpacker.wait()
        if code != 0:
            raise PodrunError(f"worker {worker.index} ({worker.address}): {_last_line(error_text, code)}")
        if unpacked != 0:
            raise PodrunError(f"{dest}: tar could not unpack the copy from worker {worker.index}: "
                              f"{_last_line(await unpacker.stderr.read(), unpacked)}")
        _refuse_special_files(worker, staging, sources)
        progress.add(done=1)
        return staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _refuse_special_files(worker: Worker, staging: str, sources: list[str]) -> None:
    """A copy holding a device node, a fifo or a socket is refused, naming them (as remote paths)."""
    remote_folder = {os.path.basename(source.rstrip("/")): os.path.dirname(source.rstrip("/")) for source in sources}
    specials = []
    for folder, folders, files in os.walk(staging):
        for name in folders + files:
            if kind := _special_kind(os.path.join(folder, name)):
                relative = os.path.relpath(os.path.join(folder, name), staging)
                specials.append(f"{REMOTE}{os.path.join(remote_folder.get(relative.split(os.sep)[0], ''), relative)} "
                                f"is {kind}")
    if specials:
        raise PodrunError(f"worker {worker.index} ({worker.address}): {_specials_refused(sorted(specials))}")


def _tar_command(sources: list[str], recurse: bool) -> str:
    """A shell line that checks each remote source and packs them all into one tar on stdout."""
    checks, members = [], []
    for source in sources:
        path = _shell_path(source.rstrip("/") or "/")
        shown = shlex.quote(REMOTE + source)
        checks.append(f'{{ [ -e {path} ] || [ -L {path} ]; }} || {{ echo {shown}: no such file or directory >&2; '
                      f'exit 1; }}')
        if not recurse:
            checks.append(f'[ ! -d {path} ] || {{ echo {shown}: is a directory "(use --recurse)" >&2; exit 1; }}')
        folder, name = os.path.split(source.rstrip("/"))
        # ./: a name that begins with `-` is not read as one of tar's options (-C's own argument is absolute)
        members.append(f"-C {_shell_path(folder, absolute=True)} {shlex.quote('./' + name)}")
    return "; ".join([*checks, f"exec tar -c -f - {' '.join(members)}"])


def _shell_path(path: str, absolute: bool = False) -> str:
    """A remote path as a shell word: `~` is $HOME; with `absolute`, a relative path is made so
    from the login directory (tar's -C options are relative to each other)."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (shlex.quote(path[1:]) if path[1:] else "")
    if path.startswith("/") or not absolute:
        return shlex.quote(path)
    return '"$PWD"/' + shlex.quote(path) if path else '"$PWD"'


def _last_line(errors: bytes, code: int) -> str:
    lines = errors.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit code {code}"
