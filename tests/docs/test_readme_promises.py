"""What the README promises, held to it (issue 26, 3a): restarts on every target, every spec problem
listed, an unusable PODRUN_HOME as a usage error, a `jobs` table that fits narrow terminals and is
whole in a pipe, a large workdir asked about on a terminal, a dry run that is the workers' script,
and `cp` all or nothing across workers."""

from __future__ import annotations

import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from podrun import jobstore

from helpers import (
    LONG_NAME,
    REPO,
    jobs_on_a_terminal,
    lab_flags,
    podrun,
    recorded_job,
    run_in_terminal,
    stderr_lines_without_traceback,
)

FAILS_ONCE = 'test "$PODRUN_ATTEMPT" = 1 && echo "attempt $PODRUN_ATTEMPT ran" || exit 3'


@pytest.mark.parametrize("restarts, args", [("restarts: {max: 2}\n", ()), ("", ("--restarts", "2"))])
def test_restarts_without_on_restart_a_failed_local_job(home, job_file, monkeypatch, restarts, args):
    monkeypatch.setenv("PODRUN_RESTART_BACKOFF", "0")
    spec = job_file(f"target: {{local: {{workers: 2}}}}\nrun: '{FAILS_ONCE}'\n{restarts}")
    result = podrun("exec", spec, *args)
    assert result.returncode == 0, result.stderr
    assert "restart 1 of 2 in 0s: running again on the same workers" in result.stderr
    assert result.stdout.splitlines() == ["[w0-1] attempt 1 ran"]


def test_restarts_without_on_are_valid_on_hosts_and_say_what_to_write_on_a_tpu_podrun_cannot_create(job_file):
    hosts = job_file("target: {hosts: [10.1.0.7, 10.1.0.8]}\nrun: 'true'\nrestarts: {max: 2}\n")
    assert podrun("validate", hosts).returncode == 0
    tpu = job_file("target: {tpu: {name: my-pod, zone: us-central2-b, project: p}}\nrun: 'true'\n"
                   "restarts: {max: 2}\n", name="tpu")
    refused = podrun("validate", tpu)
    assert refused.returncode == 2
    assert stderr_lines_without_traceback(refused.stderr) == [
        f"podrun: error: {tpu}: restarts.on: on a tpu target, restarts default to preemption restarts, which "
        f"create the TPU VM again, so they need target.tpu.accelerator_type; `on: [failure]` restarts failures"]


def test_a_key_given_twice_is_listed_with_every_other_problem(job_file):
    spec = job_file("run: echo one\nrun: echo two\ntarget: {local: {workers: 0}}\nwrokdir: .\n")
    result = podrun("validate", spec)
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr) == [
        f"podrun: error: {spec}: run: given twice, on line 1 and line 2; keep one",
        f"{spec}: target.local.workers: expected a number of workers from 1 to 1024, got 0",
        f"{spec}: wrokdir: unknown field; did you mean 'workdir'?"]


def test_a_podrun_home_where_a_worker_cannot_be_made_is_a_usage_error(home, job_file):
    (home / "local").mkdir(parents=True)
    (home / "local" / "w0").write_text("a file where local worker 0's directory goes\n")
    result = podrun("exec", job_file("target: {local: {workers: 1}}\nrun: echo ran\n"))
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr)[-1] == (
        f"podrun: error: PODRUN_HOME={home}: cannot create {home}/local/w0 there (File exists); expected a "
        f"writable directory (set PODRUN_HOME to one)")


@pytest.fixture
def five_jobs(home) -> list[str]:
    """Jobs of every state and long names, newest first."""
    now = time.time()
    return [recorded_job(LONG_NAME, now, [0] * 32),
            recorded_job("train", now - 5, [143] * 32, jobstore.STOPPED, 143, stopped=tuple(range(32))),
            recorded_job("train", now - 10, [0] * 30 + [None] * 2, jobstore.RUNNING, None),
            recorded_job("flaky", now - 15, [1] * 5 + [0] * 27, jobstore.FAILED, 1),
            recorded_job(LONG_NAME, now - 20, [0] * 5 + [3, 0, 137] + [0] * 24, jobstore.FAILED, 3)]


@pytest.mark.parametrize("columns", [40, 50, 60, 68])
def test_the_jobs_table_fits_a_narrow_terminal_keeping_id_state_and_exit_codes(five_jobs, monkeypatch, columns):
    lines = jobs_on_a_terminal(columns, monkeypatch).splitlines()
    assert max(map(len, lines)) <= columns, "\n".join(lines)
    header = re.split(r" {2,}", lines[0])
    assert header[0] == "ID" and "STATE" in header and "EXIT CODES" in header, lines[0]
    rows = [re.split(r" {2,}", line) for line in lines[1:]]
    assert [row[header.index("STATE")] for row in rows] == ["succeeded", "stopped", "running", "failed", "failed"]
    for row, job_id in zip(rows, five_jobs):
        head, _, end = row[0].partition("…")
        assert job_id.startswith(head) and job_id.endswith(end), row


def test_piped_jobs_rows_are_whole_with_columns_exported(five_jobs):
    piped = podrun("jobs", env={**os.environ, "COLUMNS": "30"})
    assert piped.returncode == 0, piped.stderr
    rows = [re.split(r" {2,}", line) for line in piped.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == five_jobs
    assert rows[0][1] == LONG_NAME and rows[-1][4] == "w5=3 w7=137"


@pytest.fixture
def large_spec(job_file):
    """A spec whose workdir holds 1.2 GiB (sparse files: no disk used)."""
    spec = job_file("target: {local: {workers: 1}}\nrun: echo ran", files={"train.py": "", ".venv/lib/x.so": "",
                                                                          "wheels/a.whl": ""})
    for name, size in ((".venv/lib/x.so", 900 << 20), ("wheels/a.whl", 300 << 20)):
        os.truncate(spec.parent / "code" / name, size)
    return spec


@pytest.mark.parametrize("answer, code", [pytest.param(b"y", 0, marks=pytest.mark.slow), (b"", 2)])
def test_a_large_workdir_is_shipped_when_the_person_at_the_terminal_says_yes(home, large_spec, monkeypatch, answer,
                                                                             code):
    monkeypatch.setenv("NO_COLOR", "1")
    exit_code, written = run_in_terminal(["exec", large_spec], rows=24, columns=400, answer=answer)
    shown = written.decode().replace("\r\n", "\n")
    assert exit_code == code, shown
    workdir = large_spec.parent / "code"
    assert (f"podrun: {large_spec}: workdir: {workdir}: 1.2 GB in 3 files would ship (more than 1 GiB or 50,000 "
            f"files); the heaviest: .venv/ 900.0 MB in 1 file, wheels/ 300.0 MB in 1 file, train.py 0 bytes in "
            f"1 file\npodrun: ship it all? (--allow-large-workdir ships it without asking) [y/N] ") in shown
    if code == 0:
        assert "[w0] ran\n" in shown
    else:
        assert shown.endswith(f"podrun: error: {large_spec}: workdir: {workdir}: not shipped; exclude what the job "
                              f"does not need in .podrunignore, or point workdir: at the code\n")


def test_off_a_terminal_a_large_workdir_stops_and_says_the_limit_is_a_gibibyte(home, large_spec):
    result = podrun("exec", large_spec, stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert "1.2 GB in 3 files would ship (more than 1 GiB or 50,000 files); the heaviest: .venv/" in result.stderr
    assert result.stderr.endswith("or pass --allow-large-workdir\n") and not home.exists()


@pytest.mark.slow
def test_too_many_files_names_what_holds_the_most_files_not_the_most_bytes(home, job_file):
    spec = job_file("run: echo ran", files={"data/big.bin": "", "train.py": ""})
    os.truncate(spec.parent / "code" / "data" / "big.bin", 500 << 20)
    for folder in ("node_modules", "cache"):
        (spec.parent / "code" / folder).mkdir()
    for index in range(50_000):
        (spec.parent / "code" / ("node_modules" if index % 5 else "cache") / f"{index}.js").touch()
    result = podrun("exec", spec, stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert ("500.0 MB in 50,002 files would ship (more than 1 GiB or 50,000 files); the most files: node_modules/ "
            "0 bytes in 40,000 files, cache/ 0 bytes in 10,000 files, data/ 500.0 MB in 1 file;") in result.stderr


SHOW_RANK = """\
import os
print("rank", os.environ["RANK"], "gloo", os.environ.get("GLOO_SOCKET_IFNAME"), "job dir",
      os.path.isdir(os.environ["PODRUN_JOB_DIR"]), flush=True)
"""


@pytest.mark.slow
def test_the_dry_run_is_the_script_each_worker_runs(home, lab, hosts_spec):
    spec = hosts_spec("run: show.py\ntorchrun: {nproc_per_node: 1}\nsetup: echo set up in $PWD",
                      hosts=(0, 1), files={"show.py": SHOW_RANK})
    ran = podrun("exec", spec)  # ships the code; the dry run's script then runs where the job ran
    assert ran.returncode == 0, ran.stderr
    dry = podrun("exec", spec, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    blocks = dry.stdout.split("\n\n# worker ")[1:]
    assert len(blocks) == 2
    scripts = [subprocess.Popen([*lab.ssh_args(index), "sh", "-e"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for index in (0, 1)]
    with ThreadPoolExecutor() as both:  # at once: worker 0's rendezvous waits for worker 1
        outputs = list(both.map(lambda script, block: script.communicate("# worker " + block, timeout=120),
                                scripts, blocks))
    for index, (script, (stdout, stderr)) in enumerate(zip(scripts, outputs)):
        assert script.returncode == 0, stderr
        assert f"[w{index} r{index}] rank {index} gloo eth0 job dir True" in ran.stdout  # what podrun's run printed
        assert f"[rank{index}]:rank {index} gloo eth0 job dir True" in stdout.splitlines(), stdout + stderr
        assert "set up in /root/podrun/job/run" in stdout


def test_an_upload_one_local_worker_cannot_take_reaches_no_worker(home, tmp_path):
    (tmp_path / "model.pt").write_text("weights\n")
    for index in (0, 2):  # worker 1 has no ~/data: its copy cannot be put in place
        (home / "local" / f"w{index}" / "data").mkdir(parents=True)
    result = podrun("cp", "--local", "3", tmp_path / "model.pt", ":data/model.pt")
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr) == [
        "podrun: error: worker 1 (local/w1): data: no such directory; nothing was copied to any worker"]
    for index in range(3):
        worker = home / "local" / f"w{index}"
        assert os.listdir(worker / "data") == [] if index != 1 else not (worker / "data").exists()
        assert not list((worker / ".podrun" / "cp").iterdir())  # no staging left anywhere


def test_an_upload_that_cannot_be_staged_on_one_local_worker_leaves_no_staging_on_the_others(home, tmp_path):
    (tmp_path / "model.pt").write_text("weights\n")
    (home / "local" / "w1" / ".podrun").mkdir(parents=True)
    (home / "local" / "w1" / ".podrun" / "cp").write_text("a file where the staging directories go\n")
    result = podrun("cp", "--local", "3", tmp_path / "model.pt", ":model.pt")
    assert result.returncode == 1
    assert result.stderr.endswith("podrun: error: worker 1 (local/w1): shipping files failed: receiving the code "
                                  "failed: Not a directory; nothing was copied to any worker\n"), result.stderr
    for index in (0, 2):
        assert os.listdir(home / "local" / f"w{index}" / ".podrun" / "cp") == []
        assert not (home / "local" / f"w{index}" / "model.pt").exists()


def test_a_download_one_local_worker_cannot_give_writes_nothing(home, tmp_path):
    for index in (0, 1):  # worker 2 has no saved/
        (home / "local" / f"w{index}" / "saved").mkdir(parents=True)
        (home / "local" / f"w{index}" / "saved" / "step.txt").write_text(f"{index}\n")
    (home / "local" / "w2").mkdir(parents=True)
    landing = tmp_path / "landing"
    landing.mkdir()
    result = podrun("cp", "--local", "3", "-r", ":saved", landing / "back")
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr) == [
        "podrun: error: worker 2 (local/w2): :saved: no such file or directory; nothing was copied from any worker"]
    assert os.listdir(landing) == []  # no back/, no back/w0, no staging directory
    (landing / "back").mkdir()
    (landing / "back" / "w1").write_text("a file where worker 1's folder goes\n")
    clash = podrun("cp", "--local", "2", "-r", ":saved", landing / "back")
    assert clash.returncode == 1
    assert stderr_lines_without_traceback(clash.stderr) == [
        f"podrun: error: worker 1 (local/w1): {landing}/back/w1: not a directory, cannot be replaced by one; "
        f"nothing was copied from any worker"]
    assert os.listdir(landing / "back") == ["w1"]


@pytest.mark.slow
def test_a_copy_to_ssh_hosts_with_one_read_only_destination_copies_nothing_and_says_where(home, lab, tmp_path):
    (tmp_path / "model.pt").write_text("weights\n")
    for index in range(3):
        lab.run(index, "mkdir -p /root/shared")
    lab.run(1, "mount --bind -o ro /root/shared /root/shared")
    try:
        result = podrun("cp", *lab_flags(lab), tmp_path / "model.pt", ":shared/")
    finally:
        lab.run(1, "umount /root/shared")
    assert result.returncode == 1
    assert stderr_lines_without_traceback(result.stderr) == [
        f"podrun: error: worker 1 ({lab.hosts[1].ip}): /root/shared: cannot write there (read-only file system); "
        f"nothing was copied to any worker"]
    for index in range(3):
        assert os.listdir(lab.hosts[index].home / "shared") == []
        assert os.listdir(lab.hosts[index].home / ".podrun" / "cp") == []
    (lab.hosts[2].home / "shared" / "only-here").write_text("2\n")
    down = podrun("cp", *lab_flags(lab), ":shared/only-here", tmp_path / "back")
    assert down.returncode == 1
    assert stderr_lines_without_traceback(down.stderr) == [
        f"podrun: error: worker 0 ({lab.hosts[0].ip}): :shared/only-here: no such file or directory; "
        f"worker 1 ({lab.hosts[1].ip}): :shared/only-here: no such file or directory; nothing was copied from any "
        f"worker"]
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "podrun-home"]  # no back/, no staging directory


def readme_yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def test_the_readmes_long_run_settings_hold_on_its_own_hosts_job(job_file, tmp_path, monkeypatch):
    job = readme_yaml_blocks()[0]
    long_run = next(block for block in readme_yaml_blocks() if block.startswith("progress:"))
    spec = job_file(job + long_run)
    (tmp_path / "train.py").write_text("print('step 1')\n")  # the README's workdir is the spec's folder
    monkeypatch.setenv("SLACK_WEBHOOK_URL", "https://hooks.example.com/T000/B000/XXXX")
    result = podrun("validate", spec)
    assert result.returncode == 0, result.stderr
    assert (f"podrun: {spec}: restarts.on: preemption: nothing of a hosts target is preempted; the rest of "
            f"restarts.on holds") in result.stderr
