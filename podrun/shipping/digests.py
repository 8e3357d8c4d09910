"""The sha256 of each workdir file, remembered between runs by the file's stat signature.

Without it every `exec` reads and hashes the whole workdir to name its code directory (46 MB: 50 ms
here, scripts/bench_scan.py), also when nothing changed. As git's index does, a file's digest is reused while its size,
mtime, ctime, inode and mode are what they were when it was hashed: any write changes ctime, which
no tool can set back. A file changed within RACY_S of the scan is not remembered, so that a
filesystem with coarse timestamps cannot hide a same-size edit made within the same tick.
One JSON file per workdir under PODRUN_HOME/cache/digests; a missing or broken one means hash all.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

from podrun import paths
from podrun.jobstore import write_json

RACY_S = 2.0
READ_BYTES = 1 << 20


class FileDigests:
    def __init__(self, root: str):
        name = hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:16]
        self.path = os.path.join(paths.podrun_home(), "cache", "digests", f"{name}.json")
        self.known = self._load()
        self.remembered: dict[str, list] = {}
        self.racy_after_ns = time.time_ns() - int(RACY_S * 1e9)

    def of(self, relative: str, path: str, info: os.stat_result) -> bytes:
        """The sha256 of the regular file at path (lstat'ed as info), hashed only if it changed."""
        signature = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_mode]
        entry = self.known.get(relative)
        digest = entry[-1] if isinstance(entry, list) and entry[:-1] == signature else _sha256(path)
        if info.st_ctime_ns < self.racy_after_ns:
            self.remembered[relative] = [*signature, digest]
        return bytes.fromhex(digest)

    def save(self) -> None:
        if self.remembered == self.known:
            return
        try:
            paths.private_dirs(os.path.dirname(self.path))
            write_json(self.path, self.remembered)  # two launchers at once: either's whole file wins
        except OSError:
            pass  # a cache: without it the next run hashes again; an unusable PODRUN_HOME is named by the job store

    def _load(self) -> dict[str, list]:
        try:
            with open(self.path) as handle:
                known = json.load(handle)
        except (OSError, ValueError):
            return {}
        return known if isinstance(known, dict) else {}


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(READ_BYTES):
            digest.update(block)
    return digest.hexdigest()
