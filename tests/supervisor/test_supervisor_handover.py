"""Handing a job to a supervisor host (issue 28): bad input is one line, the secrets travel only as
the workers' environment does, and a supervisor that dies leaves nothing running and says `lost`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from podrun import __version__, jobstore
from podrun.supervisor import greeting
from podrun.transport.past_login import MARK

from helpers import job_id_in, podrun, processes_of_job, stderr_lines_without_traceback, wait_until


def supervised(hosts_spec, supervisor, body: str, env: str = "") -> Path:
    """A spec on lab hosts 0 and 1 handed to the supervisor host."""
    path_env = f"PATH: '{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin'"
    return hosts_spec(f"{body}\nenv: {{{path_env}{', ' + env if env else ''}}}\n{supervisor.spec}", hosts=(0, 1))


@pytest.mark.parametrize("flag, expected", [
    ("not a host!", "--supervisor 'not a host!': expected host, user@host, host:port or user@host:port"),
    ("me@host:99999", "--supervisor 'me@host:99999': expected host, user@host"),
])
def test_a_bad_supervisor_flag_is_one_line(home, job_file, flag, expected):
    result = podrun("exec", job_file("run: 'true'\n"), "--supervisor", flag)
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr) == [f"podrun: error: {expected}"] or \
        expected in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def detached(spec: Path) -> tuple[subprocess.CompletedProcess, str]:
    """`exec SPEC --detach`, which succeeded: its result and the job's id."""
    started = podrun("exec", spec, "--detach")
    assert started.returncode == 0, started.stderr
    return started, job_id_in(started.stderr)


def stop_leaves_nothing(job_id: str) -> None:
    assert podrun("stop", job_id).returncode == 0
    assert processes_of_job(job_id) == []


def failed_handover(job_file, lab, supervisor, target: str):
    """`exec --detach` of a job on `target` handed to the supervisor, which fails: the result and its error lines."""
    spec = job_file(f"target: {target}\nssh: {{user: root, identity_file: {lab.client_key}}}\nrun: 'true'\n"
                    f"{supervisor.spec}")
    result = podrun("exec", spec, "--detach")
    assert result.returncode == 1, result.stderr
    return result, [line for line in stderr_lines_without_traceback(result.stderr) if "error" in line]


def jobs_on(supervisor) -> set[str]:
    """The job directories in the supervisor host's ~/.podrun/jobs."""
    jobs = supervisor.home / ".podrun" / "jobs"
    return {job.name for job in jobs.iterdir()} if jobs.is_dir() else set()


def test_an_unreachable_supervisor_is_one_line_and_leaves_no_record(home, job_file):
    with __import__("socket").socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = podrun("exec", job_file("run: 'true'\n"), "--supervisor", f"root@127.0.0.1:{port}")
    assert result.returncode == 1
    lines = stderr_lines_without_traceback(result.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"podrun: error: supervisor root@127.0.0.1:{port}: ") \
        and "cannot connect" in lines[0], result.stderr
    assert not (home / "jobs").exists() or not list((home / "jobs").iterdir())


@pytest.mark.slow
def test_secrets_reach_the_workers_but_no_file_or_command_line_on_the_supervisor(home, lab, hosts_spec,
                                                                              supervisor, monkeypatch):
    exported, written = "exported-" + os.urandom(8).hex(), "written-" + os.urandom(8).hex()
    monkeypatch.setenv("HF_TOKEN", exported)
    spec = supervised(hosts_spec, supervisor,
                      "secret_env: [HF_TOKEN]\n"
                      "run: 'echo got $(printf %s \"$HF_TOKEN$WANDB_API_KEY\" | sha256sum | cut -c1-16); exec sleep 600'",
                      env=f"WANDB_API_KEY: {written}")
    _, job_id = detached(spec)
    digest = hashlib.sha256((exported + written).encode()).hexdigest()[:16]
    wait_until(lambda: f"got {digest}" in podrun("logs", job_id, "--worker", "1").stdout, "worker 1's line", timeout=30)
    command_lines = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in os.listdir("/proc") if pid.isdigit()
                     and os.path.exists(f"/proc/{pid}/cmdline")]
    assert not [line for line in command_lines if exported.encode() in line or written.encode() in line]
    found = subprocess.run(["grep", "-rlF", "-e", exported, "-e", written, str(supervisor.home)],
                           capture_output=True, text=True)
    assert found.stdout == "", f"secret values in files on the supervisor: {found.stdout}"
    stop_leaves_nothing(job_id)


def test_a_worker_the_supervisor_cannot_reach_stops_the_handover_in_one_line(home, lab, job_file, supervisor):
    result, error = failed_handover(job_file, lab, supervisor, f"{{hosts: [{lab.hosts[0].ip}, '{lab.hosts[1].ip}:2222']}}")
    assert error == [f"podrun: error: on the supervisor root@{supervisor.ip}: {lab.hosts[1].ip}:2222: "
                     f"cannot connect: Connection refused"], result.stderr
    job_id = job_id_in(result.stderr)
    listed = json.loads(podrun("jobs", "--json").stdout)
    assert [(job["id"], job["state"]) for job in listed] == [(job_id, "failed")]  # as the supervisor recorded it
    assert processes_of_job(job_id) == []


@pytest.mark.slow
def test_a_supervisor_without_google_credentials_says_what_to_run_there(home, lab, tpu_api, job_file, supervisor):
    shutil.rmtree(supervisor.home / ".config" / "gcloud")  # as on a VM whose service account has no TPU role
    before = jobs_on(supervisor)  # a test that ran a worker on that host wrote there too
    result, error = failed_handover(job_file, lab, supervisor, "{tpu: {name: life, accelerator_type: v4-16}}")
    assert len(error) == 1 and error[0].startswith(f"podrun: error: on the supervisor root@{supervisor.ip}: ") \
        and "gcloud auth application-default login" in error[0], result.stderr
    assert podrun("jobs", "--json").stdout.strip() == "[]"  # nothing began: no pointer left behind
    assert not tpu_api.nodes
    assert jobs_on(supervisor) == before  # nor what podrun said there


def test_a_key_the_supervisor_lacks_gives_way_to_its_own_and_a_refusal_names_the_supervisor(home, lab, job_file,
                                                                                         supervisor, tmp_path,
                                                                                         monkeypatch):
    laptop_home = tmp_path / "laptop"
    laptop_home.mkdir()
    shutil.copy(lab.client_key, laptop_home / "lab-key")  # ~/lab-key here; the supervisor's ~ has none
    monkeypatch.setenv("HOME", str(laptop_home))
    spec = job_file(f"target: {{hosts: [{lab.hosts[0].ip}, {lab.hosts[1].ip}]}}\n"
                    f"ssh: {{user: root, identity_file: ~/lab-key}}\nrun: 'true'\n{supervisor.spec}")
    result = podrun("exec", spec)
    assert result.returncode == 1, result.stderr
    lines = stderr_lines_without_traceback(result.stderr)
    assert f"podrun: ssh.identity_file: ~/lab-key is not on the supervisor {supervisor.address}; it uses a key of " \
           f"its own" in result.stderr
    failure = lines[next(n for n, line in enumerate(lines) if "error" in line):]
    assert failure == [f"podrun: error: on the supervisor {supervisor.address}: 2 of 2 workers failed to connect:",
                       *(f"  {lab.hosts[i].ip}: key refused for user root (identity file: ssh defaults)" for i in (0, 1))
                       ], result.stderr


@pytest.mark.slow
def test_stacks_of_a_supervised_job_come_through_its_supervisor_and_are_kept_there(home, lab, hosts_spec, supervisor):
    spec = supervised(hosts_spec, supervisor, "run: python3 -c 'import time; print(\"up\", flush=True); time.sleep(600)'")
    _, job_id = detached(spec)
    wait_until(lambda: "up" in podrun("logs", job_id, "--worker", "1").stdout, "worker 1's first line", timeout=30)
    shown = podrun("stacks", job_id, "--all")
    assert shown.returncode == 0, shown.stderr
    assert "── worker 0 (" in shown.stdout and "── worker 1 (" in shown.stdout and "sleep" in shown.stdout, shown.stdout
    assert (supervisor.job_dir(job_id) / "stacks" / "1" / "w1.txt").is_file()
    stop_leaves_nothing(job_id)


@pytest.mark.slow
def test_a_detached_handover_keeps_what_podrun_says_there_but_not_a_second_copy_of_the_output(home, lab, hosts_spec,
                                                                                            supervisor):
    spec = supervised(hosts_spec, supervisor, "run: 'while true; do echo tick; sleep 0.05; done'")
    started, job_id = detached(spec)
    said_there = supervisor.job_dir(job_id) / "console" / "stderr"
    assert f"(what podrun says there: /root/.podrun/jobs/{job_id}/console/stderr)" in started.stderr
    assert "── run (2 SSH hosts) ──" in said_there.read_text()
    console = said_there.with_name("stdout")
    size = console.stat().st_size
    log = supervisor.job_dir(job_id) / "w1.log"
    grown_from = log.stat().st_size
    wait_until(lambda: log.stat().st_size > grown_from + 100, "worker 1's log to grow on the supervisor")
    assert console.stat().st_size == size  # the workers' lines are in their logs, once
    assert podrun("stop", job_id).returncode == 0


def ended_and_removed_on_the_supervisor(hosts_spec, supervisor) -> str:
    """A detached job that ended on the supervisor, whose launcher and supervisor there have exited, and
    whose record the user then removed there (`rm -r ~/.podrun/jobs/ID`), while the laptop last knew it
    running: its id."""
    _, job_id = detached(supervised(hosts_spec, supervisor, "run: 'echo done'"))
    wait_until(lambda: supervisor.record(job_id)["state"] == "succeeded", "the job to end on the supervisor")
    record = supervisor.record(job_id)
    # the supervisor forgets what adopting the job takes after it recorded the end
    wait_until(lambda: not any(jobstore.is_alive(record[process]) for process in ("launcher", "supervisor")),
               "the launcher and the supervisor there to exit")
    shutil.rmtree(supervisor.job_dir(job_id))
    return job_id


def test_removing_a_jobs_record_on_the_supervisor_removes_all_of_it_there(home, lab, hosts_spec, supervisor):
    job_id = ended_and_removed_on_the_supervisor(hosts_spec, supervisor)
    left = [str(path) for path in (supervisor.home / ".podrun").rglob("*") if job_id in str(path)]
    assert left == []  # what podrun said there (its console files) went with the record


def test_a_pointer_whose_record_vanished_on_the_supervisor_reads_lost_with_why(home, lab, hosts_spec, supervisor):
    job_id = ended_and_removed_on_the_supervisor(hosts_spec, supervisor)
    listing = podrun("jobs", "--json")
    assert listing.returncode == 0, listing.stderr
    assert f"podrun: supervisor {supervisor.address}: job {job_id} has no record there any more; it reads lost" \
        in listing.stderr.splitlines()
    job = next(job for job in json.loads(listing.stdout) if job["id"] == job_id)
    assert (job["state"], job["exit_code"], job["summary"]) == (
        "lost", 255, f"the supervisor {supervisor.address} has no record of it")
    again = podrun("jobs")  # kept: not asked again
    assert "lost" in next(line for line in again.stdout.splitlines() if line.startswith(job_id))
    assert again.stderr == ""


# --- the podrun a handover starts there: found once, then started at once (supervisor/greeting.py)

@pytest.fixture
def cold(monkeypatch):
    """Each command on the supervisor starts its own podrun (no warm one: supervisor/warm.py), so that a
    podrun that notes its commands (logging_podrun) sees every one."""
    monkeypatch.setenv("PODRUN_SUPERVISOR_WARM", "off")


def logging_podrun(supervisor, log: Path, body: str) -> Path:
    """The supervisor's podrun replaced by a script that notes each command it runs (its first argument) in
    `log`, then runs `body`."""
    supervisor.podrun.write_text(f'#!/bin/sh\necho "$1" >> {log}\n{body}')
    return supervisor.podrun


def commands_run(log: Path, *names: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if line in names] if log.exists() else []


def test_a_second_handover_asks_for_no_version_and_still_reports_a_failed_start(cold, home, lab, hosts_spec, supervisor,
                                                                                job_file, tmp_path):
    log = tmp_path / "commands"
    this_podrun = supervisor.podrun.read_text().splitlines()[-1]
    logging_podrun(supervisor, log, this_podrun)
    _, job_id = detached(supervised(hosts_spec, supervisor, "run: 'exec sleep 600'"))
    assert commands_run(log, "--version", "_supervise") == ["--version", "_supervise"]
    stop_leaves_nothing(job_id)
    log.unlink()
    # the podrun found there is remembered: the next handover starts it at once, and a worker it cannot
    # reach still fails `--detach` in one line, as the first handover's did
    result, error = failed_handover(job_file, lab, supervisor, f"{{hosts: [{lab.hosts[0].ip}, '{lab.hosts[1].ip}:2222']}}")
    assert error == [f"podrun: error: on the supervisor root@{supervisor.ip}: {lab.hosts[1].ip}:2222: "
                     f"cannot connect: Connection refused"], result.stderr
    assert commands_run(log, "--version", "_supervise") == ["_supervise"]
    failed = job_id_in(result.stderr)
    listed = json.loads(podrun("jobs", "--json").stdout)
    assert sorted((job["id"], job["state"]) for job in listed) == sorted([(job_id, "stopped"), (failed, "failed")])


def test_a_remembered_podrun_of_another_version_gets_no_job_and_the_host_is_asked_again(cold, home, lab, hosts_spec,
                                                                                       supervisor, tmp_path,
                                                                                       monkeypatch):
    log = tmp_path / "commands"
    this_podrun = supervisor.podrun.read_text()
    _, job_id = detached(supervised(hosts_spec, supervisor, "run: 'exec sleep 600'"))
    stop_leaves_nothing(job_id)
    # the same path now holds an older podrun, which knows no greeting: whatever it is sent, it notes
    stdin_log = tmp_path / "its-stdin"
    logging_podrun(supervisor, log, f"read -r first; echo \"$first\" >> {stdin_log}\ncat <&0 >> {stdin_log} &\n"
                   "echo 'podrun 0.0.9'\n")
    secret = "secret-" + os.urandom(8).hex()
    monkeypatch.setenv("HF_TOKEN", secret)
    spec = supervised(hosts_spec, supervisor, "secret_env: [HF_TOKEN]\nrun: 'exec sleep 600'")
    result = podrun("exec", spec, "--detach")
    assert result.returncode == 1, result.stderr
    assert stderr_lines_without_traceback(result.stderr) == [
        f"podrun: error: supervisor {supervisor.address}: supervisor.podrun {supervisor.podrun}: podrun 0.0.9 at "
        f"{supervisor.podrun} there, and this podrun is {__version__}; install podrun {__version__} there, or leave "
        f"supervisor.podrun out and podrun installs itself into ~/.podrun/venv on that host"], result.stderr
    assert commands_run(log, "--version", "_supervise") == ["_supervise", "--version"]
    wait_until(lambda: stdin_log.read_text().startswith(f"podrun {__version__}\n"), "the version it was sent")
    assert secret not in stdin_log.read_text()  # never the job: its channel closed with the laptop's podrun
    assert [job["id"] for job in json.loads(podrun("jobs", "--json").stdout)] == [job_id]
    # this podrun back in its place: the host is asked again, and the job handed over
    supervisor.podrun.write_text(this_podrun)
    _, job_id = detached(spec)
    stop_leaves_nothing(job_id)


def test_supervise_of_another_version_answers_with_its_own_and_takes_no_job(home):
    job = json.dumps({"spec": {}, "options": {}}).encode()
    answered = subprocess.run([sys.executable, "-m", "podrun", "_supervise"], input=b"podrun 0.0.9\n" + job + b"\n",
                              capture_output=True, timeout=60)
    assert (answered.returncode, answered.stdout, answered.stderr) == (
        2, f"@podrun:version=podrun {__version__}\n".encode(), b"")
    assert not (home / "jobs").exists()
    assert greeting.ANSWER.startswith(MARK)


def supervise_processes() -> list[int]:
    """podrun _supervise processes on any lab host (the lab's hosts share this machine's processes)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if b"\0_supervise" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
    return found


def remembered_supervisor(hosts_spec, supervisor, log: Path) -> None:
    """A first handover, through a podrun that notes its commands in `log` (then emptied): the laptop now
    remembers the supervisor's podrun and how it reached the host."""
    logging_podrun(supervisor, log, supervisor.podrun.read_text().splitlines()[-1])
    _, job_id = detached(supervised(hosts_spec, supervisor, "run: 'exec sleep 600'"))
    stop_leaves_nothing(job_id)
    log.unlink()


def test_a_refused_spec_for_a_known_supervisor_is_one_line_and_what_began_there_ends(cold, home, lab, hosts_spec,
                                                                                   supervisor, tmp_path):
    log = tmp_path / "commands"
    remembered_supervisor(hosts_spec, supervisor, log)
    result = podrun("exec", supervised(hosts_spec, supervisor, "run: 'true'\nrestarts: {max: -1}"), "--detach")
    assert result.returncode == 2, result.stderr
    lines = stderr_lines_without_traceback(result.stderr)
    assert len(lines) == 1 and "restarts.max" in lines[0], result.stderr
    assert commands_run(log, "--version", "_supervise") == ["_supervise"]  # begun while the spec loaded
    wait_until(lambda: supervise_processes() == [], "the _supervise begun there to end")
    assert len(json.loads(podrun("jobs", "--json").stdout)) == 1  # the first job's alone, here and there
    assert len(list((supervisor.home / ".podrun" / "jobs").iterdir())) == 1


def test_a_spec_that_reaches_the_supervisor_another_way_hands_over_on_a_new_connection(cold, home, lab, hosts_spec,
                                                                                      supervisor, tmp_path):
    log = tmp_path / "commands"
    remembered_supervisor(hosts_spec, supervisor, log)
    spec = supervised(hosts_spec, supervisor, "run: 'exec sleep 600'")
    spec.write_text(spec.read_text().replace("ssh: {user: root,", "ssh: {user: root, port: 22,"))
    _, job_id = detached(spec)
    # the connection begun with what the laptop remembered is closed, and its _supervise ends unused
    assert commands_run(log, "--version", "_supervise") == ["_supervise", "_supervise"]
    assert supervisor.record(job_id)["state"] == "running"
    stop_leaves_nothing(job_id)
    wait_until(lambda: supervise_processes() == [], "every _supervise there to end")


def test_a_podrun_whose_version_matches_but_that_answers_no_greeting_gets_no_job(home, lab, hosts_spec, supervisor,
                                                                               tmp_path):
    stdin_log = tmp_path / "its-stdin"
    # a podrun from before the greeting, of this version: it reads the job from its first line (and, from
    # before the warm podrun too, refuses `_warm` as argparse does)
    supervisor.podrun.write_text(f'#!/bin/sh\n[ "$1" = --version ] && exec echo "podrun {__version__}"\n'
                                 f'[ "$1" = _warm ] && exit 2\nread -r first; echo "$first" >> {stdin_log}\n')
    result = podrun("exec", supervised(hosts_spec, supervisor, "run: 'true'"), "--detach")
    assert result.returncode == 1, result.stderr
    assert stderr_lines_without_traceback(result.stderr) == [
        f"podrun: error: supervisor {supervisor.address}: {supervisor.podrun} there says it is podrun {__version__} "
        f"(--version), but `{supervisor.podrun} _supervise` answered nothing to the handover; install podrun "
        f"{__version__} there"], result.stderr
    assert stdin_log.read_text() == f"podrun {__version__}\n"  # what it was sent: the version wanted, no job
    assert json.loads(podrun("jobs", "--json").stdout) == []


# --- the warm podrun (supervisor/warm.py): after the first command, the host's commands start no podrun

def warm_podrun(supervisor) -> int | None:
    """The pid of the warm podrun serving on the supervisor (its lock file says it), if it runs."""
    for lock in (supervisor.home / ".podrun" / "warm").glob("*.lock"):
        pid = lock.read_text().strip()
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            return int(pid)
    return None


def test_the_warm_podrun_forks_the_next_handover_and_its_stop_and_a_killed_one_is_replaced(home, lab, hosts_spec,
                                                                                          supervisor, tmp_path):
    log = tmp_path / "commands"
    remembered_supervisor(hosts_spec, supervisor, log)  # the first handover started the warm podrun
    wait_until(lambda: warm_podrun(supervisor), "the warm podrun to serve")
    spec = supervised(hosts_spec, supervisor, "run: 'echo warm-run; exec sleep 600'")
    _, job_id = detached(spec)
    shown = podrun("logs", job_id)
    assert "warm-run" in shown.stdout, shown.stderr
    assert commands_run(log, "--version", "_supervise", "logs", "jobs") == []  # no podrun started for them
    # killed outright: the job it forked goes on, and the next command runs the podrun and starts another
    warm = warm_podrun(supervisor)
    os.kill(warm, signal.SIGKILL)
    running = processes_of_job(job_id)
    assert any("sleep 600" in process for process in running), running
    assert supervisor.record(job_id)["state"] == "running"
    stop_leaves_nothing(job_id)
    assert commands_run(log, "stop") == ["stop"]
    wait_until(lambda: warm_podrun(supervisor) not in (None, warm), "a warm podrun again")
