"""Sharded learners feed colocated engines: every rank gets the full weights (docs/scaling.md).

Two real torchrun ranks on CPU with gloo (tests/learners/weight_gather_ranks.py). Under FSDP2 the
full state dict exists on rank 0 only; `every_rank_weights` must hand rank 1 the same tensors.
Accelerate does not run FSDP on CPU (it falls back to one undistributed process), so the ranks
shard with torch's `fully_shard` and take the state dict with the options Accelerate uses.
The in-process vLLM engine's side (a state dict or a stream of pairs) is tested in
tests/rollout/test_engines.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from learner_support import REPO, cli_env
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from algorithms.models.tiny import build_tiny_model


def _ranks(mode: str, out) -> list[dict]:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    assert torchrun, "torchrun is not installed in this environment"
    cmd = [torchrun, "--nproc_per_node", "2", "--master_port", "29541",
           str(REPO / "tests/learners/weight_gather_ranks.py"), str(out), mode]  # fmt: skip
    proc = subprocess.run(cmd, env=cli_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [load_file(out / f"rank{r}.safetensors") for r in range(2)]


def _local_keys(path) -> int:
    with safe_open(str(path), "pt") as f:
        return int(f.metadata()["local_keys"])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_every_rank_gets_the_full_weights(mode, tmp_path):
    ranks = _ranks(mode, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=0), dtype=torch.float32)
    with torch.no_grad():  # the ranks' perturbation (parameters, so a tied embedding counts once)
        for i, p in enumerate(model.parameters()):
            p.add_(0.01 * (i + 1))
    expected = model.state_dict()
    if mode == "fsdp":  # the case the broadcast exists for: rank 1's own state dict is empty
        assert _local_keys(tmp_path / "rank0.safetensors") > 0 == _local_keys(tmp_path / "rank1.safetensors")
    for got in ranks:
        assert set(got) == set(expected)
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), name
