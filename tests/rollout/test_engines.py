"""HF and vLLM (CPU) engines on the tiny model: log-probs, stops, seeds, and greedy agreement before
and after a weight sync."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT
from algorithms.rollout import RolloutEngine, SamplingParams, Segment
from algorithms.rollout.engine import cut_at_stop, topk_entropy


def _prompts(tok, n=6):
    out = []
    for i in range(n):
        msgs = [
            {"role": "system", "content": WARMUP_SYSTEM_PROMPT},
            {"role": "user", "content": f"What is {37 * i + 11} * {i + 3}?"},
        ]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


def _reference_logprobs(model, prompt, ids, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, -1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(ids)], lp[len(prompt) - 1 : -1]


def test_sampling_params_reject_bad_values():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=0)
    with pytest.raises(TypeError, match="list of strings"):
        SamplingParams(stop="</python>")
    assert SamplingParams(max_tokens=9).with_(max_tokens=3).max_tokens == 3


def test_cut_at_stop_and_topk_entropy():
    assert cut_at_stop("a </python> b </search>", ["</search>", "</python>"]) == ("a </python>", "</python>")
    assert cut_at_stop("abc", ["x"]) == ("abc", None)
    assert topk_entropy([math.log(0.5), math.log(0.5)]) == pytest.approx(math.log(2))


def test_engines_satisfy_protocol(hf_engine, vllm_engine):
    assert isinstance(hf_engine, RolloutEngine)
    assert isinstance(vllm_engine, RolloutEngine)


def test_hf_logprobs_entropy_and_topk_match_a_full_forward(hf_engine):
    tok = hf_engine.tokenizer
    prompts = _prompts(tok, 3)
    params = SamplingParams(temperature=0.7, max_tokens=24, logprobs=5, seed=3)
    segs = hf_engine.generate(prompts, params)
    for prompt, seg in zip(prompts, segs, strict=True):
        assert len(seg.token_ids) == len(seg.logprobs) == len(seg.top_logprobs) == len(seg.entropy) > 0
        ref, lp = _reference_logprobs(hf_engine.model, prompt, seg.token_ids, temperature=0.7)
        assert seg.logprobs == pytest.approx(ref, abs=1e-4)
        for j, top in enumerate(seg.top_logprobs):
            assert top == pytest.approx(lp[j].topk(5).values.tolist(), abs=1e-4)
            assert top == sorted(top, reverse=True)
            ent = -(lp[j].exp() * lp[j]).sum().item()
            assert seg.entropy[j] == pytest.approx(ent, abs=1e-4)


def test_hf_top_k_and_top_p_restrict_the_sampled_distribution(hf_engine):
    prompts = _prompts(hf_engine.tokenizer, 2)
    segs = hf_engine.generate(prompts, SamplingParams(top_k=3, max_tokens=16, logprobs=5, seed=1))
    for seg in segs:
        for top, lp in zip(seg.top_logprobs, seg.logprobs, strict=True):
            assert top[3] == -math.inf and top[4] == -math.inf  # only 3 tokens keep mass
            assert sum(math.exp(x) for x in top[:3]) == pytest.approx(1.0, abs=1e-5)
            assert lp >= top[2] - 1e-6
    segs = hf_engine.generate(prompts, SamplingParams(top_p=0.05, max_tokens=8, logprobs=2))
    for seg in segs:  # a tiny nucleus keeps only the top token: sampling is forced
        assert all(lp == pytest.approx(0.0, abs=1e-6) for lp in seg.logprobs)


def test_hf_seed_n_and_per_request_max_tokens(hf_engine):
    prompts = _prompts(hf_engine.tokenizer, 2)
    params = [SamplingParams(max_tokens=40, seed=7, n=3), SamplingParams(max_tokens=9, seed=8)]
    a = hf_engine.generate(prompts, params)
    b = hf_engine.generate(prompts, params)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert len(a) == 4  # n=3 for the first prompt, then 1: prompt-major order
    assert len({tuple(s.token_ids) for s in a[:3]}) > 1  # the n samples differ
    assert all(len(s) <= 40 for s in a[:3]) and len(a[3]) <= 9
    assert all(s.finish_reason in ("length", "eos", "stop") for s in a)
    with pytest.raises(ValueError, match="2 prompts but 3"):
        hf_engine.generate(prompts, [SamplingParams()] * 3)


def _check_stop(engine):
    prompts = _prompts(engine.tokenizer, 6)
    segs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=80, stop=["</python>"]))
    stopped = [s for s in segs if s.finish_reason == "stop"]
    assert stopped, "the warmed tiny model writes a <python> call for these prompts"
    for seg in stopped:
        assert seg.stop_str == "</python>" and seg.text.endswith("</python>")
        assert seg.text.count("</python>") == 1
        # the ids include the token that completed the stop string, and nothing after it
        decoded = engine.tokenizer.decode(seg.token_ids, skip_special_tokens=True)
        assert decoded.endswith("</python>")
    return segs


def test_hf_stop_strings(hf_engine):
    _check_stop(hf_engine)


def test_vllm_stop_strings_and_eos(vllm_engine):
    segs = _check_stop(vllm_engine)
    eos = vllm_engine.tokenizer.eos_token_id
    for seg in segs:
        assert (seg.finish_reason == "eos") == (seg.token_ids[-1] == eos)


def _greedy(engine, prompts):
    return engine.generate(prompts, SamplingParams(temperature=0, max_tokens=48, logprobs=5))


def test_vllm_and_hf_agree_greedily_and_after_weight_sync(hf_engine, vllm_engine, tiny_model_path):
    from transformers import AutoModelForCausalLM

    prompts = _prompts(hf_engine.tokenizer, 6)
    hf0, vl0 = _greedy(hf_engine, prompts), _greedy(vllm_engine, prompts)
    assert [s.token_ids for s in vl0] == [s.token_ids for s in hf0]
    for a, b in zip(hf0, vl0, strict=True):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-3)
        assert b.top_logprobs == [pytest.approx(t, abs=1e-3) for t in a.top_logprobs]
        assert a.text == b.text and a.finish_reason == b.finish_reason

    # the learner: a separately loaded copy, randomly perturbed
    learner = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    original = {k: v.clone() for k, v in learner.state_dict().items()}
    gen = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    try:
        # a full state dict, as the learner gathers it from FSDP or ZeRO-3 shards
        vllm_engine.sync_weights(learner.state_dict())
        hf_engine.sync_weights(learner)
        hf1, vl1 = _greedy(hf_engine, prompts), _greedy(vllm_engine, prompts)
        assert [s.token_ids for s in hf1] != [s.token_ids for s in hf0], (
            "the perturbation changes greedy output"
        )
        assert [s.token_ids for s in vl1] == [s.token_ids for s in hf1]
        assert vllm_engine.stats()["weight_version"] >= 1
    finally:
        learner.load_state_dict(original)
        # a stream of (name, tensor) pairs, as colocated ranks receive them from rank 0
        vllm_engine.sync_weights(iter(learner.state_dict().items()))
        hf_engine.sync_weights(learner)
    assert [s.token_ids for s in _greedy(vllm_engine, prompts)] == [s.token_ids for s in hf0]


def test_vllm_seeded_sampling_topk_entries_and_budget(vllm_engine):
    prompts = _prompts(vllm_engine.tokenizer, 3)
    params = [
        SamplingParams(max_tokens=4, seed=1, logprobs=3),
        SamplingParams(max_tokens=12, seed=2, n=2),
        SamplingParams(max_tokens=0),
    ]
    a, b = vllm_engine.generate(prompts, params), vllm_engine.generate(prompts, params)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert len(a) == 4 and len(a[0]) <= 4 and all(len(s) <= 12 for s in a[1:3]) and a[3].token_ids == []
    assert all(isinstance(s, Segment) for s in a)
    assert all(len(top) == 3 for top in a[0].top_logprobs)  # rank <= k only, never the k+1-th entry
    assert a[1].top_logprobs is None and a[0].entropy is None
    with pytest.raises(ValueError, match="max_logprobs"):
        vllm_engine.generate(prompts[:1], SamplingParams(logprobs=50))


def test_vllm_prefix_cache_hits_and_reset_on_weight_sync(vllm_engine, hf_engine):
    # the CPU backend's KV blocks hold 128 tokens and only full blocks are reused: use a long prompt
    long_prompt = (_prompts(vllm_engine.tokenizer, 1)[0] * 20)[:400]
    vllm_engine.generate([long_prompt], SamplingParams(max_tokens=2))
    before = vllm_engine.stats()
    if "prefix_cache_hits" not in before:
        pytest.skip("this vLLM build exposes no prefix-cache metrics")
    vllm_engine.generate([long_prompt + [5]], SamplingParams(max_tokens=2))
    hit = vllm_engine.stats()["prefix_cache_hits"] - before["prefix_cache_hits"]
    assert hit >= 128
    # after a weight sync the old KV must not be reused
    vllm_engine.sync_weights(hf_engine.model)
    mid = vllm_engine.stats()["prefix_cache_hits"]
    vllm_engine.generate([long_prompt + [6]], SamplingParams(max_tokens=2))
    assert vllm_engine.stats()["prefix_cache_hits"] == mid


async def test_agenerate_runs_in_a_thread(hf_engine):
    prompts = _prompts(hf_engine.tokenizer, 2)
    segs = await hf_engine.agenerate(prompts, SamplingParams(temperature=0, max_tokens=6))
    assert [s.token_ids for s in segs] == [
        s.token_ids for s in hf_engine.generate(prompts, SamplingParams(temperature=0, max_tokens=6))
    ]


def test_vllm_seeded_batch_larger_than_one_prefill_step(vllm_engine):
    # vLLM's default step budget (4096 tokens) would prefill these in chunks, which crashes the CPU
    # runner for seeded requests; the engine must keep such batches whole
    prompt = (_prompts(vllm_engine.tokenizer, 1)[0] * 10)[:300]
    prompts = [[*prompt[:-1], 5 + i] for i in range(24)]
    segs = vllm_engine.generate(prompts, SamplingParams(max_tokens=3, seed=9))
    again = vllm_engine.generate(prompts, SamplingParams(max_tokens=3, seed=9))
    assert len(segs) == 24 and [s.token_ids for s in segs] == [s.token_ids for s in again]
