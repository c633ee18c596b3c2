"""Test helpers of the model tests: the learner's log-probs of tokens an engine sampled, and the
largest gap between the two."""

from __future__ import annotations

import torch

from algorithms.rollout.engine import SamplingParams

TOL = 2e-3  # nats: how close an engine's log-probs must be to the learner's after a weight sync


def token_logprobs(model, prompt: list[int], response: list[int]) -> list[float]:
    """The learner's log-probs of `response` after `prompt` (temperature 1)."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0].tolist()


def max_gap(engine, model, prompts: list[list[int]]) -> float:
    """Sample from the engine (T=1, no top-k/p), then compare its log-probs with the learner's."""
    segs = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=12, seed=3))
    gaps = [abs(a - b) for p, s in zip(prompts, segs, strict=True)
            for a, b in zip(s.logprobs, token_logprobs(model, p, s.token_ids), strict=True)]
    return max(gaps)
