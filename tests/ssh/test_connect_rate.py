"""Many workers on one sshd that refuses handshakes beyond a few at once (MaxStartups), as 1,000 hosts
behind one bastion or one default sshd (MaxStartups 10:30:100) do: podrun opens its connections a
bounded number at a time and retries a handshake dropped before authentication, with backoff, for a
bounded time (podrun/transport/ssh.py)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from helpers import job_id_in, podrun, processes_of_job, stderr_lines_without_traceback

PORTS = range(2201, 2217)  # sshd listens on at most 16 addresses
CROWDED_SSHD_CONFIG = """\
{listen}
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd-crowded.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
# beyond 3 connections not yet authenticated, every new one is dropped (sshd's default is 10:30:100)
MaxStartups 3:100:3
LogLevel ERROR
{homes}"""


@pytest.fixture
def crowded_sshd(lab):
    """A second sshd on lab host 0 (its network, its /root) listening on 16 ports, each port with a
    HOME of its own, that drops every handshake beyond 3 in flight: `host:port` entries for each port."""
    host = lab.hosts[0]
    config = host.dir / "sshd_crowded_config"
    config.write_text(CROWDED_SSHD_CONFIG.format(
        listen="\n".join(f"ListenAddress {host.ip}:{port}" for port in PORTS), dir=host.dir,
        # each port a login directory of its own (the job's files go to .podrun/jobs/ID there, one per
        # job, not per worker), as hosts apart have
        homes="".join(f"Match LocalPort {port}\n  SetEnv HOME=/root/port{port}\n  ForceCommand mkdir -p "
                      f"/root/port{port} && cd /root/port{port} && eval \"$SSH_ORIGINAL_COMMAND\"\n"
                      for port in PORTS)))
    sshd = lab.popen(0, ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)])
    try:
        deadline = time.monotonic() + 20
        while lab.run(0, f"ss -ltn | grep -q ':{PORTS[-1]} '").returncode != 0:
            assert time.monotonic() < deadline, "the crowded sshd did not come up"
            time.sleep(0.05)
        yield [f"{host.ip}:{port}" for port in PORTS]
    finally:
        sshd.kill()
        sshd.wait()


def _flags(lab, hosts: list[str]) -> list[str]:
    """exec's flags for an ad-hoc command (nothing to ship: the entries share one home) on `hosts`."""
    return ["--hosts", ",".join(hosts), "--user", "root", "--identity-file", str(lab.client_key)]


def test_workers_on_one_sshd_that_drops_handshakes_beyond_three_all_connect_and_run(home, lab, crowded_sshd):
    result = podrun("exec", *_flags(lab, crowded_sshd), "--no-collapse", "--", 'echo "worker $PODRUN_WORKER ran"',
                    timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(line.split("] ")[1].strip() for line in result.stdout.splitlines()) == sorted(
        f"worker {index} ran" for index in range(len(PORTS)))
    assert processes_of_job(job_id_in(result.stderr)) == []


class DroppingServer:
    """A TCP server on 127.0.0.1, on several ports, that does what an sshd at its MaxStartups does to
    a new connection: holds it for `hold_s`, then closes it without a word. Counts the connections
    open at once, at most."""

    def __init__(self, ports: int, hold_s: float):
        self.hold_s = hold_s
        self.sockets = [socket.create_server(("127.0.0.1", 0), backlog=128) for _ in range(ports)]
        self.ports = [listener.getsockname()[1] for listener in self.sockets]
        self.lock = threading.Lock()
        self.open_now = self.most_open = self.accepted = 0
        for listener in self.sockets:
            threading.Thread(target=self._serve, args=(listener,), daemon=True).start()

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.open_now += 1
                self.most_open = max(self.most_open, self.open_now)
            threading.Thread(target=self._drop, args=(connection,), daemon=True).start()

    def _drop(self, connection: socket.socket) -> None:
        time.sleep(self.hold_s)  # the client waits for sshd's version line meanwhile
        with self.lock:
            self.open_now -= 1
        connection.close()

    def close(self) -> None:
        for listener in self.sockets:
            listener.close()


def test_handshakes_in_flight_stay_within_the_setting_and_a_host_that_keeps_dropping_is_one_line(home, monkeypatch):
    server = DroppingServer(ports=12, hold_s=0.3)
    monkeypatch.setenv("PODRUN_SSH_HANDSHAKES", "4")
    monkeypatch.setenv("PODRUN_SSH_CONNECT_RETRY", "2")
    try:
        started = time.monotonic()
        result = podrun("exec", "--hosts", ",".join(f"127.0.0.1:{port}" for port in server.ports), "--", "true",
                        timeout=60)
        took_s = time.monotonic() - started
    finally:
        server.close()
    assert result.returncode == 1, result.stderr
    lines = stderr_lines_without_traceback(result.stderr)
    assert lines[-13] == "podrun: error: 12 of 12 workers failed to connect:", lines
    for line, port in zip(lines[-12:], server.ports):
        assert line.startswith(f"  127.0.0.1:{port}: the connection was closed before authentication, "), line
        assert "(sshd's MaxStartups drops handshakes beyond its limit: raise it there, or lower " \
               "PODRUN_SSH_HANDSHAKES (now 4); PODRUN_SSH_CONNECT_RETRY sets the seconds to keep trying)" in line
    assert 1 < server.most_open <= 4  # bounded, and not one at a time
    assert server.accepted > 12  # each was tried again
    assert took_s < 2 + 5 + 10  # the retry time, one last pause at most, start-up on a loaded machine


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("PODRUN_SSH_HANDSHAKES", "0", "PODRUN_SSH_HANDSHAKES='0': expected how many SSH handshakes podrun may have "
                                   "in flight at once, 1 or more (default 32)"),
    ("PODRUN_SSH_CONNECT_RETRY", "soon", "PODRUN_SSH_CONNECT_RETRY='soon': expected the seconds to keep retrying "
                                         "a handshake that sshd dropped, 0 or more (default 60)"),
])
def test_a_bad_connect_setting_is_one_line(home, monkeypatch, variable, value, expected):
    monkeypatch.setenv(variable, value)
    result = podrun("exec", "--hosts", "127.0.0.1:1", "--", "true")
    assert result.returncode == 2, result.stderr
    assert stderr_lines_without_traceback(result.stderr) == [f"podrun: error: {expected}"]
