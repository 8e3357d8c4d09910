"""The podrun that runs a handed-over job on the supervisor host: one of exactly this podrun's version.

The spec's `supervisor.podrun` names it; by default it is `podrun` on the host's login PATH, else
the one in the host's ~/.podrun/venv, which podrun puts there when it has no podrun of this version:
this podrun's wheel (wheel.py) goes over the channel's stdin, the host's python3 makes the venv and
the venv's pip installs the wheel, taking the requirements from wherever the host's own configuration
says (pip.conf, PIP_INDEX_URL, find-links): podrun never names an index.

The answer takes one round trip: one login shell finds the podrun on the login PATH and, unless that
one is of this version, asks the venv's. An install is a second one. The laptop remembers the podrun
it found for each host (early.py) and asks only when that one no longer answers a handover with this
version (greeting.py).
Both run in the user's login shell (`$SHELL -l`): the login PATH, and pip's settings in ~/.profile.
A login that waits (a prompt in ~/.profile) would hold the check forever: it gets CHECK_TIMEOUT. Two
first handovers at once to one host install one at a time (flock(1) on ~/.podrun/install.lock, for at
most INSTALL_WAIT): the second finds the first's podrun in the venv and installs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex

from podrun import __version__, paths
from podrun.cloud.settings import seconds
from podrun.errors import PodrunError
from podrun.output import say
from podrun.supervisor.wheel import build_wheel, wheel_name
from podrun.transport.base import ChannelLost, Transport
from podrun.transport.past_login import MARK  # what the scripts report starts lines with

VENV = "~/.podrun/venv"
CHECK_TIMEOUT = ("PODRUN_SUPERVISOR_CHECK_TIMEOUT", 30.0)  # the version check takes 0.09 s on a host that answers
INSTALL_WAIT = ("PODRUN_SUPERVISOR_INSTALL_WAIT", 600.0)  # for another handover's install there (6 s from a cache)
# `found KIND PATH` reports a podrun found: its path and what its --version printed (also left in $v)
FOUND = """\
found() {{
  v=$("$2" --version 2>/dev/null </dev/null | head -n 1)
  printf '{mark}%s=%s\\n{mark}%s_version=%s\\n' "$1" "$2" "$1" "$v"
}}
"""
# the podrun named (a `~/` path, or a command on the login PATH); unless it is of this version or was
# configured, the venv's too
PROBE = FOUND + """\
want={want} name={name} configured={configured} v=
case $name in "~/"*) name=$HOME/${{name#"~/"}};; esac
path=$(command -v "$name" 2>/dev/null)
case $path in /*) ;; */*) path=$PWD/$path;; *) path=;; esac
[ -z "$path" ] || found path "$path"
venv=$HOME/.podrun/venv/bin/podrun
[ -n "$configured" ] || [ "$v" = "$want" ] || [ ! -x "$venv" ] || found venv "$venv"
"""
# the wheel arrives on stdin; `failed=STEP` names what went wrong, and what the step printed says why
INSTALL = FOUND + """\
dir=$HOME/.podrun/install.$$ venv=$HOME/.podrun/venv
fail() {{ printf '\\n{mark}failed=%s\\n' "$1"; rm -rf "$dir"; exit 1; }}
mkdir -p "$dir" && cat > "$dir/{wheel}" && [ "$(wc -c < "$dir/{wheel}")" -eq {size} ] || fail receive
if command -v flock >/dev/null 2>&1; then
  exec 9>"$HOME/.podrun/install.lock" && flock -w {wait} 9 || fail lock
fi
if [ -x "$venv/bin/podrun" ] && [ "$("$venv/bin/podrun" --version 2>/dev/null </dev/null | head -n 1)" = {want} ]; then
  rm -rf "$dir"; found venv "$venv/bin/podrun"; exit 0  # another handover installed it while this one waited
fi
if [ ! -x "$venv/bin/python" ]; then
  command -v python3 >/dev/null 2>&1 || fail python3
  printf '{mark}step=venv\n'
  python3 -m venv "$venv" 2>&1 || {{ rm -rf "$venv"; fail venv; }}
fi
printf '{mark}step=pip\n'
"$venv/bin/python" -m pip install --disable-pip-version-check --no-input "$dir/{wheel}" 2>&1 || fail pip
rm -rf "$dir"
found venv "$venv/bin/podrun"
"""


async def podrun_on_host(transport: Transport, host: str, configured: str | None) -> str:
    """The absolute path on `host` (connected through `transport`) of a podrun whose --version is this
    podrun's: `configured` (the spec's supervisor.podrun) or else the one on the login PATH or in
    ~/.podrun/venv, installed there if neither is of this version. What is wrong is one PodrunError line."""
    want = f"podrun {__version__}"
    probe = PROBE.format(want=shlex.quote(want), mark=MARK, name=shlex.quote(configured or "podrun"),
                         configured=shlex.quote(configured or ""))
    timeout_s = seconds(CHECK_TIMEOUT)
    try:
        found = await asyncio.wait_for(run_script(transport, host, probe), timeout_s)
    except asyncio.TimeoutError:
        raise PodrunError(f"supervisor {host}: no answer within {timeout_s:g}s to podrun's version check there (does "
                          f"its login shell wait for input? try `ssh {host} true`); PODRUN_SUPERVISOR_CHECK_TIMEOUT "
                          f"sets the seconds") from None
    on_path = _what_it_is(found["path"], found["path_version"])
    if configured:
        if found["path_version"] == want:
            return found["path"]
        raise PodrunError(f"supervisor {host}: supervisor.podrun {configured}: {on_path if found['path'] else 'not found'} "
                          f"there, and this podrun is {__version__}; install podrun {__version__} there, or leave "
                          f"supervisor.podrun out and podrun installs itself into {VENV} on that host")
    if found["path_version"] == want:
        return found["path"]
    if found["venv_version"] == want:
        if found["path"]:
            say(f"supervisor {host}: its login PATH has {on_path}; using podrun {__version__} from {VENV}")
        return found["venv"]
    in_venv = f" nor in {VENV} (it has {_what_it_is(found['venv'], found['venv_version'])})" if found["venv"] else ""
    say(f"supervisor {host}: no podrun {__version__} on its login PATH (it has {on_path}){in_venv}; "
        f"installing this podrun ({__version__}) into {VENV} with its python3 and pip")
    return await _install(transport, host, want)


async def _install(transport: Transport, host: str, want: str) -> str:
    wheel = build_wheel(os.path.join(paths.podrun_home(), "wheels"))
    with open(wheel, "rb") as file:
        data = file.read()
    wait_s = seconds(INSTALL_WAIT)
    script = INSTALL.format(mark=MARK, wheel=wheel_name(), size=len(data), want=shlex.quote(want), wait=f"{wait_s:g}")
    installed = await run_script(transport, host, script, data)
    if installed["failed"] == "lock":
        raise PodrunError(f"supervisor {host}: cannot install podrun {__version__} into {VENV}: another install there "
                          f"held ~/.podrun/install.lock for {wait_s:g}s; PODRUN_SUPERVISOR_INSTALL_WAIT sets the "
                          f"seconds to wait")
    if installed["failed"]:
        raise PodrunError(f"supervisor {host}: cannot install podrun {__version__} into {VENV}: "
                          f"{_cause(installed['failed'], installed['output'])} or install podrun {__version__} there "
                          f"and set supervisor.podrun")
    if installed["venv_version"] != want:
        raise PodrunError(f"supervisor {host}: installed podrun {__version__} into {VENV}, but what is there is "
                          f"{_what_it_is(installed['venv'], installed['venv_version'])}")
    return installed["venv"]


async def run_script(transport: Transport, host: str, script: str, stdin: bytes = b"") -> dict[str, str]:
    """What `script`, run by the user's login shell on the host, reported: path, path_version, venv,
    venv_version and failed ("" where it said nothing), and in "output" what it printed since its last `step`."""
    command = f'exec "${{SHELL:-/bin/sh}}" -lc {shlex.quote(script)}'
    try:
        channel = await transport.start(command)

        async def send() -> None:
            # a script may end before it read it all (the probe reads nothing; an install that fails at once):
            # what it said tells, and a connection that broke is its output's and exit's ChannelLost
            with contextlib.suppress(ChannelLost):
                channel.stdin.write(stdin)
                await channel.stdin.drain()
                channel.stdin.write_eof()

        _, output, errors, _ = await asyncio.gather(send(), channel.stdout.read(), channel.stderr.read(),
                                                    channel.wait())
    except ChannelLost as error:
        raise PodrunError(f"supervisor {host}: the connection broke while podrun looked for its podrun there "
                          f"({error})") from None
    found = dict.fromkeys(("path", "path_version", "venv", "venv_version", "failed"), "")
    printed: list[str] = []
    for line in (output + errors).decode(errors="replace").splitlines():
        if line.startswith(MARK):
            key, _, value = line[len(MARK):].partition("=")
            found[key] = value
            if key == "step":
                printed = []
        else:
            printed.append(line)
    found["output"] = "\n".join(printed)
    return found


def _what_it_is(path: str, version: str) -> str:
    """A podrun found, in words: `none`, `podrun 0.0.9 at /usr/local/bin/podrun`, or what else it printed."""
    if not path:
        return "none"
    if re.fullmatch(r"podrun \S+", version):
        return f"{version} at {path}"
    return f"{path}, whose --version printed {version!r}" if version else f"{path}, whose --version printed nothing"


def _cause(step: str, output: str) -> str:
    """Why a step of INSTALL failed (pip's last error, or the venv module's words), and the remedy on the host."""
    if step == "pip":
        errors = [line.removeprefix("ERROR: ") for line in output.splitlines() if line.startswith("ERROR:")]
        return (f"pip: {errors[-1] if errors else _last_line(output)}; give the host a package index for pip "
                f"(pip.conf, PIP_INDEX_URL, find-links)")
    if step == "venv":
        return f"python3 -m venv: {' '.join(output.split())[:300]}; give it a python3 with its venv module"
    if step == "python3":
        return "no python3 on its login PATH; give it one (3.10 or newer)"
    return "the wheel did not arrive whole; make ~/.podrun there writable"


def _last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "it printed nothing"
