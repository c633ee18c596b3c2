"""One rank of the sharded weight-gather test (tests/learners/test_weight_gather.py), under torchrun.

Shards the tiny model over the ranks with FSDP2 on CPU (gloo), takes its full state dict with
the options `accelerator.get_state_dict` uses for FSDP2 (Accelerate itself will not run FSDP on
CPU: it falls back to no distribution there), streams it to every rank with
`every_rank_weights`, and writes what this rank received to OUT/rank<r>.safetensors.
With `ddp` as the second argument the model is not sharded (every rank holds the full weights,
as under DDP), which must pass through without the broadcast.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(out: Path, mode: str) -> None:
    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from algorithms.core.weight_gather import every_rank_weights
    from algorithms.models.tiny import build_tiny_model

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        build_tiny_model(seed=0)  # built once, then read by both ranks
    dist.barrier()
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=0), dtype=torch.float32)
    with torch.no_grad():  # weights unlike the checkpoint's, so a reload of the file cannot pass
        for i, p in enumerate(model.parameters()):
            p.add_(0.01 * (i + 1))
    if mode == "fsdp":
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)
    else:
        state = model.state_dict()
    got = {name: t.clone() for name, t in every_rank_weights(state, device="cpu")}
    save_file(got, str(out / f"rank{rank}.safetensors"), metadata={"local_keys": str(len(state))})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
