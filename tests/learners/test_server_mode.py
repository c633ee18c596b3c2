"""Server-mode rollouts: the policy served by `agent-envs serve-rollout` (a real vLLM CPU server
in another process), token ids in and out, and weights synced into it from the learner.

The colocated reference is the learner's default engine (HF, decoding with the learner's own
module). The learner test (stress suite) runs two `accelerate` ranks against the server in a
third process and compares them with a colocated in-process vLLM run on the same seeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from learner_support import REPO, SFT_ENV_OVERRIDE, cli_env

from algorithms.rollout import HFEngine, SamplingParams
from algorithms.rollout.vllm_server import VLLMServerEngine
from tests.servers import free_port, running_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(sft_run, tmp_path_factory):
    port = free_port()
    cmd = [sys.executable, "-m", "agent_envs.cli", "serve-rollout", sft_run["model"], "--port", str(port),
           "--vllm-args", "--dtype float32 --max-model-len 1024 --enforce-eager"]
    with running_server(cmd, port, tmp_path_factory.mktemp("rollout-server") / "server.log", cli_env()) as url:
        yield f"{url}/v1"


def _prompts(tok, n=3):
    return [tok(f"<|im_start|>user\nWhat is {i + 23} * 17?<|im_end|>\n<|im_start|>assistant\n",
                add_special_tokens=False)["input_ids"] for i in range(n)]


def test_server_greedy_tokens_match_colocated_and_weights_follow_the_learner(server, sft_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    learner = AutoModelForCausalLM.from_pretrained(sft_run["model"], dtype=torch.float32)
    colocated = HFEngine(learner, AutoTokenizer.from_pretrained(sft_run["model"]), seed=0)
    remote = VLLMServerEngine(server, tokenizer=colocated.tokenizer)
    prompts = _prompts(colocated.tokenizer)
    greedy = SamplingParams(temperature=0, max_tokens=32, logprobs=2)

    ours, theirs = colocated.generate(prompts, greedy), remote.generate(prompts, greedy)
    assert [s.token_ids for s in theirs] == [s.token_ids for s in ours]
    for a, b in zip(theirs, ours, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=2e-3)

    # one noisy "update" of the learner; the server must sample from it after the sync, not before
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in learner.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    stale = remote.generate(prompts, greedy)
    remote.sync_weights(learner)
    assert remote.server_weight_version() == "1"
    fresh, expected = remote.generate(prompts, greedy), colocated.generate(prompts, greedy)
    assert [s.token_ids for s in fresh] == [s.token_ids for s in expected]
    assert [s.token_ids for s in fresh] != [s.token_ids for s in stale], "the perturbation changed nothing"
    for a, b in zip(fresh, expected, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=2e-3)
    sync = remote.sync_dir / "model.safetensors"
    assert sync.is_file() and not (remote.sync_dir / "model.safetensors.partial").exists()


def test_a_server_without_the_weight_endpoints_is_a_clear_error():
    remote = VLLMServerEngine("http://127.0.0.1:9/v1", tokenizer=object())
    with pytest.raises(RuntimeError, match="stopped answering .* Is it running"):
        remote.server_weight_version()
    with pytest.raises(ValueError, match="needs the policy's tokenizer"):
        VLLMServerEngine("http://127.0.0.1:9/v1")


ARGS = [
    "total_steps=2", "prompts_per_step=4", "group_size=4", "max_response_tokens=64", "temperature=0.6",
    "micro_batch_size=4", "mini_batch_prompts=4", "lr=3e-4", "progress=false", "tensorboard=false",
    "save_every=0", "eval_every=0", SFT_ENV_OVERRIDE,
]  # fmt: skip


def _train(processes: int, model: str, out: Path, extra: list[str]) -> list[dict]:
    import shutil

    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    env = {**cli_env(), "ACCELERATE_USE_CPU": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    mode = ["--multi_gpu"] if processes > 1 else ["--cpu"]
    cmd = [accelerate, "launch", *mode, "--num_processes", str(processes), "--main_process_port", "29541",
           "-m", "agent_envs.cli", "train", "--algo", "grpo", "--config", "configs/grpo_tiny.yaml",
           f"model={model}", f"output_dir={out}", *ARGS, *extra]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.stress
def test_two_ranks_train_against_the_server_like_a_colocated_engine(server, sft_run, tmp_path):
    engine = {"base_url": server}
    remote = _train(2, sft_run["model"], tmp_path / "server", ["engine=vllm-server",
                                                               f"engine_kwargs={json.dumps(engine)}"])
    local = _train(1, sft_run["model"], tmp_path / "colocated",
                   ["engine=vllm", 'engine_kwargs={"enforce_eager": true, "kv_cache_gb": 1, "max_model_len": 1024}'])
    first_remote, first_local = remote[0], local[0]
    print(f"\nserver: {first_remote}\ncolocated: {first_local}")
    # the same seeds sample the same episodes: rewards agree, the update agrees to float tolerance
    for key in ("reward_mean", "reward_std", "pg_loss", "entropy"):
        assert first_remote[key] == pytest.approx(first_local[key], rel=1e-3, abs=1e-5), key
    assert len(remote) == len(local) == 2


@pytest.mark.stress
def test_a_killed_server_stops_the_run_clearly_and_it_resumes_once_the_server_is_back(sft_run, tmp_path):
    port, out = free_port(), tmp_path / "run"
    serve = [sys.executable, "-m", "agent_envs.cli", "serve-rollout", sft_run["model"], "--port", str(port),
             "--vllm-args", "--dtype float32 --max-model-len 1024 --enforce-eager"]
    train = [sys.executable, "-m", "agent_envs.cli", "train", "--algo", "grpo", "--config", "configs/grpo_tiny.yaml",
             f"model={sft_run['model']}", f"output_dir={out}", *ARGS, "save_every=1", "total_steps=4",
             "engine=vllm-server",
             f"engine_kwargs={json.dumps({'base_url': f'http://127.0.0.1:{port}/v1', 'max_retries': 1})}"]
    metrics = out / "metrics.jsonl"
    with running_server(serve, port, tmp_path / "server1.log", cli_env()):
        run = subprocess.Popen(train, env=cli_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        deadline = time.monotonic() + 600
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 1):
            assert run.poll() is None, run.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no step finished in 600 s"
            time.sleep(0.5)
    # the server is gone (SIGTERM, then SIGKILL) while the run goes on to its next step
    output, _ = run.communicate(timeout=300)
    assert run.returncode != 0
    assert "stopped answering" in output and "--resume" in output, output[-3000:]
    done = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    print(f"\nkilled after steps {done}; the run stopped with a clear error")
    with running_server(serve, port, tmp_path / "server2.log", cli_env()):
        resumed = subprocess.run([*train, "--resume"], env=cli_env(), cwd=REPO, capture_output=True, text=True,
                                 timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps[-1] == 4 and set(steps) >= {1, 2, 3, 4}, steps
    print(f"resumed from the last checkpoint: steps {steps}")

