"""A code file that a job writes into, through its hard link in the run directory, changes podrun's
cached copy of the code on that worker: the next exec must see it, ship the code again and put the
code's file back (remote/code_record.py, remote/checkout.py). The run issue 26 reported: a local test
left `snapshot.pt` in the workdir, the job (root, on SSH hosts) saved over it with torch.save, and the
next exec said "code unchanged on every worker" and resumed from the wrong epoch."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from podrun.remote import checkout, code_record

from helpers import podrun

# the tutorial's shape: resume from snapshot.pt when there is one, train, save the snapshot in place
TRAIN = """\
import hashlib, sys, torch
snapshot = torch.load("snapshot.pt")
print("snapshot sha256", hashlib.sha256(open("snapshot.pt", "rb").read()).hexdigest())
print("resuming from epoch", snapshot["epoch"])
torch.save({"epoch": snapshot["epoch"] + 2}, "snapshot.pt")
"""


def local_snapshot(workdir: Path, epoch: int) -> str:
    """What a local test run leaves in the workdir: torch.save's snapshot.pt; returns its sha256."""
    subprocess.run([sys.executable, "-c", f"import torch; torch.save({{'epoch': {epoch}}}, 'snapshot.pt')"],
                   cwd=workdir, check=True)
    return hashlib.sha256((workdir / "snapshot.pt").read_bytes()).hexdigest()


def run_ok(spec: Path) -> str:
    """The job's output, then podrun's own lines (on stderr)."""
    result = podrun("exec", "--no-collapse", spec, timeout=180)  # each worker's lines apart, those they share too
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_a_snapshot_saved_by_the_job_over_the_codes_is_restored_on_ssh_hosts(home, lab, hosts_spec):
    # a name of its own: the lab's hosts live through the session, with other tests' code versions of `job`
    spec = hosts_spec("name: snapshot-resume\nrun: python train.py\n", hosts=(0, 1), files={"train.py": TRAIN})
    shipped = local_snapshot(spec.parent / "code", epoch=3)
    first = run_ok(spec)
    for index in (0, 1):
        assert f"[w{index}] snapshot sha256 {shipped}" in first and f"[w{index}] resuming from epoch 3" in first
    second = run_ok(spec)
    for index in (0, 1):
        assert f"[w{index}] resuming from epoch 3" in second  # before the fix: 5, from the first run's save
        assert f"[w{index}] snapshot sha256 {shipped}" in second  # the code's file, not the job's save
        assert f"podrun: worker {index}: 1 code file changed since it was shipped (snapshot.pt)" in second
        name_dir = lab.hosts[index].home / "podrun" / "snapshot-resume"
        assert len([path for path in name_dir.iterdir() if path.is_dir()]) == 2  # run/ and one version, shipped again
    assert "code unchanged" not in second
    # from now on snapshot.pt is copied into run/: the job's save changes its copy, not podrun's
    third = run_ok(spec)
    assert "code unchanged on every worker" in third
    for index in (0, 1):
        assert f"[w{index}] snapshot sha256 {shipped}" in third and f"[w{index}] resuming from epoch 3" in third
        name_dir = lab.hosts[index].home / "podrun" / "snapshot-resume"
        (version,) = [path for path in name_dir.iterdir() if path.is_dir() and path.name != "run"]
        assert hashlib.sha256((version / "snapshot.pt").read_bytes()).hexdigest() == shipped


def test_a_same_size_write_with_its_mtime_put_back_is_found(home, job_file):
    """Local workers take the same path (the agent, the checkout): a write that keeps the size and
    restores the mtime leaves the inode change time moved, which no job can set back."""
    write_back = ("import os\ninfo = os.stat('data.txt')\nopen('data.txt', 'r+').write('B')\n"
                  "os.utime('data.txt', ns=(info.st_atime_ns, info.st_mtime_ns))\n")
    spec = job_file(f"target: {{local: {{workers: 1}}}}\nrun: cat data.txt && {sys.executable} write_back.py\n",
                    files={"data.txt": "A\n", "write_back.py": write_back})
    assert "[w0] A" in run_ok(spec)
    run_dir_file = home / "local" / "w0" / "podrun" / "job" / "run" / "data.txt"
    assert run_dir_file.read_text() == "B\n"
    second = run_ok(spec)
    assert "podrun: worker 0: 1 code file changed since it was shipped (data.txt)" in second
    assert "[w0] A" in second
    third = run_ok(spec)  # data.txt is a copy in run/ now: the job's write stays out of podrun's copy
    assert "code unchanged on every worker" in third and "[w0] A" in third


def test_unchanged_code_is_still_called_unchanged(home, job_file):
    spec = job_file("target: {local: {workers: 2}}\nrun: cat data.txt\n", files={"data.txt": "A\n"})
    run_ok(spec)
    second = run_ok(spec)
    assert "code unchanged on every worker" in second
    assert "changed since it was shipped" not in second


def test_a_code_file_the_job_replaced_is_put_back_on_the_next_run_of_the_same_code(home, job_file):
    """Replacing (a new file renamed over the name) leaves the cached copy alone; the run directory
    still gets the code's file back, also when the code did not change."""
    spec = job_file("target: {local: {workers: 1}}\nrun: cat data.txt && echo job > new && mv new data.txt\n",
                    files={"data.txt": "A\n"})
    assert "[w0] A" in run_ok(spec)
    second = run_ok(spec)
    assert "code unchanged on every worker" in second and "[w0] A" in second


def test_a_same_size_write_right_after_a_checkout_is_found(tmp_path):
    """No tick of the file system's clock between the checkout recording a file and a job writing
    into it: the stamp still tells them apart (code_record.settle waits past the links' tick)."""
    name_dir = tmp_path / "podrun" / "job"
    version = name_dir / ("a" * 16)
    version.mkdir(parents=True)
    (version / "data.txt").write_text("A\n")
    code_record.create(str(version), str(version) + code_record.SUFFIX)
    os.close(checkout.check_out(str(version), str(name_dir / "run"), "job-1"))
    placed = name_dir / "run" / "data.txt"
    info = placed.stat()
    with open(placed, "r+") as handle:  # as root: the read-only mode does not stop it
        handle.write("B")
    os.utime(placed, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert checkout.verify(str(version)) == (False, ["data.txt"])
    assert not version.exists()


# worker 0 says what it was shipped, then writes into that code file through its link in run/; the others
# say theirs once worker 0's write is there to see
WRITE_OR_WAIT = """\
import os, sys, time
if os.environ["PODRUN_WORKER"] == "0":
    print("data", open("data.txt").read().strip(), flush=True)
    os.chmod("data.txt", 0o644)  # a job that is not root opens it so; root ignores the mode
    open("data.txt", "r+").write("B")
else:
    deadline = time.monotonic() + 60
    while open(sys.argv[1]).read() != "B\\n":
        assert time.monotonic() < deadline, "worker 0 never wrote into its code"
        time.sleep(0.02)
    print("data", open("data.txt").read().strip())
"""


def test_a_local_worker_that_writes_into_its_code_changes_no_other_workers_code(home, job_file):
    """Local workers share one receiver, which copies the shipment into each worker's directory
    (shipping/relay.py): copies, not links, so worker 0's write changes its own copy alone, while the job
    runs and for the next one."""
    worker_0_file = home / "local" / "w0" / "podrun" / "job" / "run" / "data.txt"
    spec = job_file(f"target: {{local: {{workers: 3}}}}\nrun: {sys.executable} job.py {worker_0_file}\n",
                    files={"data.txt": "A\n", "job.py": WRITE_OR_WAIT})
    first = run_ok(spec)
    assert all(f"[w{index}] data A" in first for index in range(3)), first
    versions = [next(path for path in (home / "local" / f"w{index}" / "podrun" / "job").iterdir()
                     if path.is_dir() and path.name != "run") for index in range(3)]
    assert [(version / "data.txt").read_text() for version in versions] == ["B\n", "A\n", "A\n"]
    assert len({(version / "data.txt").stat().st_ino for version in versions}) == 3
    second = run_ok(spec)
    assert "podrun: worker 0: 1 code file changed since it was shipped (data.txt)" in second
    assert "worker 1:" not in second and "worker 2:" not in second
    assert all(f"[w{index}] data A" in second for index in range(3)), second
