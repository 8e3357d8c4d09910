"""The run directory: every job of a name runs in ~/podrun/<name>/run/, which holds its code version's
files beside what earlier jobs wrote there; old versions are pruned; `podrun disk` shows and frees
(remote/checkout.py). Real jobs on local workers, and on lab hosts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from helpers import Background, job_id_in, podrun, processes_of_job, stderr_lines_without_traceback, wait_until

CHECKPOINTING_RUN = """
    run: |
      echo "cwd $PWD"
      cat checkpoints/last.txt 2>/dev/null || echo "no checkpoint"
      mkdir -p checkpoints && echo "checkpoint of $(cat version.txt)" > checkpoints/last.txt
"""


def name_dir(home: Path, worker: int, name: str = "job") -> Path:
    return home / "local" / f"w{worker}" / "podrun" / name


def versions(home: Path, worker: int) -> list[Path]:
    return sorted(path for path in name_dir(home, worker).iterdir() if path.is_dir() and path.name != "run")


def listing(directory: Path) -> list[str]:
    """The files under directory, relative (podrun keeps none of its own there)."""
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if not path.is_dir())


def run_ok(spec: Path) -> list[str]:
    result = podrun("exec", "--no-collapse", spec)  # each worker's lines apart, those they share too
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_the_job_runs_in_one_run_dir_across_code_versions_and_finds_its_checkpoint(home, job_file):
    spec = job_file(CHECKPOINTING_RUN, files={"version.txt": "v1\n"})
    first = run_ok(spec)
    (spec.parent / "code" / "version.txt").write_text("v2\n")  # a one-line edit: a new code version
    second = run_ok(spec)
    for index in (0, 1):
        run_dir = name_dir(home, index) / "run"
        assert f"[w{index}] cwd {run_dir}" in first and f"[w{index}] cwd {run_dir}" in second
        assert f"[w{index}] no checkpoint" in first
        assert f"[w{index}] checkpoint of v1" in second
        assert (run_dir / "checkpoints" / "last.txt").read_text() == "checkpoint of v2\n"
        assert len(versions(home, index)) == 2  # each version kept by its content hash
        code_file = run_dir / "version.txt"
        assert code_file.read_text() == "v2\n" and not code_file.stat().st_mode & 0o222  # linked, read-only
        assert code_file.stat().st_nlink == 2


def test_the_dry_run_shows_the_run_dir(home, job_file):
    spec = job_file("run: python3 train.py\n", files={"train.py": "print(1)\n"})
    result = podrun("exec", spec, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"cd {name_dir(home, 0)}/run" in result.stdout.splitlines()


def test_a_file_deleted_from_the_workdir_leaves_the_run_dir_and_what_the_job_wrote_stays(home, job_file):
    spec = job_file("run: touch written-by-job.txt pkg/written-too.txt\n",
                    files={"train.py": "1\n", "old.py": "1\n", "pkg/__init__.py": "", "gone/only.py": "1\n"})
    run_ok(spec)
    code = spec.parent / "code"
    (code / "old.py").unlink()
    (code / "gone" / "only.py").unlink()
    (code / "gone").rmdir()
    (code / "train.py").write_text("2\n")
    run_ok(spec)
    for index in (0, 1):
        run_dir = name_dir(home, index) / "run"
        assert listing(run_dir) == ["pkg/__init__.py", "pkg/written-too.txt", "train.py", "written-by-job.txt"]
        assert (run_dir / "train.py").read_text() == "2\n"


def test_versions_beyond_the_newest_three_are_pruned(home, job_file):
    spec = job_file("run: cat version.txt\n", files={"version.txt": "v0\n"})
    for version in range(5):
        (spec.parent / "code" / "version.txt").write_text(f"v{version}\n")
        assert "[w0] v%d" % version in run_ok(spec)
    for index in (0, 1):
        kept = versions(home, index)
        assert len(kept) == 3
        assert sorted((path / "version.txt").read_text() for path in kept) == ["v2\n", "v3\n", "v4\n"]


def test_a_job_with_other_code_and_the_same_name_is_refused_while_one_runs(home, job_file):
    spec = job_file("run: echo started; cat version.txt; exec sleep 300\n", files={"version.txt": "first\n"})
    first = Background("exec", "--no-collapse", spec)
    try:
        first.wait_for(r"^\[w1\] first$")
        first_id = job_id_in(first.text)
        (spec.parent / "code" / "version.txt").write_text("second\n")
        refused = podrun("exec", spec)
        assert refused.returncode == 1
        assert not processes_of_job(job_id_in(refused.stderr))
        lines = stderr_lines_without_traceback(refused.stderr)
        refusals = [f"{name_dir(home, index)}/run is in use by job {first_id}, which runs other code: "
                    f"give this job another name:" for index in (0, 1)]  # whichever worker says it first
        assert any(refusal in line for line in lines for refusal in refusals), lines
        assert (name_dir(home, 0) / "run" / "version.txt").read_text() == "first\n"  # untouched

        (spec.parent / "code" / "version.txt").write_text("first\n")  # the same code may share run/
        shared = podrun("exec", spec, "--env", "X=1", "--detach")
        assert shared.returncode == 0, shared.stderr
        shared_id = job_id_in(shared.stderr)
        wait_until(lambda: len(processes_of_job(shared_id)) >= 2, "the second job with the same code to run")
        assert podrun("stop", shared_id).returncode == 0
    finally:
        first.process.send_signal(signal.SIGINT)
        assert first.finish() == 130
    assert processes_of_job(first_id) == []


def test_podrun_disk_shows_the_versions_run_dir_and_job_files_and_free_keeps_the_current_version(home, job_file):
    spec = job_file("run: head -c 100000 /dev/zero > checkpoint.bin\n", files={"version.txt": "v1\n"})
    run_ok(spec)
    (spec.parent / "code" / "version.txt").write_text("v2\n")
    run_ok(spec)
    shown = podrun("disk", spec)
    assert shown.returncode == 0, shown.stderr
    rows = shown.stdout.splitlines()
    assert rows[0].split() == ["WORKER", "CODE", "VERSIONS", "RUN", "DIR", "JOB", "FILES"]
    assert [row.split()[:4] for row in rows[1:]] == [["0", "local/w0", "2", "versions,"],
                                                    ["1", "local/w1", "2", "versions,"]]
    assert all("2 jobs," in row for row in rows[1:])

    jobs_dir = home / "local" / "w0" / ".podrun" / "jobs"
    old_job = sorted(jobs_dir.iterdir())[0]
    week_and_a_day_ago = time.time() - 8 * 24 * 3600
    for path in (old_job, *old_job.iterdir()):
        os.utime(path, (week_and_a_day_ago, week_and_a_day_ago))
    freed = podrun("disk", spec, "--free")
    assert freed.returncode == 0, freed.stderr
    rows = freed.stdout.splitlines()
    assert rows[0].split()[-1] == "FREED"
    assert "1 version," in rows[1] and "1 version, 1 job:" in rows[1] and "1 version, 0 jobs:" in rows[2]
    assert not old_job.exists() and len(list(jobs_dir.iterdir())) == 1
    for index in (0, 1):
        (kept,) = versions(home, index)
        assert (kept / "version.txt").read_text() == "v2\n"
        assert (name_dir(home, index) / "run" / "checkpoint.bin").stat().st_size == 100000  # never freed
    assert "[w0] v2" in run_ok(job_file("run: cat version.txt\n"))


def test_on_ssh_hosts_each_host_keeps_its_checkpoint_in_one_run_dir_across_versions(home, lab, hosts_spec):
    spec = hosts_spec(CHECKPOINTING_RUN, hosts=(0, 1), files={"version.txt": "v1\n"})
    first = run_ok(spec)
    (spec.parent / "code" / "version.txt").write_text("v2\n")
    second = run_ok(spec)
    for index in (0, 1):
        run_dir = lab.hosts[index].home / "podrun" / spec.stem / "run"
        shown_dir = f"/root/podrun/{spec.stem}/run"
        assert f"[w{index}] cwd {shown_dir}" in first and f"[w{index}] cwd {shown_dir}" in second
        assert f"[w{index}] checkpoint of v1" in second
        assert (run_dir / "checkpoints" / "last.txt").read_text() == "checkpoint of v2\n"
