"""A Slurm cluster (`target: {slurm: {...}}`): the job gets an allocation of `nodes` nodes, made for
it alone, and runs one worker on each, worker i on the i-th node of SLURM_JOB_NODELIST; worker 0's
node address is MASTER_ADDR.

The allocation is the target's capacity (capacity/slurm.py). The workers' agents of a step are the
tasks of one srun (transport/slurm_step.py); other commands on a node are srun steps of their own
(transport/slurm.py).

Slurm's commands run on the login node, over SSH as `hosts` are reached (the spec's `ssh:` keys and
host-key rules), or on this machine when there is no `login`. The nodes share the login user's home
(shares_root): the code ships there once.
"""

from __future__ import annotations

import shlex

from podrun.capacity.slurm import SlurmAllocation
from podrun.output import counted
from podrun.spec.model import JobSpec
from podrun.target_kinds.slurm import SlurmOptions
from podrun.targets.base import Target, Worker
from podrun.transport.slurm import SlurmTransport
from podrun.transport.slurm_step import srun_argv

# what the srun step that starts the workers (one task per node) tells its tasks about the step and its tasks:
# under torchrun they would say SLURM_NTASKS=nodes, SLURM_PROCID=worker, SLURM_LOCALID=0 to every rank, and
# Slurm-aware frameworks read their ranks from them (Lightning's SLURMEnvironment, before 2.1 chosen over
# torchrun's; jax's). The ranks keep the job's own (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_CPUS_ON_NODE...)
STEP_VARIABLES = (
    "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_GTIDS", "SLURM_TASK_PID",
    "SLURM_NNODES", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_NTASKS_PER_SOCKET", "SLURM_NTASKS_PER_CORE",
    "SLURM_NTASKS_PER_GPU", "SLURM_STEPID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES",
    "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_LAUNCHER_PORT", "SLURM_STEP_GPUS",
    "SLURM_STEP_RESV_PORTS", "SLURM_SRUN_COMM_HOST", "SLURM_SRUN_COMM_PORT")


class SlurmCluster(Target):
    worker_noun = "Slurm node"
    default_device = "CUDA"
    shares_root = True  # the nodes share the login user's home: the code ships once
    rank_env_removed = STEP_VARIABLES  # torchrun's ranks are not the step's tasks

    def __init__(self, spec: JobSpec):
        super().__init__(spec)
        self.login_ssh = self._login_transport()
        self.capacity: SlurmAllocation = SlurmAllocation(spec, self.login_ssh)

    @property
    def options(self) -> SlurmOptions:
        return self.spec.target.options

    def ssh_hosts(self) -> list[str]:
        return [self.options.login] if self.options.login else []

    def _login_transport(self):
        login = self.options.login
        if not login:
            return None
        from podrun.spec.fields import parse_host
        from podrun.transport.ssh import host_transport  # asyncssh loads only with a login node

        user, host, port = parse_host(login)
        return host_transport(self.spec.ssh, user, host, port)

    def workers(self, dry_run: bool) -> list[Worker]:
        allocation = self.capacity
        if dry_run and allocation.job_id is None:  # nothing allocated: the nodes are named by their place
            return [Worker(index, f"node {index} of the allocation", f"<node {index} address>",
                           SlurmTransport(allocation.link, self._login_endpoint(), "<job id>", f"<node {index}>"))
                    for index in range(self.options.nodes)]
        if allocation.job_id is None:  # `podrun ssh` / `cp`: the running job of this spec
            allocation.find_running()
        assert allocation.job_id is not None
        return [Worker(index, name, address,
                       SlurmTransport(allocation.link, self._login_endpoint(), allocation.job_id, name))
                for index, (name, address) in enumerate(allocation.nodes)]

    def _login_endpoint(self) -> dict | None:
        return self.login_ssh.endpoint() if self.login_ssh else None

    def describe(self, workers: list[Worker]) -> str:
        where = f"via {self.options.login}" if self.options.login else "on this machine (the login node)"
        lines = [f"{counted(len(workers), self.worker_noun)}, allocated for the job; Slurm's commands run {where}:",
                 f"  allocate: {shlex.join(self.capacity.salloc_argv())}",
                 "  pending:  squeue --noheader --jobs=<job id> --format='%T|%r|%N' (its reason, every second)"]
        nodes = [worker.transport for worker in workers if isinstance(worker.transport, SlurmTransport)]
        if nodes:
            srun = shlex.join(srun_argv(nodes[0].job_id, [node.node for node in nodes]))
            lines.append(f"  start:    {srun} python3 -I -S -c <connector> <agent>")
            lines.append("            (one step; each node's task connects back to the login node and runs <agent>; "
                         "a node that cannot: srun per node)")
        lines.append("  <agent>:  python3 -I -S -c <podrun's agent> (it runs the worker's script below)")
        lines.append("  release:  scancel <job id> (when the job ends, fails, is stopped or interrupted)")
        return "\n".join(lines)

    def record_label(self, workers: list[Worker]) -> str:
        return f"slurm:{len(workers)} job {self.capacity.job_id}"
