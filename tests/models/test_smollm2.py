"""SmolLM2-135M-Instruct, a real pretrained model, on every engine: greedy rollouts give the same
token ids on the HF engine and vLLM's CPU engine; AgentMath-v0 episodes driven by the runner
pass the rollout health checks (`fatal`) with its real chat template, in both text protocols; and
vLLM, after a LoRA weight sync, gives the learner's log-probs.

The engines live for this module only (starting vLLM is most of its time), so their memory is
free again for the test directories that come after."""

from __future__ import annotations

import asyncio
import math

import gymnasium as gym
import pytest
import torch
from model_helpers import TOL, max_gap
from transformers import AutoModelForCausalLM

import agent_envs  # noqa: F401  (registers the ids)
from algorithms.core.weight_gather import every_rank_weights
from algorithms.models.lora import LoRAConfig, merged_weights, wrap_lora
from algorithms.rollout.engine import SamplingParams, Segment
from algorithms.rollout.health import FAULTS, HealthChecker, RecordedEngine
from algorithms.rollout.runner import run_episodes

pytestmark = pytest.mark.slow

QUESTIONS = ("What is 12 * 7?", "Name the capital of France.", "Write one sentence about the sea.")
BUDGET = 64  # response tokens per episode: the call, its result and the model's reply to it
# One tool call per protocol, the same computation; the result is the sandbox's real output.
OPENINGS = {
    "arpo": ("<think> I will compute it. </think> <python> print(6 * 7) </python>", "</python>"),
    "json": ('<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>', "</tool_call>"),
}


@pytest.fixture(scope="module")
def smollm2_hf(smollm2_path):
    from algorithms.rollout.hf import HFEngine

    torch.set_num_threads(1)
    return HFEngine(smollm2_path, seed=0)


@pytest.fixture(scope="module")
def smollm2_vllm(smollm2_path):
    import gc

    from algorithms.rollout.vllm import VLLMEngine

    # enforce_eager: skips torch.compile, which costs most of a minute of start-up on this CPU
    engine = VLLMEngine(smollm2_path, max_model_len=1024, enforce_eager=True, kv_cache_gb=1, seed=0)
    yield engine
    del engine
    gc.collect()


def chat_ids(tok, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_hf_and_vllm_greedy_rollouts_agree(smollm2_hf, smollm2_vllm):
    tok = smollm2_hf.tokenizer
    prompts = [chat_ids(tok, q) for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    hf, vllm = smollm2_hf.generate(prompts, params), smollm2_vllm.generate(prompts, params)
    for q, a, b in zip(QUESTIONS, hf, vllm, strict=True):
        assert a.token_ids == b.token_ids, (q, tok.decode(a.token_ids), tok.decode(b.token_ids))
        assert len(a.token_ids) >= 5
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-3
    assert "Paris" in tok.decode(hf[1].token_ids)


class ScriptedOpening:
    """The HF engine, except that an episode's first segment is a given tool call.

    SmolLM2-135M writes neither protocol's tool calls zero-shot (it answers in prose, or writes
    markdown code blocks), so without this no episode would hold a tool result to check. The
    call's ids are the tokenizer's encoding of the text, with the model's own log-probs of them;
    the tool runs in the real sandbox, and everything after its result is the model's sampling.
    """

    def __init__(self, engine, opening: str, stop: str) -> None:
        self.engine, self.opening, self.stop = engine, opening, stop
        self.tokenizer = engine.tokenizer
        self.ids = self.tokenizer(opening, add_special_tokens=False)["input_ids"]

    async def agenerate(self, prompts, params) -> list[Segment]:
        return await asyncio.to_thread(self.generate, prompts, params)

    def generate(self, prompts, params) -> list[Segment]:
        fresh = [i for i, p in enumerate(prompts) if self.opening not in self.tokenizer.decode(p)]
        rest = [i for i in range(len(prompts)) if i not in fresh]
        params = params if isinstance(params, list) else [params] * len(prompts)
        out: dict[int, Segment] = {}
        if rest:
            segs = self.engine.generate([prompts[i] for i in rest], [params[i] for i in rest])
            out.update(zip(rest, segs, strict=True))
        for i in fresh:
            ids = torch.tensor([list(prompts[i]) + self.ids])
            with torch.no_grad():
                logits = self.engine.model(input_ids=ids).logits[0, len(prompts[i]) - 1 : -1].float()
            lps = torch.log_softmax(logits, -1).gather(1, torch.tensor(self.ids)[:, None])[:, 0]
            out[i] = Segment(list(self.ids), lps.tolist(), None, "stop", self.stop, self.opening)
        return [out[i] for i in range(len(prompts))]


@pytest.mark.parametrize("protocol", ["arpo", "json"])
def test_tool_episodes_pass_the_health_checks(smollm2_hf, protocol):
    opening, stop = OPENINGS[protocol]
    engine = RecordedEngine(ScriptedOpening(smollm2_hf, opening, stop))
    tok = smollm2_hf.tokenizer

    def make_env():
        return gym.make("AgentMath-v0", tokenizer=tok, protocol=protocol, max_response_tokens=BUDGET).unwrapped

    env = make_env()
    assert stop in env.stop_sequences
    trajs = asyncio.run(run_episodes(engine, make_env, SamplingParams(temperature=1.0, seed=0), n_prompts=2,
                                     group_size=1, max_response_tokens=BUDGET))
    checker = HealthChecker.for_env(env, mode="fatal", engine=engine, tokenizer=tok, max_response_tokens=BUDGET)
    report = checker.check(trajs)
    assert {c: report.counts[c] for c in FAULTS} == dict.fromkeys(FAULTS, 0), report.first
    checker.raise_or_warn(report.faults)  # fatal: raises on any fault
    # the interesting shape really happened: call (trained), result (not trained), the model's reply
    obs_head = " <result>" if protocol == "arpo" else "<|im_end|>\n<|im_start|>tool\n"  # SmolLM2's tool role
    for t in trajs:
        assert len(t.segment_starts) >= 2 and t.response_ids[: len(engine.ids)] == engine.ids
        inserted = [i for i, m in enumerate(t.loss_mask) if m == 0]
        first, second = inserted[0], t.segment_starts[1]
        assert first == len(engine.ids) and inserted == list(range(first, second))
        result = tok.decode(t.response_ids[first:second])
        assert result.startswith(obs_head) and "42" in result, result
        assert all(m == 1 for m in t.loss_mask[second:]) and math.isfinite(t.reward)
        assert len(t.response_ids) <= BUDGET


def test_vllm_after_a_lora_sync_matches_the_learner(smollm2_path, smollm2_vllm, smollm2_hf):
    """The learner's colocated sync: its state streamed pair by pair (`every_rank_weights`) and
    merged on the way. On SmolLM2 rather than the tiny model, to share this module's vLLM engine;
    the engine gets its base weights back at the end."""
    model = wrap_lora(AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32),
                      LoRAConfig(enabled=True, r=8))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # adapters as if trained: B is zero after initialisation
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    model.eval()
    tok = smollm2_hf.tokenizer
    prompts = [tok(q, add_special_tokens=False)["input_ids"] for q in ("The sea is", "Numbers: 1, 2, 3,")]
    try:
        assert max_gap(smollm2_vllm, model, prompts) > 10 * TOL
        smollm2_vllm.sync_weights(merged_weights(every_rank_weights(model.state_dict(), "cpu"), model))
        assert max_gap(smollm2_vllm, model, prompts) < TOL
    finally:
        smollm2_vllm.sync_weights(smollm2_hf.model)
    assert max_gap(smollm2_vllm, smollm2_hf.model, prompts) < TOL
