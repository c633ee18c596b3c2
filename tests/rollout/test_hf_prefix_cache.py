"""The HF engine's KV-cache reuse across tool turns: the same tokens and log-probs as feeding the
whole sequence again, on multi-turn episodes of the warmed tiny model with a real tool."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import make_env

from algorithms.rollout import SamplingParams, run_episodes
from algorithms.rollout.hf import HFEngine


async def _episodes(engine, params):
    return await run_episodes(
        engine, lambda: make_env(engine.tokenizer), params, n_prompts=4, group_size=4, max_response_tokens=256
    )


def _engines(hf_engine):
    # both decode with the shared session model; only the reuse differs
    refeed = HFEngine(hf_engine.model, hf_engine.tokenizer, prefix_cache_tokens=0, seed=0)
    reuse = HFEngine(hf_engine.model, hf_engine.tokenizer, seed=0)
    return refeed, reuse


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids
        assert x.loss_mask == y.loss_mask
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
        assert x.entropy == pytest.approx(y.entropy, abs=1e-4)
        assert x.reward == y.reward


@pytest.mark.parametrize("params", [SamplingParams(temperature=0), SamplingParams(temperature=0.8, seed=5)])
async def test_reuse_matches_refeed_on_multi_turn_episodes(hf_engine, params):
    refeed, reuse = _engines(hf_engine)
    a = await _episodes(refeed, params.with_(max_tokens=256))
    b = await _episodes(reuse, params.with_(max_tokens=256))
    _assert_same(a, b)
    # the comparison means something only if episodes continued after tool results
    assert sum(t.tool_calls for t in b) >= 4
    assert reuse.prefix_cache.hit_tokens > 0 and refeed.prefix_cache.hit_tokens == 0
    # a continuation feeds only the tool result and the token that closed the call
    assert reuse.prefix_cache.prefill_tokens < refeed.prefix_cache.prefill_tokens


async def test_kept_caches_are_dropped_when_the_weights_change(hf_engine):
    model = hf_engine.model
    refeed, reuse = _engines(hf_engine)
    params = SamplingParams(temperature=0, max_tokens=256)
    await _episodes(reuse, params)
    assert reuse.prefix_cache._entries  # noqa: SLF001 - kept caches exist before the update
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # an in-place update, as an optimizer step makes
            for p in model.parameters():
                p.mul_(1.01)
        reuse.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=1))
        assert not reuse.prefix_cache._entries  # noqa: SLF001 - dropped, and nothing new kept
        _assert_same(await _episodes(refeed, params), await _episodes(reuse, params))
    finally:
        model.load_state_dict(saved)
