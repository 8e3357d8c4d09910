"""A tiny DeepSpeed job: deepspeed.initialize over torchrun's ranks (gloo on CPU), a few optimizer steps of a
linear model, and every rank saying its rank, its world and the weights it ended with (data parallel keeps them
equal). DeepSpeed takes RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from torchrun; DS_ACCELERATOR=cpu keeps it
off CUDA on a machine without GPUs."""

import os

import deepspeed
import torch
import torch.distributed as dist

CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
    "steps_per_print": 1000,
}

if __name__ == "__main__":
    deepspeed.init_distributed(dist_backend="gloo" if os.environ.get("DS_ACCELERATOR") == "cpu" else "nccl")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    generator = torch.Generator().manual_seed(dist.get_rank())  # each rank its own data
    for step in range(1, 4):
        x = torch.randn(4, 8, generator=generator)
        loss = torch.nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    weights = sum(parameter.sum().item() for parameter in engine.module.parameters())
    print(f"rank {dist.get_rank()} world_size {dist.get_world_size()} weights {weights:.6f}", flush=True)
    # every rank done before the group goes: a rank that tears gloo down while its peer still sends aborts
    # ("terminate called without an active exception", SIGABRT: seen 1 run in 5 under load)
    dist.barrier()
    dist.destroy_process_group()
