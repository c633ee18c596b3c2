"""Segment entropy (docs/algorithms.md §6.3): top-K estimate with rank ≤ K, reductions, exact entropy."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.core.logprobs import token_logprobs
from algorithms.rollout.entropy import (
    measure_segment,
    position_entropies,
    position_entropy,
    segment_entropy,
)
from algorithms.rollout.tree_config import TreeConfig


def test_position_entropy_matches_hand_value():
    lps = [math.log(0.5), math.log(0.25), math.log(0.25)]
    assert position_entropy(lps, topk=3) == pytest.approx(1.5 * math.log(2))


def test_extra_sampled_entry_is_dropped():
    # vLLM returns K+1 entries when the sampled token is outside the top K: keep rank ≤ K only
    # (docs/algorithms.md D4)
    top2 = [math.log(0.6), math.log(0.3)]
    with_extra = [math.log(0.01), *top2]  # order as returned does not matter
    assert position_entropy(with_extra, topk=2) == pytest.approx(position_entropy(top2, topk=2))
    assert position_entropy(with_extra, topk=3) > position_entropy(top2, topk=2)


def test_five_token_segment_golden_values():
    # docs/algorithms.md §9: a 5-token segment with h_j = 1 gives 20/ln|V| (ours) against 5/ln|V| (reference
    # sum)
    h = [1.0] * 5
    v = 151_646
    assert segment_entropy(h, vocab_size=v, tokens=20) == pytest.approx(20 / math.log(v))
    assert segment_entropy(h, vocab_size=v, tokens=20, reduction="sum") == pytest.approx(5 / math.log(v))
    assert segment_entropy(h, vocab_size=v, tokens=20, reduction="mean") == pytest.approx(1 / math.log(v))


def test_full_length_segment_equals_reference_scale_and_only_first_k_count():
    h = [0.5] * 20 + [100.0] * 7
    v = 370
    ours = segment_entropy(h, vocab_size=v, tokens=20)
    assert ours == pytest.approx(segment_entropy(h, vocab_size=v, tokens=20, reduction="sum"))
    assert ours == pytest.approx(10 / math.log(v))


def test_empty_segment_has_no_entropy():
    assert segment_entropy([], vocab_size=100) is None
    assert measure_segment([], None, TreeConfig(), vocab_size=100) is None


def test_tail_correction_adds_the_uniform_tail():
    lps = [math.log(0.5), math.log(0.3)]
    base = position_entropy(lps, topk=2)
    tail = position_entropy(lps, topk=2, vocab_size=12)
    assert tail - base == pytest.approx(-0.2 * math.log(0.2 / 10))


def test_measure_segment_sources():
    rows = [[math.log(0.5), math.log(0.5)]] * 3
    s = TreeConfig(entropy_tokens=4, entropy_topk=2)
    expected = 4 * math.log(2) / math.log(50)
    assert measure_segment(rows, None, s, 50) == pytest.approx(expected)
    auto = TreeConfig(entropy_tokens=4, entropy_topk=2, entropy_source="auto")
    assert measure_segment(rows, [1.0, 1.0, 1.0], auto, 50) == pytest.approx(4 / math.log(50))
    with pytest.raises(ValueError, match="logprobs=K"):
        measure_segment(None, None, s, 50)
    with pytest.raises(ValueError, match="exact"):
        measure_segment(rows, None, TreeConfig(entropy_source="exact"), 50)


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="entropy_reduction"):
        TreeConfig(entropy_reduction="median")
    with pytest.raises(ValueError, match="entropy_topk"):
        TreeConfig(entropy_topk=0)


def test_topk_estimate_equals_exact_entropy_when_k_covers_the_vocabulary():
    torch.manual_seed(0)
    logits = torch.randn(1, 3, 50)
    _, exact = token_logprobs(logits, torch.zeros(1, 3, dtype=torch.long), with_entropy=True)
    rows = torch.log_softmax(logits[0], -1).tolist()
    assert position_entropies(rows, topk=50) == pytest.approx(exact[0].tolist(), abs=1e-5)
    assert all(h < e for h, e in zip(position_entropies(rows, topk=5), exact[0].tolist(), strict=True))
