"""The worker-side agent on its own: the step protocol in, JSON events and exit files out."""

from __future__ import annotations

import json
import marshal
import subprocess
import sys
import threading
import time
from pathlib import Path

from podrun.remote import code_record
from podrun.transport.base import agent_command, agent_source

from helpers import wait_until

STEP_LIMIT_S = 20


def run_agent(tmp_path, command: str, cwd: str, control: bytes = b"",
              probe: dict | None = None, heartbeat: float = 60) -> tuple[bytes, list[dict], int]:
    """Run the agent as the launcher does; `control` follows the step description in the same write."""
    step = {"job_id": "agent-test", "job_dir": ".podrun/jobs/agent-test", "worker": 0, "step": "run", "cwd": cwd,
            "command": command,
            "env": {"PODRUN_JOB_ID": "agent-test", "PODRUN_WORKER": "0"}, "grace": 60, "heartbeat": heartbeat,
            "detach": False, **({"probe": probe} if probe else {})}
    blob = marshal.dumps(step, 4)
    agent = subprocess.Popen(["/bin/sh", "-c", agent_command(sys.executable)], cwd=tmp_path,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    agent.stdin.write(agent_source() + b"%d\n" % len(blob) + blob + control)
    agent.stdin.flush()
    watchdog = threading.Timer(STEP_LIMIT_S, agent.kill)  # a stuck agent fails the test, not hangs it
    watchdog.start()
    output = agent.stdout.read()  # the launcher keeps stdin open while the step runs
    events = [json.loads(line) for line in agent.stderr.read().splitlines()]
    watchdog.cancel()
    agent.stdin.close()
    return output, events, agent.wait()


def test_a_step_reports_start_and_exit_and_leaves_its_exit_file(tmp_path):
    output, events, code = run_agent(tmp_path, "echo out; echo err >&2; exit 3", str(tmp_path))
    assert output == b"out\nerr\n"
    assert [e["event"] for e in events] == ["started", "exited"]
    assert events[1] == {"event": "exited", "code": 3, "signal": None, "rank": None, "killed": False,
                         "stop_reason": None}
    assert code == 3
    exit_file = tmp_path / ".podrun" / "jobs" / "agent-test" / "run.exit"
    recorded = json.loads(exit_file.read_text())
    assert time.time() - 60 < recorded.pop("ended_at") <= time.time()
    assert recorded == {"code": 3, "signal": None, "stop_reason": None, "cause_worker": None, "cause_code": None,
                        "rank": None, "stalled": None, "stalled_at": None, "killed": False}


def test_a_step_that_cannot_start_is_an_error_event_naming_why(tmp_path):
    missing = tmp_path / 'no "such" dir\n'
    _, events, code = run_agent(tmp_path, "true", str(missing))
    assert code == 127
    assert events[-1]["event"] == "error"
    assert events[-1]["message"] == f"cannot start 'true' in {missing}: [Errno 2] No such file or directory"


def test_a_stop_sent_right_behind_the_step_stops_it(tmp_path):
    # read together with the step description, the stop must still count; missed, the step would
    # run on until the grace period (60 s) or the next heartbeat
    output, events, code = run_agent(tmp_path, "echo up; exec sleep 60", str(tmp_path), control=b"stop\n")
    assert events[-1] == {"event": "exited", "code": 143, "signal": "SIGTERM", "rank": None,
                          "killed": False, "stop_reason": "stop requested"}
    exit_file = tmp_path / ".podrun" / "jobs" / "agent-test" / "run.exit"
    assert json.loads(exit_file.read_text())["stop_reason"] == "stop requested"


def test_the_compiled_agent_is_cached_per_source_and_a_broken_cache_entry_is_not_used(tmp_path):
    run_agent(tmp_path, "true", str(tmp_path))
    cache = tmp_path / ".podrun" / "cache"
    [entry] = [entry for entry in cache.iterdir() if entry.name.startswith("agent-")]  # beside the modules it imports
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / ".podrun").stat().st_mode & 0o777) == "0o700"
    entry.write_bytes(b"not marshal data")
    output, events, code = run_agent(tmp_path, "echo still runs", str(tmp_path))
    assert (output, events[-1], code) == (b"still runs\n", {"event": "exited", "code": 0, "signal": None, "rank": None,
                                                             "killed": False, "stop_reason": None}, 0)
    assert entry.read_bytes() != b"not marshal data"  # compiled again and stored again


def test_a_probing_agent_reports_the_code_dir_and_starts_only_on_go(tmp_path):
    (tmp_path / "code").mkdir()
    code_record.create(str(tmp_path / "code"), str(tmp_path / "code.files"))  # as the relay unpacks it
    output, events, code = run_agent(tmp_path, "echo ran", "code", control=b"go\n", probe={"code_dir": "code"})
    assert events[:2] == [{"event": "hello"},
                          {"event": "probe", "code": 1, "changed": "", "changed_count": 0, "holders": ""}]
    assert (output, events[-1]["event"], code) == (b"ran\n", "exited", 0)

    output, events, code = run_agent(tmp_path, "echo ran", "code", control=b"stop\n", probe={"code_dir": "absent"})
    # told to stop before go: nothing ran
    assert events == [{"event": "hello"}, {"event": "probe", "code": 0, "changed": "", "changed_count": 0, "holders": ""}]
    assert (output, code) == (b"", 0)


def test_a_probing_agent_that_hears_nothing_before_go_starts_nothing(tmp_path):
    # the launcher went silent (gone, or still starting 1,024 other agents) while the code was not
    # here yet: after its heartbeat timeout the agent ends, without checking out code that never came
    # and says so: the launcher names it (at 1,024 local workers it once named 899 workers "ended with
    # code 0 and no report", which said nothing of why)
    output, events, code = run_agent(tmp_path, "echo ran", "code", probe={"code_dir": "absent"}, heartbeat=0.5)
    assert events == [{"event": "hello"}, {"event": "probe", "code": 0, "changed": "", "changed_count": 0, "holders": ""},
                      {"event": "error", "message": "no word from the launcher for 0.5s while waiting to start"}]
    assert (output, code) == (b"", 0)


def test_a_probe_names_a_holder_whose_argv_holds_a_newline_on_one_line(tmp_path):
    accelerator = tmp_path / "accel0"
    accelerator.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); print('holding', "
                               "flush=True); time.sleep(60)", str(accelerator), "line one\nline\ttwo"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n"
        (tmp_path / "code").mkdir()
        _, events, _ = run_agent(tmp_path, "echo ran", "code", control=b"stop\n",
                                 probe={"code_dir": "", "accelerator_files": str(tmp_path / "accel*")})
        probe = next(event for event in events if event["event"] == "probe")
        assert probe["holders"] == (f"{holder.pid}\t{accelerator}\t{sys.executable} -c import sys, time; f = "
                                    f"open(sys.argv[1]); print('holding', flush=True); time.sleep(60) {accelerator} "
                                    "line one\\nline\\ttwo")
    finally:
        holder.kill()
        holder.wait()


def test_an_agent_that_comes_after_the_jobs_failure_is_told_to_stop_at_once():
    import socket

    from podrun.remote import agent_io, hub

    watch = hub.Hub({"token": "t0ken", "worker": 0, "workers": 2, "bind": "127.0.0.1"}, "/nonexistent")
    watch.attach(agent_io.Poller(), lambda worker, code: None, lambda silent_s: None, lambda away_s: None)
    watch.step_ended(3)  # worker 0's own run failed before worker 1's agent said hello
    late = socket.create_connection(("127.0.0.1", watch.port), timeout=5)
    late.sendall(b"hello t0ken 1\n")
    watch.ready(watch.listener.fileno())  # accepted
    (fd,) = watch.strangers
    watch.ready(fd)  # its hello
    assert late.recv(64) == b"stop 0 3\n"
    late.close()


def test_a_daemon_the_step_leaves_behind_is_stopped_even_without_the_jobs_environment(tmp_path):
    # a grandchild in a session of its own whose parent is gone by the time the step ends, its
    # environment cleared: only the agent's tree (it is a child subreaper) still knows it as the step's
    command = """
        ( setsid env -i sleep 303 < /dev/null > /dev/null 2>&1 & echo $! > daemon.pid )
        daemon=$(cat daemon.pid)
        while [ "$(ps -o comm= -p "$daemon")" != sleep ]; do sleep 0.01; done
        echo "daemon $daemon under $(ps -o ppid= -p "$daemon")"
    """
    output, events, code = run_agent(tmp_path, command, str(tmp_path))
    assert code == 0, events
    daemon, parent = (int(word) for word in output.split()[1::2])
    assert parent != 1  # re-parented to the agent, not to init

    def daemon_alive() -> bool:
        try:
            state = Path(f"/proc/{daemon}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command_line = Path(f"/proc/{daemon}/cmdline").read_bytes()
        except OSError:
            return False
        return state != "Z" and command_line == b"sleep\x00303\x00"

    wait_until(lambda: not daemon_alive(), "the daemon the step left behind to be stopped", timeout=5)
