"""A supervisor host as real ones are (issue 37, part 6): its login talks, its word is checked before the
laptop uses it, and the host keys the laptop holds for the job's hosts go with the job. Run under
`flock /tmp/podrun-lab.lock` (the lab's supervisor host, tests/conftest.py SupervisorHost)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from podrun import __version__
from podrun.jobstore import JobRecord, WorkerRecord
from podrun.report.analysis import Analysis
from podrun.report.goodput import Goodput
from podrun.report.page import page

from helpers import job_id_in, podrun, processes_of_job, stderr_lines_without_traceback, wait_until

WELCOME = "Welcome to the supervisor host: last login yesterday"


@contextlib.contextmanager
def chatty_login(supervisor):
    """The supervisor host's ~/.bashrc prints a line on stdout and one on stderr: bash reads it for every
    command sshd runs (Debian's bash sources it when sshd starts it, interactive or not)."""
    bashrc = supervisor.home / ".bashrc"
    bashrc.write_text(f"echo '{WELCOME}'\necho '{WELCOME} (stderr)' >&2\n")
    try:
        yield
    finally:
        bashrc.unlink()


def hosts_job(hosts_spec, supervisor, run: str) -> Path:
    return hosts_spec(f"{supervisor.spec}run: {run}\n", hosts=(0, 1))


@pytest.mark.slow
def test_a_chatty_login_on_the_supervisor_breaks_neither_the_handover_nor_jobs_logs_report_stop(
        home, lab, hosts_spec, supervisor, tmp_path):
    with chatty_login(supervisor):
        said = podrun("exec", hosts_job(hosts_spec, supervisor, 'echo "up on $PODRUN_WORKER"; exec sleep 600'),
                      "--detach")
        assert said.returncode == 0, said.stderr
        assert WELCOME not in said.stdout + said.stderr
        job_id = job_id_in(said.stderr)
        assert (home / "jobs" / job_id / "job.json").is_file()  # the laptop keeps its pointer

        wait_until(lambda: podrun("logs", job_id, "--worker", "1").stdout == "up on 1\n", "worker 1's line")
        shown = podrun("logs", job_id)
        assert shown.returncode == 0 and WELCOME not in shown.stdout + shown.stderr, shown.stdout + shown.stderr
        assert sorted(shown.stdout.splitlines()) == ["[w0] up on 0", "[w1] up on 1"]

        listed = podrun("jobs", "--json")
        assert listed.returncode == 0 and listed.stderr == "", listed.stderr
        assert [job["state"] for job in json.loads(listed.stdout) if job["id"] == job_id] == ["running"]
        reported = podrun("report", job_id)
        assert reported.returncode == 0 and WELCOME not in reported.stdout + reported.stderr, reported.stderr
        assert (home / "jobs" / job_id / "report.html").is_file()

        stopped = podrun("stop", job_id)
        assert stopped.returncode == 0 and WELCOME not in stopped.stdout + stopped.stderr, stopped.stderr
        assert processes_of_job(job_id) == []
        listed = json.loads(podrun("jobs", "--json").stdout)
        assert [job["state"] for job in listed if job["id"] == job_id] == ["stopped"]


def test_an_attached_handover_through_a_chatty_login_streams_the_jobs_lines_alone(home, lab, hosts_spec, supervisor):
    with chatty_login(supervisor):
        result = podrun("exec", hosts_job(hosts_spec, supervisor, 'echo "hello from $PODRUN_WORKER"'))
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[w0] hello from 0", "[w1] hello from 1"]
    assert WELCOME not in result.stderr
    assert [job["state"] for job in json.loads(podrun("jobs", "--json").stdout)] == ["succeeded"]


# --- a supervisor whose podrun answers what it likes (the spec's supervisor.podrun: a script of the test's)

FAKE_PODRUN = """\
#!{python}
import json, sys
answers = json.load(open({answers!r}))
command = sys.argv[1]
if command == "--version":
    print("podrun {version}")
elif command == "_supervise":
    sys.stdin.readline()  # the version the laptop wants (podrun/supervisor/greeting.py)
    print("@podrun:version=podrun {version}", flush=True)
    sys.stdin.readline()
    print(json.dumps({{"job": answers["job"], "launcher": 1, "console": "/root/.podrun/supervised/x"}}), flush=True)
elif command == "jobs":
    print(json.dumps(answers["records"], indent=1))
else:
    print("podrun of the test: " + " ".join(sys.argv[1:]))
"""


class HostileSupervisor:
    """The lab's supervisor host with a podrun of the test's: `answer(job=..., records=[...])` sets what
    it says to `_supervise` (the started line's job id) and to `jobs --json`."""

    def __init__(self, supervisor, tmp_path: Path):
        self.host = supervisor
        self.answers = tmp_path / "answers.json"
        self.podrun = tmp_path / "hostile-podrun"
        self.podrun.write_text(FAKE_PODRUN.format(python=sys.executable, answers=str(self.answers),
                                                  version=__version__))
        self.podrun.chmod(0o755)
        self.spec = f"supervisor: {{host: {supervisor.address}, podrun: {self.podrun}}}\n"

    def answer(self, job: str, records: list[dict]) -> None:
        self.answers.write_text(json.dumps({"job": job, "records": records}))


@pytest.fixture
def hostile(supervisor, tmp_path):
    return HostileSupervisor(supervisor, tmp_path)


def a_local_job(job_file) -> str:
    """A job of this machine's own, which `podrun jobs` must go on listing: its id."""
    ran = podrun("exec", job_file("target: {local: {workers: 1}}\nrun: 'true'\n", name="own"))
    assert ran.returncode == 0, ran.stderr
    return job_id_in(ran.stderr)


def handed_over(hosts_spec, hostile, job: str) -> subprocess.CompletedProcess:
    hostile.answer(job, [])
    return podrun("exec", hosts_spec(f"{hostile.spec}run: 'true'\n", hosts=(0, 1)), "--detach")


@pytest.mark.parametrize("job", ["../../escaped", "a/b", "..", "job-20260101-000000-abcd/../../escaped",
                                 "job\n-20260101-000000-abcd"])
def test_a_job_id_that_is_no_job_id_is_refused_in_one_line_and_nothing_is_written_outside_the_store(
        home, lab, hosts_spec, hostile, job):
    result = handed_over(hosts_spec, hostile, job)
    assert result.returncode == 1, result.stderr
    errors = [line for line in stderr_lines_without_traceback(result.stderr) if "error" in line]
    assert errors == [f"podrun: error: supervisor {hostile.host.address}: its job id {job!r} is not one "
                      f"(expected job-YYYYMMDD-HHMMSS-XXXX, as podrun makes them); refused"], result.stderr
    assert not (home.parent / "escaped").exists() and not (home / "escaped").exists()
    assert not (home / "jobs").exists() or list((home / "jobs").iterdir()) == []


def supervised_record(job_id: str, lab, **changed) -> dict:
    """A record as a supervisor's `podrun jobs --json` gives it, with `changed` fields."""
    worker = WorkerRecord(0, lab.hosts[0].ip, endpoint={"kind": "ssh", "host": lab.hosts[0].ip, "port": 22,
                                                         "user": "root", "identity_file": None,
                                                         "check_host_keys": True})
    record = JobRecord(id=job_id, name="job", target="hosts:1", spec_path="/x/job.yaml", workers=[worker],
                       started_at=1_790_000_000.0, launcher={"pid": 1, "start": "1"})
    return {**record.to_dict(), **changed}


HOSTILE_FIELDS = [
    ("started_at", "soon", "its started_at is 'soon'; expected epoch seconds"),
    ("attempt", "<script>alert(1)</script>", "its attempt is '<script>alert(1)</script>'; expected a count (0 or more)"),
    ("attempt", -1, "its attempt is -1; expected a count (0 or more)"),
    ("state", "pwned", "its state is 'pwned'; expected one of running, succeeded, failed, stopped, lost, preempted, "
                       "stalled"),
    ("ended_at", [1], "its ended_at is [1]; expected epoch seconds or null"),
    ("workers", [{"index": "0", "address": "x"}], "its workers.0.index is '0'; expected a count (0 or more)"),
    ("attempts", [{"attempt": "<b>", "state": "preempted", "exit_code": 75, "summary": None, "started_at": 1.0,
                   "ended_at": 2.0}], "its attempts.0.attempt is '<b>'; expected a count (0 or more)"),
    ("attempts", [{"attempt": 0}], "its attempts.0.state is missing; expected a value"),
    ("phases", [{"phase": "run", "attempt": 0, "start": "now", "end": None}],
     "its phases.0.start is 'now'; expected epoch seconds"),
    ("price", {"per_hour": -1, "source": "spec cost.per_hour"},
     "its price.per_hour is -1; expected a price above 0 or null"),
    ("price", {"per_hour": 1, "source": "<img>", "pwned": True}, "its price.pwned is True; expected no such field"),
]


@pytest.mark.parametrize("field, value, expected", HOSTILE_FIELDS, ids=[f"{f}={v!r}" for f, v, _ in HOSTILE_FIELDS])
def test_a_record_with_a_bad_field_is_refused_in_one_line_and_jobs_lists_the_others(
        home, lab, hosts_spec, job_file, hostile, field, value, expected):
    own = a_local_job(job_file)
    job_id = "job-20260101-000000-abcd"
    assert handed_over(hosts_spec, hostile, job_id).returncode == 0
    good = supervised_record(job_id, lab)
    hostile.answer(job_id, [supervised_record(job_id, lab, **{field: value})])
    for _ in range(2):  # the refusal leaves the pointer as it was: every later listing works too
        listed = podrun("jobs", "--json")
        assert listed.returncode == 0, listed.stderr
        assert stderr_lines_without_traceback(listed.stderr) == [
            f"podrun: supervisor {hostile.host.address}: job {job_id}: {expected}; refused, shown as last known"]
        assert sorted(job["id"] for job in json.loads(listed.stdout)) == sorted([own, job_id])
    table = podrun("jobs")
    assert table.returncode == 0 and job_id in table.stdout and own in table.stdout, table.stderr
    report = podrun("report", job_id)
    assert report.returncode == 1, report.stderr
    assert stderr_lines_without_traceback(report.stderr) == [
        f"podrun: error: supervisor {hostile.host.address}: job {job_id}: {expected}; refused"]
    hostile.answer(job_id, [good])  # what it says once it says the truth is kept
    assert [job["started_at"] for job in json.loads(podrun("jobs", "--json").stdout) if job["id"] == job_id] == \
        [good["started_at"]]


def test_a_record_refused_leaves_the_other_jobs_of_that_supervisor_read(home, lab, hosts_spec, hostile):
    refused, read = "job-20260101-000000-abcd", "job-20260101-000001-abcd"
    for job_id in (read, refused):  # `jobs` asks for the newest first
        assert handed_over(hosts_spec, hostile, job_id).returncode == 0
    hostile.answer(read, [supervised_record(refused, lab, started_at="soon"),
                          supervised_record(read, lab, state="succeeded", exit_code=0, ended_at=1_790_000_060.0)])
    listed = podrun("jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert stderr_lines_without_traceback(listed.stderr) == [
        f"podrun: supervisor {hostile.host.address}: job {refused}: its started_at is 'soon'; expected epoch seconds; "
        f"refused, shown as last known"]
    assert {job["id"]: job["state"] for job in json.loads(listed.stdout)} == {refused: "running", read: "succeeded"}


def test_the_laptop_never_connects_to_workers_a_supervisor_names(home, lab, hosts_spec, hostile, tmp_path):
    """A supervised job's workers are the supervisor's to reach: an endpoint it sends (here one whose
    ProxyCommand would run on this machine) is kept as nothing, and `jobs` and `report` use none."""
    job_id = "job-20260101-000000-abcd"
    assert handed_over(hosts_spec, hostile, job_id).returncode == 0
    ran = tmp_path / "ran-on-the-laptop"
    record = supervised_record(job_id, lab)
    record["workers"][0]["endpoint"] = {**record["workers"][0]["endpoint"], "proxy_command": f"touch {ran}"}
    hostile.answer(job_id, [record])
    listed = podrun("jobs", "--json")
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    assert [job["workers"][0]["endpoint"] for job in json.loads(listed.stdout) if job["id"] == job_id] == [{}]
    assert podrun("report", job_id).returncode == 0
    assert not ran.exists()


def test_report_html_escapes_what_a_record_holds(home):
    record = JobRecord(id="job-20260101-000000-abcd", name="job", target="hosts:1", spec_path="x",
                       workers=[WorkerRecord(0, "<img src=x>")], started_at=100.0, ended_at=160.0, state="failed",
                       attempt=1, launcher={},
                       attempts=[{"attempt": "<script>alert(1)</script>", "state": "<b>preempted</b>", "exit_code": 1,
                                  "summary": "<i>", "started_at": 100.0, "ended_at": 130.0}])
    analysis = Analysis(record, now=200.0)
    shown = page(analysis, Goodput(analysis))
    assert "<script>alert" not in shown and "<b>" not in shown and "<img" not in shown
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown


# --- host keys the laptop holds for the job's hosts

def test_a_worker_whose_key_differs_from_the_laptops_pin_is_refused_by_the_supervisor(home, lab, hosts_spec,
                                                                                    supervisor, tmp_path,
                                                                                    monkeypatch):
    """The laptop's ~/.ssh/known_hosts knows worker 1 by another key (from before the host was rebuilt, or
    the host is not who it says): the supervisor, which never saw worker 1, refuses it too, where it
    would otherwise trust it on first use."""
    laptop_home = tmp_path / "laptop"
    (laptop_home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(laptop_home))  # the supervisor's ~ is its own /root
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other_key = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    known = laptop_home / ".ssh" / "known_hosts"
    known.write_text(f"{lab.hosts[1].ip} {other_key}\n")
    result = podrun("exec", hosts_job(hosts_spec, supervisor, "'true'"))
    assert result.returncode == 1, result.stderr
    errors = [line for line in stderr_lines_without_traceback(result.stderr) if "error" in line]
    assert errors == [f"podrun: error: on the supervisor {supervisor.address}: {lab.hosts[1].ip}: host key differs "
                      f"from the one recorded for it in {known} line 1 on the machine that handed this job over; if "
                      f"the host was rebuilt, remove that record there (ssh-keygen -R {lab.hosts[1].ip} -f {known})"]
    there = supervisor.home / ".podrun" / "known_hosts"
    assert not there.exists() or lab.hosts[1].ip + " " not in there.read_text()  # not trusted on first use


@pytest.mark.parametrize("target", ["hosts: [10.0.0.2, 'root@10.0.0.3:2222']", "tpu: {name: my-pod, zone: z, project: p}"])
def test_the_keys_the_laptop_pins_for_the_jump_hosts_on_the_way_travel_too(home, job_file, tmp_path, monkeypatch,
                                                                           target):
    """The supervisor reaches the workers through the spec's jump hosts as the laptop does: what the laptop
    knows of them goes with the job, a TPU's jump hosts too (its workers publish their own keys)."""
    from podrun.spec.loading import load_spec
    from podrun.supervisor.handover import _known_as
    from podrun.transport import known_hosts

    laptop_home = tmp_path / "laptop"
    (laptop_home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(laptop_home))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    key = " ".join((tmp_path / "key.pub").read_text().split()[:2])
    pinned = [f"bastion.example {key}", f"[inner.example]:2200 {key}", f"elsewhere.example {key}"]
    (laptop_home / ".ssh" / "known_hosts").write_text("".join(line + "\n" for line in pinned))
    spec = load_spec(job_file(f"target: {{{target}}}\nssh: {{proxy_jump: 'alice@bastion.example,inner.example:2200'}}\n"
                              "run: 'true'\n"))
    carried = [entry["line"] for entry in known_hosts.for_handover(_known_as(spec), spec.ssh.known_hosts)]
    assert carried == pinned[:2]
