#!/usr/bin/env python3
"""What finding this podrun on a supervisor host costs, and installing it there on first use, on one lab host:

    sudo python scripts/bench_supervisor_install.py [--rounds 20] [--installs 3]

- the wheel (supervisor/wheel.py): built into an empty directory, and asked for again (the cached one);
- the check every handover makes (supervisor/install.py), on a connected transport, with this podrun in
  ~/.podrun/venv and then on the login PATH, against the floor: `true` over the same connection, and
  the venv's `podrun --version` run there alone;
- a first install (no ~/.podrun) from a wheel directory of podrun's requirements (the host's pip.conf:
  no-index, find-links), with `python3 -m venv` alone beside it.

Medians; the requirements' wheels are downloaded first by this machine's pip (not timed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from podrun import __version__
from podrun.supervisor.install import podrun_on_host
from podrun.supervisor.wheel import build_wheel
from podrun.transport.ssh import SshTransport

from benchlib import Lab, print_table, require_lab_tools


async def seconds(awaitable) -> float:
    started = time.perf_counter()
    await awaitable
    return time.perf_counter() - started


async def run_there(transport: SshTransport, command: str) -> None:
    channel = await transport.start(command)
    await asyncio.gather(channel.stdout.read(), channel.stderr.read())
    if await channel.wait():
        raise RuntimeError(f"{command!r} failed")


async def measure_on_host(lab: Lab, rounds: int, installs: int) -> dict[str, list[float]]:
    home = lab.hosts[0].home
    transport = SshTransport(lab.hosts[0].ip, 22, "root", str(lab.client_key), False)
    await transport.connect()
    samples: dict[str, list[float]] = {}
    try:
        for _ in range(installs):
            shutil.rmtree(home / ".podrun", ignore_errors=True)
            samples.setdefault("first install (venv + pip install)", []).append(
                await seconds(podrun_on_host(transport, "bench", None)))
            samples.setdefault("`python3 -m venv` alone", []).append(
                await seconds(run_there(transport, "rm -rf /tmp/venv && python3 -m venv /tmp/venv")))
        for where in ("in ~/.podrun/venv", "on the login PATH"):
            if where == "on the login PATH":
                (home / ".local/bin").mkdir(parents=True)
                (home / ".local/bin/podrun").symlink_to("/root/.podrun/venv/bin/podrun")
                (home / ".profile").write_text('PATH="$HOME/.local/bin:$PATH"\n')
            for _ in range(rounds):
                samples.setdefault(f"check, podrun {where}", []).append(
                    await seconds(podrun_on_host(transport, "bench", None)))
                samples.setdefault("floor: `true` on the connection", []).append(
                    await seconds(run_there(transport, "true")))
                samples.setdefault("floor: `~/.podrun/venv/bin/podrun --version`", []).append(
                    await seconds(run_there(transport, "~/.podrun/venv/bin/podrun --version")))
    finally:
        await transport.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--installs", type=int, default=3)
    args = parser.parse_args()
    if problem := require_lab_tools():
        sys.exit(problem)
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as workdir, Lab(1, Path(workdir) / "lab") as lab:
        os.environ["PODRUN_HOME"] = str(Path(workdir) / "home")  # where install.py keeps its wheel
        for _ in range(args.rounds):
            wheels = Path(tempfile.mkdtemp(dir=workdir))
            samples.setdefault("build the wheel", []).append(timed_call(build_wheel, str(wheels)))
            samples.setdefault("the wheel again (cached)", []).append(timed_call(build_wheel, str(wheels)))
        requirements = Path(workdir) / "requirements"
        metadata = zipfile.ZipFile(build_wheel(str(wheels))).read(f"podrun-{__version__}.dist-info/METADATA")
        dependencies = [line.removeprefix("Requires-Dist: ") for line in metadata.decode().splitlines()
                        if line.startswith("Requires-Dist: ")]
        subprocess.run([sys.executable, "-m", "pip", "download", "-qq", "--only-binary=:all:", "--dest",
                        str(requirements), *dependencies], check=True)
        pip_conf = lab.hosts[0].home / ".config/pip/pip.conf"
        pip_conf.parent.mkdir(parents=True)
        pip_conf.write_text(f"[global]\nno-index = true\nfind-links = {requirements}\n")
        samples.update(asyncio.run(measure_on_host(lab, args.rounds, args.installs)))
    print_table(f"install on first use, median of {args.rounds} (the installs: of {args.installs}), ms",
                ["measure", "ms"], {name: [f"{statistics.median(values) * 1000:.1f}"] for name, values in samples.items()})


def timed_call(function, *args) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
