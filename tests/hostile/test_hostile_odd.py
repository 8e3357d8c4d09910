"""Hostile hosts and hostile output (issue 27, items 4, 12, 13 and 18): a host whose login hangs, a login
that talks on stderr, rank headers no torchrun writes, and a pid in run.agent that is no longer the agent's."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import time
from contextlib import contextmanager

import pytest

from podrun.worker_output import WorkerOutput

from helpers import (
    Background,
    crashed,
    job_id_in,
    job_record,
    podrun,
    podrun_own_usage,
    processes_of_job,
    ps_on_every_host,
    wait_until,
)

HUNG_SLEEP = "sleep 6071"  # what a hanging login runs; the test kills these by their recorded pids


@contextmanager
def login_script(lab, index: int, script: str):
    """Host `index` runs `script` (sh) at every login, before any command (sshd's ~/.ssh/rc), until the block ends."""
    rc = lab.hosts[index].home / ".ssh" / "rc"
    rc.write_text(script)
    try:
        yield
    finally:
        rc.unlink()
        pids = lab.hosts[index].home / "hung.pids"
        for pid in pids.read_text().split() if pids.exists() else []:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        pids.unlink(missing_ok=True)


HANGING_LOGIN = f"echo $$ >> ~/hung.pids\nexec {HUNG_SLEEP}\n"


def interrupted_once_said(args: list, pattern: str, signum: int) -> tuple[int, float, str]:
    """Run `podrun ARGS`, send it `signum` once it printed a line matching `pattern` (within 20 s): its exit
    code, the seconds it took to end after the signal, and its output."""
    running = Background(*args)
    try:
        running.wait_for(pattern, timeout=20)
        running.process.send_signal(signum)
        signalled = time.monotonic()
        code = running.finish(timeout=60)
    finally:
        running.process.kill()
    return code, time.monotonic() - signalled, running.text


# --- item 4: a host whose login hangs

@pytest.mark.slow
def test_exec_names_a_host_whose_login_hangs_and_sigterm_ends_it_in_seconds(lab, hosts_spec, home):
    spec = hosts_spec("run: echo hi\n", hosts=(0, 1))
    with login_script(lab, 1, HANGING_LOGIN):
        code, took_s, text = interrupted_once_said(
            ["exec", spec], rf"waiting for worker 1 \({lab.hosts[1].ip}\) to start podrun's agent .*~/\.bashrc",
            signal.SIGTERM)
    assert code == 143, text
    assert took_s < 10, f"podrun took {took_s:.1f}s to end after SIGTERM"
    assert not crashed(text)
    assert ps_on_every_host(lab, job_id_in(text)) == []


@pytest.mark.slow
def test_exec_gives_up_on_a_host_whose_login_hangs_naming_it(lab, hosts_spec, home):
    spec = hosts_spec("run: echo hi\n", hosts=(0, 1))
    with login_script(lab, 1, HANGING_LOGIN):
        started = time.monotonic()
        result = podrun("exec", spec, timeout=120)
        took_s = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert not crashed(result.stderr)
    assert (f"podrun: error: worker 1 ({lab.hosts[1].ip}): did not start podrun's agent within 30s "
            "(does a login there wait: ~/.bashrc, ~/.ssh/rc, a ForceCommand?)") in result.stderr
    assert took_s < 60
    assert ps_on_every_host(lab, job_id_in(result.stderr)) == []


@pytest.mark.slow
def test_disk_names_a_host_whose_login_hangs_and_ctrl_c_ends_it(lab, hosts_spec, home):
    spec = hosts_spec("run: echo hi\n", hosts=(0, 1))
    with login_script(lab, 1, HANGING_LOGIN):
        code, took_s, text = interrupted_once_said(
            ["disk", spec], rf"waiting for worker 1 \({lab.hosts[1].ip}\) to report podrun's disk use", signal.SIGINT)
    assert code == 130 and took_s < 10, text
    assert not crashed(text)


# --- item 12: a login that talks on stderr

@pytest.mark.slow
def test_a_chatty_login_breaks_neither_jobs_nor_logs_of_a_detached_job(lab, hosts_spec, home, tmp_path):
    release = tmp_path / "release"
    spec = hosts_spec(f"run: |\n  echo before $PODRUN_WORKER\n  while [ ! -e {release} ]; do sleep 0.1; done\n",
                      hosts=(0, 1))
    launched = podrun("exec", "--detach", spec)
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    try:
        with login_script(lab, 1, "echo 'Welcome to podrun-lab1: last login yesterday' >&2\n"):
            listed = podrun("jobs", "--json")
            assert listed.returncode == 0 and not crashed(listed.stderr), listed.stderr
            job = next(job for job in json.loads(listed.stdout) if job["id"] == job_id)
            assert job["state"] == "running"
            shown = podrun("logs", job_id)
            assert shown.returncode == 0 and not crashed(shown.stderr), shown.stderr
            assert sorted(shown.stdout.splitlines()) == ["[w0] before 0", "[w1] before 1"]
            release.touch()
            wait_until(lambda: ps_on_every_host(lab, job_id) == [], "the job to end", timeout=30)
            ended = json.loads(podrun("jobs", "--json").stdout)
            assert [job["state"] for job in ended if job["id"] == job_id] == ["succeeded"]
    finally:
        release.touch()


# --- item 13: rank headers no torchrun writes

def test_a_rank_header_of_5000_digits_is_shown_as_text_by_exec_and_logs(home, job_file):
    header = "[rank" + "7" * 5000 + "]:"
    spec = job_file(f"target: {{local: {{workers: 1}}}}\nrun: python3 -c \"print('{header}' + 'hello')\"\n")
    result = podrun("exec", spec)
    assert result.returncode == 0 and not crashed(result.stderr), result.stderr[-2000:]
    assert result.stdout == f"[w0] {header}hello\n"
    shown = podrun("logs", job_id_in(result.stderr))
    assert shown.returncode == 0 and not crashed(shown.stderr), shown.stderr[-2000:]
    assert shown.stdout == f"[w0] {header}hello\n"


def test_a_stream_of_distinct_rank_headers_keeps_a_bounded_number_of_ranks():
    output = WorkerOutput(0, None, io.BytesIO(), keep=10_000)
    output.feed(b"".join(b"[rank%d]:step" % rank for rank in range(5000)))
    assert len(output.lines) <= 1024  # ranks with an unfinished line, each with its state
    output.close()
    # every rank's line was shown once, as it stood: the oldest when newer ranks pushed it out
    assert sorted(output.tail()) == sorted(f"[rank{rank}]:step" for rank in range(5000))


def _peak_rss_mb(*args: str) -> float:
    """The peak resident memory of `podrun ARGS`, run to its end."""
    result, peak_mb, _ = podrun_own_usage(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    return peak_mb


@pytest.mark.slow
def test_logs_of_many_distinct_rank_headers_take_no_more_memory_than_one_rank(home, job_file):
    count = 400_000
    printing = "import sys; sys.stdout.write(''.join('[rank%d]:x' % {rank} for i in range({count})))"
    spec = job_file(f"target: {{local: {{workers: 1}}}}\nrun: python3 -c \"{printing.format(rank='i', count=count)}\"\n")
    distinct = job_id_in(podrun("exec", spec).stderr)
    spec = job_file(f"target: {{local: {{workers: 1}}}}\nrun: python3 -c \"{printing.format(rank='1', count=count)}\"\n",
                    name="one")
    one = job_id_in(podrun("exec", spec).stderr)
    growth_mb = _peak_rss_mb("logs", distinct) - _peak_rss_mb("logs", one)
    assert growth_mb < 10, f"400,000 distinct rank headers cost `podrun logs` {growth_mb:.0f} MB more than one rank"


# --- item 18: `podrun stop` and a pid that is not the agent's

def test_stop_leaves_a_stranger_with_the_agents_pid_alone_and_still_stops_the_job(home, job_file):
    spec = job_file("target: {local: {workers: 1}}\nrun: sleep 300\nstop_grace: 2s\n")
    launched = podrun("exec", "--detach", spec)
    assert launched.returncode == 0, launched.stderr
    job_id = job_id_in(launched.stderr)
    root = job_record(home, job_id)["workers"][0]["endpoint"]["root"]
    agent_file = os.path.join(root, ".podrun", "jobs", job_id, "run.agent")
    wait_until(lambda: os.path.exists(agent_file), "the agent's pid file")
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        with open(agent_file, "w") as handle:  # as after pid reuse: the pid is now another process's
            handle.write(str(stranger.pid))
        stopped = podrun("stop", job_id, timeout=60)
        assert stranger.poll() is None, "podrun stop killed a process that was not the job's"
    finally:
        stranger.kill()
        stranger.wait()
    assert stopped.returncode == 0 and not crashed(stopped.stderr), stopped.stderr
    assert f"run.agent names pid {stranger.pid}, which is not this job's agent" in stopped.stderr
    assert f"podrun: job {job_id} is stopped" in stopped.stdout
    assert processes_of_job(job_id) == []
