#!/usr/bin/env python3
"""What it costs to never trust a cached code file a job could write to (issue 26), at 5,000 files.

    python scripts/bench_code_integrity.py [--files 5000] [--file-bytes 9200] [--runs 9] [--before main]
                                           [--exec-rounds 7]

In-process, medians of --runs, on a tree of --files files of --file-bytes each (46 MB by default):
  - the checkout of an unchanged version as --before had it (one read of run.lock, nothing checked);
  - (a) the cheap check: the probe's verify (lstat every file against the record: size, mtime,
    ctime, inode, mode) and the checkout's pass over run/ (an lstat per file), then what a moved
    signature costs (one file re-hashed, the record written again), against hashing every file;
  - a new version: linking every file (and recording their signatures), against (b) copying every
    file, and (c) reflinking every file (FICLONE) where the file system has it;
  - the record the relay writes as it unpacks a shipment (every file hashed).
Then whole processes: `podrun exec` of `true` on 2 local workers with that workdir, code unchanged,
--before's tree against this one, interleaved, --exec-rounds each.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from podrun.remote import checkout, code_record  # noqa: E402

from benchlib import print_table, timed  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)


def make_tree(root: Path, files: int, file_bytes: int) -> None:
    for index in range(files):
        path = root / f"pkg{index % 50}" / f"module{index}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes((b"VALUE = %d\n" % index).ljust(file_bytes, b"#"))


def median_ms(work: Callable[[], object], runs: int, before: Callable[[], object] = lambda: None) -> float:
    times = []
    for _ in range(runs):
        before()
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def load_checkout_at(revision: str, into: Path):
    """checkout.py as `revision` had it, as a module of its own."""
    source = subprocess.run(["git", "show", f"{revision}:podrun/remote/checkout.py"], cwd=REPO, check=True,
                            capture_output=True).stdout
    (into / "checkout_before.py").write_bytes(source)
    spec = importlib.util.spec_from_file_location("checkout_before", into / "checkout_before.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_all(source: Path, target: Path, reflink: bool) -> None:
    for relative in sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file()):
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        if reflink:
            with open(source / relative, "rb") as src, open(target / relative, "wb") as dst:
                fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        else:
            shutil.copyfile(source / relative, target / relative)


def reflink_support(directory: Path) -> str:
    (directory / "a").write_bytes(b"x")
    try:
        with open(directory / "a", "rb") as src, open(directory / "b", "wb") as dst:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))
    return ""


def checked_out(root: Path, source: Path, module) -> str:
    """A version of source under root, shipped (its record written, as the relay does) and checked out."""
    version = root / "podrun" / "bench" / ("a" * 16)
    shutil.copytree(source, version)
    code_record.create(str(version), str(version) + code_record.SUFFIX)
    os.close(module.check_out(str(version), str(version.parent / "run"), "bench"))
    return str(version)


def in_process(root: Path, args: argparse.Namespace) -> dict[str, list[str]]:
    before = load_checkout_at(args.before, root)
    source = root / "source"
    make_tree(source, args.files, args.file_bytes)
    versions = {label: checked_out(root / label.replace(" ", "-"), source, module)
                for label, module in ((args.before, before), ("this tree", checkout))}
    old, version = versions[args.before], versions["this tree"]
    rows = {f"{args.before}: checkout, same version (nothing checked)": median_ms(
        lambda: os.close(before.check_out(old, os.path.join(os.path.dirname(old), "run"), "bench")), args.runs)}
    run_dir = os.path.join(os.path.dirname(version), "run")
    rows["(a) probe: verify the version (an lstat per file against the record)"] = median_ms(
        lambda: checkout.verify(version), args.runs)
    rows["(a) checkout, same version (a directory read per directory of run/)"] = median_ms(
        lambda: os.close(checkout.check_out(version, run_dir, "bench")), args.runs,
        before=checkout._verified.clear)  # no record left by a verify
    rows["(a) both, as one agent does them (the record read once)"] = median_ms(
        lambda: (checkout.verify(version), os.close(checkout.check_out(version, run_dir, "bench"))), args.runs)
    touched = os.path.join(version, "pkg0", "module0.py")
    rows["(a) probe: verify, one file's ctime moved (it is hashed again, the record rewritten)"] = median_ms(
        lambda: checkout.verify(version), args.runs, before=lambda: os.chmod(touched, 0o444))
    rows["(a) no signatures: hash every file"] = median_ms(
        lambda: [code_record.sha256_of(str(path)) for path in Path(version).rglob("*.py")], args.runs)
    rows["the relay's record of a new shipment (hash every file)"] = median_ms(
        lambda: code_record.create(version, version + code_record.SUFFIX), args.runs)
    fresh = root / "fresh" / "podrun" / "bench"

    def new_version() -> None:
        shutil.rmtree(root / "fresh", ignore_errors=True)
        shutil.copytree(source, fresh / ("b" * 16))
        code_record.create(str(fresh / ("b" * 16)), str(fresh / ("b" * 16)) + code_record.SUFFIX)

    rows["new version: link every file (and record their signatures)"] = median_ms(
        lambda: os.close(checkout.check_out(str(fresh / ("b" * 16)), str(fresh / "run"), "bench")), args.runs,
        before=new_version)
    rows["(b) new version: copy every file"] = median_ms(
        lambda: copy_all(source, root / "copies", reflink=False), args.runs,
        before=lambda: shutil.rmtree(root / "copies", ignore_errors=True))
    if problem := reflink_support(root):
        rows[f"(c) new version: reflink every file: not on this file system (FICLONE: {problem})"] = float("nan")
    else:
        rows["(c) new version: reflink every file"] = median_ms(
            lambda: copy_all(source, root / "clones", reflink=True), args.runs,
            before=lambda: shutil.rmtree(root / "clones", ignore_errors=True))
    return {name: [f"{ms:.1f}"] for name, ms in rows.items()}


def whole_exec(root: Path, args: argparse.Namespace) -> dict[str, list[str]]:
    """podrun exec of `true`, unchanged code, --before's tree against this one, interleaved."""
    old_tree = root / "before-tree"
    old_tree.mkdir()
    archive = subprocess.run(["git", "archive", args.before], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive, check=True)
    make_tree(root / "code", args.files, args.file_bytes)
    spec = root / "job.yaml"
    spec.write_text("target: {local: {workers: 2}}\nworkdir: code\nrun: 'true'\n")
    trees = {args.before: old_tree, "this tree": REPO}
    commands = {}
    for label, tree in trees.items():
        env = {**os.environ, "PODRUN_HOME": str(root / f"home-{label.replace(' ', '-')}"), "PYTHONPATH": str(tree)}
        command = f"cd {tree} && {sys.executable} -m podrun exec {spec}"
        timed(command, env)  # ships the code
        commands[label] = (command, env)
    times: dict[str, list[float]] = {label: [] for label in commands}
    for _ in range(args.exec_rounds):
        for label, (command, env) in commands.items():
            times[label].append(timed(command, env))
    return {f"{label}: podrun exec, code unchanged": [f"{statistics.median(values):.3f}"]
            for label, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--file-bytes", type=int, default=9200)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--before", default="main", help="the git revision to compare with")
    parser.add_argument("--exec-rounds", type=int, default=7)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp())
    try:
        size = args.files * args.file_bytes / 1e6
        print_table(f"{args.files:,} files, {size:.0f} MB, in-process (ms, median of {args.runs})",
                    ["what", "ms"], in_process(root, args))
        print_table(f"{args.files:,} files, 2 local workers (s, median of {args.exec_rounds})",
                    ["what", "seconds"], whole_exec(root, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
