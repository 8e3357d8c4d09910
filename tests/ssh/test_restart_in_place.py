"""A restart on the same hosts starts on the connections the attempt before left open (launch/attempt_loop.py):
it neither connects nor ships again. A worker's connection that dropped is made again. Run under
`flock /tmp/podrun-lab.lock`."""

from __future__ import annotations

import contextlib
import os
import re
import signal

import pytest

from helpers import Background, job_id_in, podrun, sshd_sessions

pytestmark = pytest.mark.lab

# each attempt says which connection it came over: the client's port of $SSH_CONNECTION is the connection's.
# With FAIL, worker 0 fails attempt 0 once every worker said so (lab hosts share this machine's /tmp)
SAYS_ITS_CONNECTION = """\
restarts: {max: 1, on: [failure]}
run: |
  set -- $SSH_CONNECTION
  echo "attempt $PODRUN_ATTEMPT: worker $PODRUN_WORKER over port $2"
  [ "$PODRUN_ATTEMPT" = 1 ] && exit 0
  [ -z "$FAIL" ] || touch "/tmp/podrun-said-$PODRUN_JOB_ID-$PODRUN_WORKER"
  if [ "$PODRUN_WORKER" = 0 ] && [ -n "$FAIL" ]; then
    until [ "$(ls /tmp/podrun-said-$PODRUN_JOB_ID-* | wc -l)" -ge "$PODRUN_NUM_WORKERS" ]; do sleep 0.05; done
    rm -f /tmp/podrun-said-$PODRUN_JOB_ID-*
    exit 3
  fi
  sleep 60
"""


def ports_by_attempt(job_id: str, workers: int) -> dict[int, dict[int, str]]:
    """{worker: {attempt: the client port its run came over}}, from the logs each attempt kept."""
    found: dict[int, dict[int, str]] = {}
    for index in range(workers):
        text = "".join(podrun("logs", job_id, "--worker", str(index), "--attempt", str(attempt)).stdout
                       for attempt in (0, 1))
        found[index] = {int(attempt): port for attempt, port in
                        re.findall(rf"attempt (\d): worker {index} over port (\d+)", text)}
    return found


def test_a_restart_on_the_same_hosts_runs_over_the_connections_it_had(home, hosts_spec):
    spec = hosts_spec(SAYS_ITS_CONNECTION + "env: {FAIL: '1'}\n")
    result = podrun("exec", spec)
    assert result.returncode == 0, result.stderr
    assert "running again on the same workers (worker 0 exited with code 3 in run)" in result.stderr
    restarted = result.stderr.split("running again on the same workers", 1)[1]  # attempt 1 shipped nothing
    assert "code unchanged on every worker" in restarted and "shipped code" not in restarted, result.stderr
    ports = ports_by_attempt(job_id_in(result.stderr), 3)
    for index, by_attempt in ports.items():
        assert set(by_attempt) == {0, 1}, ports
        assert by_attempt[0] == by_attempt[1], f"worker {index} connected again: {ports}"


def test_a_worker_whose_connection_dropped_is_connected_again_for_the_restart(home, lab, hosts_spec, monkeypatch):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0")
    running = Background("exec", hosts_spec(SAYS_ITS_CONNECTION))
    running.wait_for("attempt 0: worker 1 over port")
    serving = sshd_sessions(lab.hosts[1].namespace)
    assert serving, "worker 1's connection is served by an sshd process"
    for pid in serving:  # its connection drops; the host and its sshd stay
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert running.finish() == 0, running.text
    assert "worker 1 (" in running.text and "lost its connection" in running.text, running.text
    ports = ports_by_attempt(job_id_in(running.text), 3)
    assert ports[1][0] != ports[1][1], f"worker 1 ran over its dropped connection: {ports}"
    assert ports[0][0] == ports[0][1] and ports[2][0] == ports[2][1], ports
