"""Hostile neighbours (issue 27, items 1 to 3): another user on the workers' network (uid 65534, with
the system's python3) connects to worker 0's hub and to a code relay receiver, stays idle, or sends
16 MB with no newline. The job must still end as it would have, leave nothing running, and the
agent must not spend its time or descriptors on them."""

from __future__ import annotations

import hashlib
import io
import json
import marshal
import os
import secrets
import socket
import struct
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from helpers import job_id_in, podrun, processes_of_job, wait_until

# run as uid 65534: `idle PORT N` opens N connections and holds them until its stdin closes, then
# says how many the other side had closed; `flood PORT` sends 16 MB with no newline
STRANGER = r"""
import socket, sys, time
mode, port = sys.argv[1], int(sys.argv[2])
if mode == "idle":
    held = []
    for _ in range(int(sys.argv[3])):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            pass
    print("open", len(held), flush=True)
    sys.stdin.read()
    closed = 0
    for connection in held:
        connection.settimeout(0.5)
        try:
            closed += connection.recv(1) == b""
        except OSError as error:
            closed += not isinstance(error, socket.timeout)
    print("closed by the other side", closed, flush=True)
else:
    connection = socket.create_connection(("127.0.0.1", port), timeout=5)
    connection.settimeout(60)
    started, sent, chunk = time.monotonic(), 0, b"x" * 65536
    try:
        while sent < 16 << 20:
            sent += connection.send(chunk)
        print("all sent", sent, flush=True)
    except OSError as error:
        print("cut off after", sent, "bytes,", type(error).__name__, flush=True)
"""
WAITS_FOR_RELEASE = "run: until [ -e {release} ]; do sleep 0.05; done; echo worker $PODRUN_WORKER done\n"


def stranger(*args: object) -> subprocess.Popen:
    return subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                             STRANGER, *map(str, args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd="/")


def hub_agent(home: Path, job_id: str) -> int:
    """The pid of worker 0's agent (the hub) of a detached local job, once it has started the step."""
    agent_file = home / "local" / "w0" / ".podrun" / "jobs" / job_id / "run.agent"
    wait_until(agent_file.exists, "worker 0's agent to start the step")
    return int(agent_file.read_text().split()[0])  # the agent's pid, then its start time


def listening_port(pid: int) -> int:
    """The TCP port process `pid` listens on (the hub's: the agent listens on no other)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with_target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if with_target.startswith("socket:["):
            inodes.add(with_target[len("socket:["):-1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            return int(fields[1].split(":")[1], 16)
    raise AssertionError(f"process {pid} listens on no TCP port")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def detached_job(home: Path, job_file, tmp_path: Path) -> tuple[str, int, Path]:
    """A detached job on 2 local workers that runs until the test releases it: (job id, worker 0's
    agent pid, the file that releases it)."""
    release = tmp_path / "release"
    spec = job_file("target: {local: {workers: 2}}\n" + WAITS_FOR_RELEASE.format(release=release))
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    job_id = job_id_in(started.stderr)
    return job_id, hub_agent(home, job_id), release


def assert_ended_right(home: Path, job_id: str, hub: int) -> None:
    logs = podrun("logs", job_id, "-f", timeout=60)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert "worker 0 done" in logs.stdout and "worker 1 done" in logs.stdout
    record = json.loads((home / "jobs" / job_id / "job.json").read_text())
    assert record["state"] == "succeeded", record
    wait_until(lambda: not alive(hub), "worker 0's agent to exit")
    assert processes_of_job(job_id) == []


@pytest.mark.slow
@pytest.mark.parametrize("spare_descriptors", [None, 6])
def test_idle_strangers_cost_the_hub_neither_its_descriptors_nor_its_life(home, job_file, tmp_path,
                                                                          spare_descriptors):
    """Before: under `ulimit -n 64`, 60 idle connections ran the hub out of descriptors; accept()
    raised and worker 0's agent died, so worker 1 was stopped as lost and the job failed. And an idle
    connection kept worker 0's agent waiting after its job ended. With only 6 descriptors to spare,
    accept() fails for the strangers even now: the hub keeps fewer and still writes its job's files."""
    job_id, hub, release = detached_job(home, job_file, tmp_path)
    limit = 64 if spare_descriptors is None else len(os.listdir(f"/proc/{hub}/fd")) + spare_descriptors
    subprocess.run(["prlimit", f"--pid={hub}", f"--nofile={limit}:{limit}"], check=True)
    attack = stranger("idle", listening_port(hub), 60)
    try:
        assert attack.stdout.readline().startswith("open "), "the stranger could not connect"
        assert alive(hub)
        release.touch()  # the job ends while the stranger still holds its connections
        assert_ended_right(home, job_id, hub)
    finally:
        release.touch()
        attack.stdin.close()
    closed = attack.stdout.readline().split()
    assert attack.wait(timeout=30) == 0
    assert closed[:-1] == ["closed", "by", "the", "other", "side"]


@pytest.mark.slow
def test_sixteen_megabytes_without_a_newline_are_cut_off_at_once(home, job_file, tmp_path):
    """Before: the hub buffered them all, splitting the buffer on every 4 KB read, which pegged a core
    for about 24 s."""
    job_id, hub, release = detached_job(home, job_file, tmp_path)
    try:
        cpu_before = cpu_seconds(hub)
        flood = stranger("flood", listening_port(hub))
        flood.stdin.close()
        said = flood.stdout.readline()
        assert flood.wait(timeout=60) == 0
        assert said.startswith("cut off after "), said
        assert int(said.split()[3]) < 16 << 20
        assert cpu_seconds(hub) - cpu_before < 2.0
    finally:
        release.touch()
    assert_ended_right(home, job_id, hub)


def relay_frames(files: dict[str, bytes]) -> bytes:
    """A shipment as relay_node.py takes it: one raw frame holding a tar of `files`, then the end frame."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, content in files.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(content)
            tar.addfile(entry, io.BytesIO(content))
    data = archive.getvalue()
    end = hashlib.sha256(data).hexdigest().encode()
    return struct.pack(">cI", b"r", len(data)) + data + struct.pack(">cI", b"e", len(end)) + end


@pytest.mark.parametrize("strangers", [1, 20])
def test_idle_strangers_do_not_hold_up_a_relay_receiver(tmp_path, strangers):
    """A receiver waiting for its parent (the worker relaying it the code) while strangers connect
    first and say nothing takes the parent at once (beyond 16, the oldest stranger goes). Before: it
    waited 30 s on the first stranger."""
    from podrun.remote import framing
    from podrun.transport.base import script_command, script_source

    token = secrets.token_hex(16)
    code_dir = tmp_path / "code-v1"
    receiver = subprocess.Popen(["sh", "-c", script_command(sys.executable, "relay_node")], cwd=tmp_path,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    receiver.stdin.write(script_source("relay_node") + framing.message(
        {"code_dir": str(code_dir), "token": token, "listen": True, "record": False}) + framing.message(
        {"children": []}))
    receiver.stdin.flush()
    try:
        port = int(receiver.stdout.readline().split()[1])
        attack = stranger("idle", port, strangers)
        assert attack.stdout.readline().startswith("open "), "the stranger could not connect"
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as parent:
            parent.sendall(token.encode() + relay_frames({"train.py": b"print('hi')\n"}))
        output, errors = receiver.communicate(timeout=60)
        took = time.monotonic() - started
        attack.stdin.close()
        attack.wait(timeout=30)
    finally:
        receiver.kill()
    assert receiver.returncode == 0, errors
    assert output.splitlines()[-1] == b"ok"
    assert (code_dir / "train.py").read_bytes() == b"print('hi')\n"
    assert took < 10, f"the receiver took {took:.1f}s to take its parent"


def test_the_hub_listens_on_worker_0s_internal_address_or_not_at_all(tmp_path):
    """An internal address that is not the host's own (behind NAT) is one error event naming it.
    Before: the hub listened on every interface instead."""
    from podrun.transport.base import agent_command, agent_source

    step = {"job_id": "bind-test", "job_dir": ".podrun/jobs/bind-test", "worker": 0, "step": "run",
            "cwd": str(tmp_path), "command": "true", "env": {}, "grace": 5, "heartbeat": 5, "detach": False,
            "watch": {"token": secrets.token_hex(16), "worker": 0, "hub_worker": 0, "workers": 2,
                      "bind": "192.0.2.1"}}  # TEST-NET-1: no host's own address
    blob = marshal.dumps(step, 4)
    agent = subprocess.run(["/bin/sh", "-c", agent_command(sys.executable)], cwd=tmp_path, capture_output=True,
                           input=agent_source() + b"%d\n" % len(blob) + blob, timeout=30)
    events = [json.loads(line) for line in agent.stderr.splitlines()]
    assert events == [{"event": "error", "message": "cannot listen on 192.0.2.1, this worker's internal address, "
                       "for the other workers' agents to watch the job: Cannot assign requested address"}]
    assert agent.returncode == 127
