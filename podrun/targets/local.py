"""Local CPU workers: process trees on this machine, each rooted in a directory of its own under
PODRUN_HOME (its stand-in for a host's home), all reaching each other on 127.0.0.1."""

from __future__ import annotations

import os

from podrun import paths
from podrun.targets.base import Target, Worker
from podrun.transport.local import LocalTransport

LOCAL_IP = "127.0.0.1"


class LocalWorkers(Target):
    worker_noun = "local worker"
    default_device = "CPU"

    def workers(self, dry_run: bool) -> list[Worker]:
        return [Worker(index, f"local/w{index}", LOCAL_IP, LocalTransport(worker_root(index), compiled_dir()))
                for index in range(self.options.workers)]


def worker_root(index: int) -> str:
    return os.path.join(paths.podrun_home(), "local", f"w{index}")


def compiled_dir() -> str:
    """The compiled worker-side scripts every local worker shares (transport/local.py, share_compiled)."""
    return os.path.join(paths.podrun_home(), "local", "compiled")
