"""Targets: where a job runs. One module per kind (local.py, hosts.py, tpu.py, slurm.py) behind base.Target;
each is imported only when a spec names it, so a local job never loads SSH or Google's libraries.
slurm_options.py: the slurm target's options, loaded with every spec."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # temporary wiring: spec.py imports targets/slurm_options.py, which loads this package
    from podrun.spec import JobSpec
    from podrun.targets.base import Target


def target_for(spec: JobSpec) -> Target:
    if spec.target.tpu is not None:
        from podrun.targets.tpu import TpuVm

        return TpuVm(spec)
    if spec.target.slurm is not None:  # temporary wiring, until targets/ is a registry (issue 29 part 1)
        from podrun.targets.slurm import SlurmCluster

        return SlurmCluster(spec)
    if spec.target.hosts is not None:
        from podrun.targets.hosts import SshHosts

        return SshHosts(spec)
    from podrun.targets.local import LocalWorkers

    return LocalWorkers(spec)
