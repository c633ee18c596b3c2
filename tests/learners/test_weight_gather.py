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


@pytest.mark.stress
def test_two_colocated_ranks_sample_from_the_synced_weights(sft_run, tmp_path):
    # Two DDP ranks, each with its own in-process vLLM engine. After step 1 both engines must
    # hold the updated weights: at step 2 the learner recomputes the log-probs of what each
    # engine sampled, and the rollout importance ratio pi_learner / pi_engine stays at 1 on
    # every rank's tokens only if every engine was synced (extremes are gathered over ranks).
    # Measured: [1.0000, 1.0000] at both steps; with rank 1's engine left unsynced (it joined the
    # broadcasts but loaded nothing) step 2 showed [0.0026, 77].
    import json

    from learner_support import SFT_ENV_OVERRIDE

    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    out = tmp_path / "run"
    cmd = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", "29542",
           "-m", "agent_envs.cli", "train", "--algo", "grpo", "--config", "configs/grpo_tiny.yaml",
           f"model={sft_run['model']}", f"output_dir={out}", "total_steps=2", "prompts_per_step=4",
           "group_size=4", "max_response_tokens=64", "micro_batch_size=4", "mini_batch_prompts=4",
           "lr=1e-3", "progress=false", "tensorboard=false", "save_every=0", "eval_every=0",
           SFT_ENV_OVERRIDE, "engine=vllm",
           'engine_kwargs={"enforce_eager": true, "kv_cache_gb": 1, "max_model_len": 1024}']  # fmt: skip
    env = {**cli_env(), "ACCELERATE_USE_CPU": "1"}
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    print("\n" + "\n".join(f"step {r['step']}: grad_norm {r['grad_norm']:.3g} is_ratio "
                           f"[{r['is_ratio/min']:.4f}, {r['is_ratio/max']:.4f}]" for r in rows))
    assert rows[0]["grad_norm"] > 0  # step 1 changed the weights, so a stale engine would show
    assert rows[1]["is_ratio/min"] > 0.98 and rows[1]["is_ratio/max"] < 1.02
