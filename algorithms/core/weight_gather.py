"""The learner's full weights on every rank, for colocated rollout engines.

A colocated engine (`engine: vllm`) lives in every learner rank, so every rank needs the full
weights after each optimizer step. `accelerator.get_state_dict` gathers them from FSDP or ZeRO-3
shards, but hands the result to rank 0 only: FSDP2's full state dict with CPU offload and
DeepSpeed's consolidated 16-bit state dict are empty on the other ranks. `every_rank_weights`
streams rank 0's copy (in CPU memory) to the others one tensor at a time, so the other ranks
never hold a full copy beside their engine's: their extra memory is the largest tensor.
Unsharded learners (one process, DDP) already hold the full weights on every rank; they pass
through with no communication beyond one integer.

    >>> import torch
    >>> state = {"w": torch.ones(2)}
    >>> [(name, t.tolist()) for name, t in every_rank_weights(state, device="cpu")]  # one process
    [('w', [1.0, 1.0])]

Every rank must consume the iterator to the end, in step: each tensor is one collective.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist


def every_rank_weights(
    state: Mapping[str, torch.Tensor] | None, device: Any
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of the full weights on every rank.

    Args:
        state: what `accelerator.get_state_dict(model)` returned on this rank (empty, or None
            in some DeepSpeed versions, on ranks other than 0 under FSDP or ZeRO-3).
        device: where received tensors go; the accelerator's device (NCCL sends CUDA tensors).
    """
    state = state or {}
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        yield from state.items()
        return
    # Does any rank lack the weights? One all-reduce of the smallest key count decides, so
    # every rank takes the same branch.
    count = torch.tensor([len(state)], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    if int(count.item()) > 0:
        yield from state.items()
        return
    header = [[(name, tuple(t.shape), t.dtype) for name, t in state.items()] if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(header, src=0)
    if not header[0]:
        raise RuntimeError(
            "every_rank_weights: rank 0 holds no weights either; accelerator.get_state_dict returned an "
            "empty state dict on every rank (for ZeRO-3 set zero3_save_16bit_model: true in the "
            "accelerate config)"
        )
    for name, shape, dtype in header[0]:
        if dist.get_rank() == 0:
            tensor = state[name].detach().to(device).contiguous()
        else:
            tensor = torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(tensor, src=0)
        yield name, tensor
        del tensor  # the engine has copied it: drop the device copy before the next one


__all__ = ["every_rank_weights"]
