"""The Slurm lab's fixtures for its tests: the cluster with an empty queue, and job specs on it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def cluster(slurm_lab):
    """The lab's cluster, with no job in squeue before or after the test."""
    slurm_lab.cancel_all()
    yield slurm_lab
    slurm_lab.cancel_all()
    slurm_lab.wait_until_idle()  # no node left `plnd` (planned for a job that pended) for the next test


@pytest.fixture
def slurm_spec(cluster, job_file):
    """A job spec on the lab's cluster, reached through its login node."""

    def write(body: str, nodes: int = 2, options: str = "", files: dict[str, str] | None = None) -> Path:
        header = (f"target: {{slurm: {{login: {cluster.login_address}, nodes: {nodes}{options}}}}}\n"
                  f"ssh: {{identity_file: {cluster.client_key}}}\n"
                  f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}\n")
        return job_file(header + textwrap.dedent(body), files=files)

    return write
