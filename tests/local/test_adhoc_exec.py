"""`podrun exec --tpu/--hosts/--local -- CMD`: a command on every worker without a spec file, with
everything a spec's job gets (prefixes, logs, a job record, fail-fast, a clean stop)."""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import pytest

from helpers import Background, job_id_in, lab_flags, podrun, processes_of_job, stderr_lines_without_traceback, wait_until

PREFIX = re.compile(r"^\[w(\d+)\] +(.*)$", re.MULTILINE)


def by_worker(stdout: str) -> dict[int, list[str]]:
    lines: dict[int, list[str]] = {}
    for worker, line in PREFIX.findall(stdout):
        lines.setdefault(int(worker), []).append(line)
    return lines


def test_a_command_runs_on_every_local_worker_in_its_directory_and_is_kept_as_a_job(home):
    result = podrun("exec", "--local", "3", "--", 'echo "worker $PODRUN_WORKER of $PODRUN_NUM_WORKERS in $PWD"')
    assert result.returncode == 0, result.stderr
    lines = by_worker(result.stdout)
    for index in range(3):
        assert lines[index] == [f"worker {index} of 3 in {home / 'local' / f'w{index}'}"]
    job_id = job_id_in(result.stderr)
    assert job_id.startswith("exec-")
    assert "shipped" not in result.stderr and "unchanged" not in result.stderr  # nothing ships without --workdir
    assert podrun("logs", job_id, "--worker", "2").stdout == f"worker 2 of 3 in {home / 'local' / 'w2'}\n"
    (record,) = json.loads(podrun("jobs", "--json").stdout)
    assert (record["id"], record["state"], record["target"]) == (job_id, "succeeded", "local:3")


def test_several_words_after_the_dashes_keep_their_quoting(home):
    result = podrun("exec", "--local", "1", "--", sys.executable, "-c", "import sys; print('one arg:', sys.argv[1])",
                    "a b")
    assert result.returncode == 0, result.stderr
    assert by_worker(result.stdout) == {0: ["one arg: a b"]}


def test_workdir_ships_a_directory_and_names_the_job_after_it(home, tmp_path):
    code = tmp_path / "my-project"
    code.mkdir()
    (code / "hello.py").write_text("print('hello from the workdir')\n")
    result = podrun("exec", "--local", "2", "--workdir", code, "--no-collapse", "--", "python3 hello.py")
    assert result.returncode == 0, result.stderr
    assert by_worker(result.stdout) == {0: ["hello from the workdir"], 1: ["hello from the workdir"]}
    assert job_id_in(result.stderr).startswith("my-project-")
    assert "shipped code (1 file) to 2 workers" in result.stderr


@pytest.mark.slow
def test_on_ssh_hosts_a_failing_worker_stops_the_others_and_nothing_is_left(home, lab, tmp_path):
    # worker 1 fails once the others have printed (lab hosts share /tmp): a failure stops them, even mid-start
    printed = tmp_path / "printed"
    printed.mkdir()
    result = podrun("exec", *lab_flags(lab), "--", f'echo "on $(hostname -I | cut -d" " -f1)"; '
                    f'touch {printed}/$PODRUN_WORKER; '
                    f'if [ "$PODRUN_WORKER" = 1 ]; then until [ -e {printed}/0 ] && [ -e {printed}/2 ]; '
                    'do sleep 0.05; done; exit 4; fi; exec sleep 600')
    assert result.returncode == 4, result.stderr
    lines = by_worker(result.stdout)
    for index in range(3):
        assert lines[index][0].split()[1] == lab.hosts[index].ip
    assert re.search(r"worker 1 \(\S+\) exited with code 4", result.stderr)
    assert processes_of_job(job_id_in(result.stderr)) == []  # on any lab host: they share this machine's processes


@pytest.mark.slow
def test_a_detached_command_goes_on_and_stop_ends_it_everywhere(home, lab):
    result = podrun("exec", *lab_flags(lab, (0, 1)), "--detach", "--worker", "1", "--",
                    'touch ~/"ran-$PODRUN_JOB_ID"; echo up; exec sleep 600')
    assert result.returncode == 0, result.stderr
    job_id = job_id_in(result.stderr)
    wait_until(lambda: "up" in podrun("logs", job_id).stdout, "the detached command's output")
    assert [host.index for host in lab.hosts if (host.home / f"ran-{job_id}").exists()] == [1]  # --worker 1 only
    assert len(processes_of_job(job_id)) >= 1
    assert podrun("stop", job_id).returncode == 0
    wait_until(lambda: processes_of_job(job_id) == [], "the command to stop")


@pytest.mark.slow
def test_ctrl_c_stops_an_ad_hoc_command_on_every_host(home, lab):
    job = Background("exec", *lab_flags(lab), "--no-collapse", "--", "echo started; exec sleep 600")
    for index in range(3):
        job.wait_for(rf"\[w{index}\] started")
    job.process.send_signal(signal.SIGINT)
    assert job.finish() == 130, job.text
    assert processes_of_job(job_id_in(job.text)) == []


@pytest.mark.slow
def test_a_command_runs_on_every_worker_of_a_tpu_named_on_the_command_line(home, tpu_api, lab):
    assert podrun("create", "v4-32", "--name", "adhoc").returncode == 0
    result = podrun("exec", "--tpu", "adhoc", "--zone", "us-central2-b", "--",
                    'echo "$PJRT_DEVICE $(hostname -I | cut -d" " -f1)"')
    assert result.returncode == 0, result.stderr
    assert {index: lines[0].split() for index, lines in by_worker(result.stdout).items()} == {
        index: ["TPU", lab.hosts[index].ip] for index in range(4)}


def test_dry_run_shows_the_command_in_the_login_directory(home):
    result = podrun("exec", "--local", "2", "--dry-run", "--env", "A=1", "--", "echo", "$HOME")
    assert result.returncode == 0, result.stderr
    assert f"cd {home / 'local' / 'w1'}\n" in result.stdout
    assert "export A=1\necho '$HOME'\n" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--local", "2"], "expected -- CMD after the target: the command to run on every worker"),
    ([], "expected a job spec (JOB.yaml), or a target (--tpu, --hosts, --local or --slurm) and -- CMD"),
    (["--local", "2", "--hosts", "a", "--", "true"], "--hosts and --local: expected one target"),
    (["--hosts", "a,user@", "--", "true"],
     "--hosts: expected host, user@host, host:port or user@host:port, got 'user@'"),
    (["--hosts", "a:99999", "--", "true"], "--hosts: expected host, user@host, host:port or user@host:port, "
                                            "got 'a:99999'"),
    (["--local", "0", "--", "true"], "--local: expected a number of workers from 1 to 1024, got 0"),
    (["--tpu", "My_Pod", "--", "true"], "--tpu: expected a TPU VM name (lowercase letters, digits and dashes, "
                                        "starting with a letter, at most 63 characters), got 'My_Pod'"),
    (["--local", "2", "--zone", "z", "--", "true"], "--zone: goes with --tpu"),
    (["--local", "2", "--user", "u", "--", "true"], "--user: goes with --tpu, --hosts or --slurm"),
    (["--local", "2", "--workdir", "/no/such/dir", "--", "true"], "--workdir /no/such/dir: expected an existing "
                                                                  "directory"),
    (["--local", "2", "--worker", "5", "--", "true"], "--worker '5': this target has workers 0 to 1"),
    (["{spec}", "--", "true"], "{spec}: the spec says what runs; `-- CMD` goes with --tpu, --hosts, --local or --slurm"),
    (["{spec}", "--hosts", "a"], "{spec}: a spec names its own target; drop --hosts or the spec"),
    (["{spec}", "--workdir", "."], "--workdir: goes with --tpu, --hosts, --local or --slurm (a spec has workdir:)"),
])
def test_bad_ad_hoc_arguments_are_one_line_and_start_nothing(home, job_file, args, message):
    spec = str(job_file("run: echo hi\n"))
    result = podrun("exec", *(arg.format(spec=spec) for arg in args))
    assert result.returncode == 2
    assert stderr_lines_without_traceback(result.stderr) == [f"podrun: error: {message.format(spec=spec)}"]
    assert not (Path(home) / "jobs").exists() or not list((Path(home) / "jobs").iterdir())


def test_for_commands_that_take_no_command_double_dash_only_ends_the_options(home):
    result = podrun("stop", "--", "python3", "train.py")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == "podrun stop: error: unrecognized arguments: train.py"


def test_spares_come_with_hosts_on_the_command_line_and_with_nothing_else():
    planned = podrun("exec", "--hosts", "10.0.0.1,10.0.0.2", "--spares", "10.0.0.9", "--dry-run", "--", "true")
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.splitlines()[0] == "# target: 2 SSH hosts: 10.0.0.1, 10.0.0.2; 1 spare: 10.0.0.9"
    refused = podrun("exec", "--local", "2", "--spares", "10.0.0.9", "--", "true")
    assert (refused.returncode, refused.stderr) == (2, "podrun: error: --spares: goes with --hosts\n")
