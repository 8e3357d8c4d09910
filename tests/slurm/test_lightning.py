"""A Slurm-aware framework under torchrun, as users run it: Lightning's DDP on 2 nodes x 2 ranks (gloo, CPU),
through the Slurm lab's target and, the same module, on SSH lab hosts. Every rank must get torchrun's rank and
world size, and what Lightning reads from SLURM_* (its SLURMEnvironment) must not say otherwise: Lightning before
2.1 chose SLURMEnvironment over torchrun's wherever it detected Slurm, and refused the srun step's one task per
node ("You set `--ntasks=2` in your SLURM bash script")."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import podrun

pytestmark = [pytest.mark.lab, pytest.mark.slow]

LIGHTNING_JOB = textwrap.dedent('''\
    """A tiny Lightning DDP job: a linear model, a few steps, every rank saying what it is."""
    import socket

    import lightning.pytorch as pl
    import torch
    from lightning.fabric.plugins.environments import SLURMEnvironment


    def slurm_view():
        """The ranks Lightning's SLURMEnvironment reads from SLURM_*, which Lightning before 2.1 chose over
        torchrun's (TorchElasticEnvironment) wherever it detected Slurm: none, or what it makes of them."""
        if not SLURMEnvironment.detect():
            return "none"
        try:
            environment = SLURMEnvironment()
        except RuntimeError as error:  # its check of the srun variables
            return "refused(%s)" % str(error).split(" in your")[0]
        return "rank=%d,world_size=%d" % (environment.global_rank(), environment.world_size())


    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_index):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def on_train_start(self):
            print("rank %d world_size %d local_rank %d node_rank %d host %s environment %s slurm %s" % (
                self.global_rank, self.trainer.world_size, self.local_rank, self.trainer.node_rank,
                socket.gethostname(), type(self.trainer.strategy.cluster_environment).__name__, slurm_view()),
                flush=True)

        def on_train_end(self):
            weights = sum(parameter.sum().item() for parameter in self.parameters())
            print("rank %d steps %d weights %.6f" % (self.global_rank, self.trainer.global_step, weights), flush=True)


    if __name__ == "__main__":
        torch.manual_seed(0)
        x = torch.randn(64, 8)
        data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
        trainer = pl.Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", max_steps=3, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Tiny(), data)
        # Lightning leaves the process group to the script: left to the interpreter's exit, gloo's threads abort a
        # rank now and then ("terminate called without an active exception", SIGABRT: 1 run in 5 here); and every
        # rank done first, as a rank that tears gloo down while its peer still sends aborts the same way
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
''')
BODY = "run: train.py\ntorchrun: {nproc_per_node: 2}\n"
STARTED = re.compile(r"^\[w(\d) r(\d)\] rank (\d) world_size (\d) local_rank (\d) node_rank (\d) host (\S+) "
                     r"environment (\w+) slurm (.+)$", re.M)
ENDED = re.compile(r"^\[w\d r(\d)\] rank \d steps (\d+) weights (\S+)$", re.M)


@pytest.fixture(autouse=True)
def lightning():
    pytest.importorskip("lightning", reason="the suite's packages (.ci/suite-packages.txt) hold lightning")


def assert_torchruns_ranks(result, hosts: list[str]) -> None:
    """Every rank of 2 nodes x 2 has torchrun's rank, on its worker's host, and a Slurm view that agrees or
    none; the 3 steps trained one model (DDP kept the weights equal)."""
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    started = {int(rank): groups for _, rank, *groups in STARTED.findall(result.stdout)}
    assert sorted(started) == [0, 1, 2, 3], result.stdout
    for rank, (global_rank, world_size, local_rank, node_rank, host, environment, slurm) in started.items():
        worker = rank // 2
        assert (int(global_rank), int(world_size), int(local_rank), int(node_rank), host) == \
            (rank, 4, rank % 2, worker, hosts[worker]), result.stdout
        assert environment == "TorchElasticEnvironment", result.stdout
        assert slurm in ("none", f"rank={rank},world_size=4"), result.stdout  # as torchrun says, if at all
    ended = {int(rank): (int(steps), weights) for rank, steps, weights in ENDED.findall(result.stdout)}
    assert sorted(ended) == [0, 1, 2, 3] and len(set(ended.values())) == 1 and ended[0][0] == 3, result.stdout


def test_lightning_ddp_under_torchrun_on_slurm_gets_torchruns_ranks(home, slurm_lab, job_file):
    cluster = slurm_lab
    cluster.cancel_all()
    spec = job_file(f"target: {{slurm: {{login: {cluster.login_address}, nodes: 2}}}}\n"
                    f"ssh: {{identity_file: {cluster.client_key}}}\n"
                    f"env: {{PATH: '{Path(sys.executable).parent}:/usr/bin:/bin'}}\n" + BODY,
                    files={"train.py": LIGHTNING_JOB})
    try:
        result = podrun("exec", spec, "--no-collapse", timeout=300)
    finally:
        cluster.cancel_all()
    assert_torchruns_ranks(result, [node.name for node in cluster.nodes[:2]])
    assert "slurm none" in result.stdout  # the srun step's task variables are not the ranks'


def test_lightning_ddp_under_torchrun_on_ssh_hosts_gets_torchruns_ranks(home, lab, hosts_spec):
    result = podrun("exec", hosts_spec(BODY, hosts=(0, 1), files={"train.py": LIGHTNING_JOB}), "--no-collapse",
                    timeout=300)
    assert_torchruns_ranks(result, [lab.run(index, "hostname").stdout.strip() for index in (0, 1)])
