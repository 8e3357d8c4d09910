"""Worker-side scripts started from the worker's cache (transport/base.py, BOOTSTRAP and ScriptChannel), on
local workers: what the launcher writes to each channel, counted as it is written, and what the script did."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from podrun.remote import framing
from podrun.transport import base
from podrun.transport.local import LocalTransport

# the oldest Python a worker may have, and the newest here, where this machine has them (pyenv)
PYTHONS = [Path(sys.executable),
           *(Path(f"/root/.pyenv/versions/{version}/bin/python3") for version in ("3.8.18", "3.13.0"))]


class CountingTransport(LocalTransport):
    """A local worker whose channels count what the launcher writes to them."""

    def __init__(self, root: Path, python: str, login: str = "", as_remote: bool = False):
        super().__init__(str(root))
        self.python = python
        self.login = login  # what a login prints before the command runs (a ~/.bashrc)
        self.as_remote = as_remote  # it does not look into the worker's cache, as a remote worker's cannot
        self.commands: list[str] = []
        self.written = 0

    def may_have(self, entry: str) -> bool:
        return self.as_remote or super().may_have(entry)

    async def start(self, command: str, fork: bool = True):
        channel = await super().start(self.login + command, fork)
        self.commands.append(command)
        write = channel.stdin.write

        def counted(data: bytes) -> None:
            self.written += len(data)
            write(data)

        channel.stdin.write = counted  # type: ignore[method-assign]
        return channel


def agent_step(worker: CountingTransport, command: str) -> tuple[bytes, list[bytes], int]:
    """One agent step of `command` on `worker`, as the launcher starts it: its output, its stderr lines
    and its exit code."""
    async def run() -> tuple[bytes, list[bytes], int]:
        await worker.connect()
        channel = await worker.start_python("agent")
        channel.stdin.write(framing.message(
            {"job_id": "cache-test", "job_dir": ".podrun/jobs/cache-test", "worker": 0, "step": "run",
             "cwd": worker.root, "command": command, "env": {"PODRUN_JOB_ID": "cache-test"}, "grace": 5,
             "heartbeat": 60, "detach": False}))
        output = await asyncio.wait_for(channel.stdout.read(), 30)
        lines = []
        while line := await channel.stderr.readline():
            lines.append(line)
        channel.stdin.write_eof()
        return output, lines, await channel.wait()

    worker.commands, worker.written = [], 0
    return asyncio.run(run())


def step_size(worker: CountingTransport, command: str) -> int:
    return len(framing.message({"job_id": "cache-test", "job_dir": ".podrun/jobs/cache-test", "worker": 0,
                                "step": "run", "cwd": worker.root, "command": command,
                                "env": {"PODRUN_JOB_ID": "cache-test"}, "grace": 5, "heartbeat": 60,
                                "detach": False}))


def ran(result: tuple[bytes, list[bytes], int], output: bytes) -> bool:
    printed, lines, code = result
    events = [json.loads(line) for line in lines]
    return (printed, code, [event["event"] for event in events]) == (output, 0, ["started", "exited"])


def cache_entry(worker: CountingTransport, name: str = "agent") -> Path:
    [entry] = (Path(worker.root) / ".podrun" / "cache").glob(f"{name}-*.v2")
    return entry


@pytest.mark.parametrize("as_remote", [False, True], ids=["local", "as-remote"])
@pytest.mark.parametrize("python", PYTHONS, ids=str)
def test_a_worker_with_the_agent_cached_is_sent_its_step_alone(tmp_path, python, as_remote):
    if not python.exists():
        pytest.skip(f"no {python} here")
    worker = CountingTransport(tmp_path, str(python), as_remote=as_remote)
    source, step = len(base.script_source("agent")), step_size(worker, "echo ran")
    # a previous release's entry (no .v2, no header) of the same name is neither used nor touched
    (tmp_path / ".podrun" / "cache").mkdir(parents=True, mode=0o700)
    hexversion = subprocess.run([python, "-c", "import sys; print('%x' % sys.hexversion)"], capture_output=True,
                                text=True, check=True).stdout.strip()
    entry_name = base.script_command(str(python), "agent").split("c('")[1].split("'")[0]
    old_release = tmp_path / ".podrun" / "cache" / f"{entry_name}-{hexversion}"
    old_release.write_bytes(b"a previous release's marshalled code")

    assert ran(agent_step(worker, "echo ran"), b"ran\n")
    with_source = [base.script_command(str(python), "agent")]
    if as_remote:  # the bootstrap found no entry: the agent started again with its source ahead of the same step
        assert worker.commands == [base.script_command(str(python), "agent", cached=True), *with_source]
        assert worker.written == step + source + step
    else:  # a local worker's cache, seen to lack the entry: started with its source at once
        assert (worker.commands, worker.written) == (with_source, source + step)
    assert oct(cache_entry(worker).stat().st_mode & 0o777) == "0o600"
    assert oct(cache_entry(worker).parent.stat().st_mode & 0o777) == "0o700"

    assert ran(agent_step(worker, "echo ran"), b"ran\n")
    assert worker.commands == [base.script_command(str(python), "agent", cached=True)]
    assert worker.written == step  # the step's message, and no source
    assert len(worker.commands[0]) < 2000
    assert old_release.read_bytes() == b"a previous release's marshalled code"


def test_a_changed_agent_source_is_sent_and_cached_beside_the_old_one(tmp_path, monkeypatch):
    worker = CountingTransport(tmp_path, str(PYTHONS[0]))
    assert ran(agent_step(worker, "echo before"), b"before\n")
    old_entry = cache_entry(worker)
    read = base.remote_source
    monkeypatch.setattr(base, "remote_source", lambda name: read(name) + (b"# changed\n" if name == "agent" else b""))
    _forget_sources()
    try:
        assert ran(agent_step(worker, "echo after"), b"after\n")
        assert worker.commands == [base.script_command(str(PYTHONS[0]), "agent")]  # with its source: none cached
        assert worker.written > len(base.script_source("agent"))
        assert old_entry.exists() and len(list(old_entry.parent.glob("agent-*.v2"))) == 2
    finally:
        _forget_sources()


def _forget_sources() -> None:
    for remembered in (base.script_source, base.cache_name, base.script_command):
        remembered.cache_clear()


def _truncated(entry: Path) -> None:
    entry.write_bytes(entry.read_bytes()[:len(entry.read_bytes()) // 2])


def _one_byte_changed(entry: Path) -> None:
    content = bytearray(entry.read_bytes())
    content[len(content) // 2] ^= 0x01
    entry.write_bytes(bytes(content))


def _writable_by_others(entry: Path) -> None:
    entry.chmod(0o666)


def _another_scripts_entry(entry: Path) -> None:
    """The relay receiver's own entry, whole and valid, under the agent's name."""
    [relay_node] = entry.parent.glob("relay_node-*.v2")
    entry.write_bytes(relay_node.read_bytes())


@pytest.mark.parametrize("damage", [_truncated, _one_byte_changed, _writable_by_others, _another_scripts_entry])
def test_an_entry_that_is_damaged_or_not_only_ours_is_not_used_and_is_compiled_again(tmp_path, damage):
    worker = CountingTransport(tmp_path, str(PYTHONS[0]))
    assert ran(agent_step(worker, "true"), b"")
    asyncio.run(_relay_node_started(worker))  # its entry, for _another_scripts_entry
    entry = cache_entry(worker)
    damage(entry)

    assert ran(agent_step(worker, "echo still runs"), b"still runs\n")
    assert len(worker.commands) == 2 and worker.written > len(base.script_source("agent"))  # the source was sent
    assert ran(agent_step(worker, "echo again"), b"again\n")
    assert len(worker.commands) == 1  # stored again, whole, and used


async def _relay_node_started(worker: CountingTransport) -> None:
    channel = await worker.start_python("relay_node")
    channel.stdin.write_eof()  # no configuration: it ends at once
    await channel.wait()


def test_a_small_script_sends_its_input_alone_once_cached_and_a_login_s_lines_stay_in_stderr(tmp_path):
    # a login that prints on stderr, its last line without a newline, ahead of the bootstrap's word
    worker = CountingTransport(tmp_path, str(PYTHONS[0]), login="echo welcome >&2; printf 'no newline' >&2; ",
                               as_remote=True)

    async def connector_errors() -> tuple[list[bytes], int]:
        await worker.connect()
        channel = await worker.start_python("detached_stopper", unlisted=["no-such-job", "0", "job", "0"])
        errors = [line async for line in _lines(channel.stderr)]
        return errors, await channel.wait()

    results = []
    for _ in range(2):
        worker.commands, worker.written = [], 0
        results.append((asyncio.run(connector_errors()), list(worker.commands), worker.written))
    (first, first_commands, first_written), (second, second_commands, second_written) = results
    login = b"welcome\nno newline"
    assert b"".join(first[0]).startswith(login) and b"".join(second[0]).startswith(login)
    assert b"".join(first[0])[len(login):] == b"".join(second[0])[len(login):] and first[1] == second[1]
    assert len(first_commands) == 2 and first_written > len(base.script_source("detached_stopper"))
    assert len(second_commands) == 1 and second_written == len("no-such-job\n0\njob\n0\n")


async def _lines(stream):
    while line := await stream.readline():
        yield line
