"""Local workers' Python scripts forked by the fork server (transport/local_spawner.py, remote/forkserver.py):
each runs as `python -I -S -c PROGRAM ARGS` would, in its worker's directory, in a session of its own."""

from __future__ import annotations

import asyncio
import os
import resource
import shlex
import signal
import sys

from podrun.remote import detached_stopper, forkserver
from podrun.transport import local, local_spawner
from podrun.transport.local import LocalTransport

# what the script tells about itself, as one line; then it echoes its input and ends as argv[1] says
SCRIPT = """\
import os, sys
print(sys.argv, os.getcwd(), os.getsid(0) == os.getpid(), sys.flags.isolated, sys.flags.no_site, flush=True)
sys.stdout.write(sys.stdin.read())
sys.stdout.flush()
how = sys.argv[1]
if how == "code":
    sys.exit(3)
if how == "message":
    sys.exit("told to fail")
if how == "raise":
    raise ValueError("raised")
if how == "signal":
    os.kill(os.getpid(), 15)
"""


def script_command(args: list[str]) -> str:
    return " ".join(["exec", shlex.quote(sys.executable), "-I", "-S", "-c", shlex.quote(SCRIPT), *map(shlex.quote, args)])


async def run(transport: LocalTransport, how: str) -> tuple[int, str, str]:
    channel = await transport.start(script_command([how, "two words"]))
    channel.stdin.write(b"input\n")
    channel.stdin.write_eof()
    out, err = await asyncio.gather(channel.stdout.read(), channel.stderr.read())
    return await channel.wait(), out.decode(), err.decode()


def test_a_script_is_forked_and_runs_as_python_dash_c_would(tmp_path, monkeypatch):
    spawned = []
    spawn = asyncio.create_subprocess_exec

    async def counted_spawn(*args, **kwargs):
        spawned.append(args)
        return await spawn(*args, **kwargs)

    monkeypatch.setattr(local.asyncio, "create_subprocess_exec", counted_spawn)
    transport = LocalTransport(str(tmp_path / "w0"))

    async def main() -> list[tuple[int, str, str]]:
        await transport.connect()
        return await asyncio.gather(*(run(transport, how) for how in ("end", "code", "message", "raise", "signal")))

    ended, code, message, raised, signalled = asyncio.run(main())
    assert spawned == []  # no interpreter started for any of them: each a fork of the server
    told = f"['-c', 'end', 'two words'] {tmp_path / 'w0'} True 1 1\ninput\n"
    assert ended == (0, told, "")
    assert code[:2] == (3, told.replace("'end'", "'code'"))
    assert message[0] == 1 and message[2] == "told to fail\n"
    assert raised[0] == 1 and raised[2].startswith("Traceback") and raised[2].endswith("ValueError: raised\n")
    assert signalled[0] == -signal.SIGTERM


def test_a_shell_command_is_the_shells_and_a_script_with_shell_words_too(tmp_path):
    transport = LocalTransport(str(tmp_path / "w0"))
    assert local_spawner.script_in(script_command(["end"]), sys.executable) is not None
    assert local_spawner.script_in(script_command(["end"]) + "; echo more", sys.executable) is None
    assert local_spawner.script_in("exit 3", sys.executable) is None

    async def main() -> int:
        await transport.connect()
        channel = await transport.start(script_command(["end"]) + " && exit 4")
        channel.stdin.write_eof()
        return await channel.wait()

    assert asyncio.run(main()) == 0  # exec replaced the shell: `&& exit 4` never ran, as before


def test_the_servers_children_outlive_it(tmp_path):
    transport = LocalTransport(str(tmp_path / "w0"))
    marker = tmp_path / "outlived"
    waits = f"import pathlib, sys\nsys.stdin.read()\npathlib.Path({str(marker)!r}).write_text('yes')\n"

    async def main() -> None:
        await transport.connect()
        channel = await transport.start(" ".join(["exec", shlex.quote(sys.executable), "-I", "-S", "-c",
                                                  shlex.quote(waits)]))
        server = local_spawner.server_for(sys.executable)
        assert server is not None
        server.close()  # as the launcher's end closes it
        assert await until(lambda: server.process.poll() is not None), "the server did not end"
        assert not marker.exists()
        channel.stdin.write_eof()
        assert await until(marker.exists), "the child did not outlive the server"

    asyncio.run(main())


async def until(condition, timeout_s: float = 20.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def test_the_server_runs_when_its_socket_is_past_descriptor_1024(tmp_path):
    # at 1,024 workers the launcher holds thousands of files when it starts the server, whose socket keeps
    # its number: select() refused it ("filedescriptor out of range") and every worker was lost
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    transport = LocalTransport(str(tmp_path / "w0"))

    async def main() -> int:
        await transport.connect()
        return (await run(transport, "code"))[0]

    try:
        assert asyncio.run(main()) == 3
    finally:
        for descriptor in held:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_start_given_up_before_its_answer_leaves_the_server_serving(tmp_path):
    transport = LocalTransport(str(tmp_path / "w0"))

    async def main() -> tuple[int, list[dict]]:
        errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        await transport.connect()
        given_up = asyncio.ensure_future(transport.start(script_command(["end"])))
        await asyncio.sleep(0)  # its request is sent; its answer not yet read
        given_up.cancel()
        code = (await run(transport, "code"))[0]
        return code, errors

    assert asyncio.run(main()) == (3, [])


def test_the_stopper_of_detached_jobs_knows_the_servers_mark():
    assert detached_stopper.FORKED == forkserver.COMMAND_MARK.encode()


def test_starts_that_fill_the_servers_socket_all_go_out_once_it_has_room(tmp_path):
    # 32 requests in flight with a 30 KB program each are more than the socket holds: the starts that
    # waited for room each replaced the one watch of the socket, and all but the last waited for good
    program = SCRIPT + "#" * 30_000 + "\n"
    command = " ".join(["exec", shlex.quote(sys.executable), "-I", "-S", "-c", shlex.quote(program), "code", "x"])
    transport = LocalTransport(str(tmp_path / "w0"))

    async def one() -> int:
        channel = await transport.start(command)
        channel.stdin.write_eof()
        await channel.stdout.read()
        return await channel.wait()

    async def main() -> list[int]:
        await transport.connect()
        return await asyncio.wait_for(asyncio.gather(*(one() for _ in range(64))), 60)

    assert asyncio.run(main()) == [3] * 64
