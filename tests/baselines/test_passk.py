"""pass@k against hand-computed values, and the per-task aggregation."""

from __future__ import annotations

import pytest

from baselines.evaluation.passk import pass_at_k, summarize


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    with pytest.raises(ValueError, match="at least 3 samples"):
        pass_at_k(2, 1, 3)


def test_summarize_means_over_samples_then_tasks():
    rows = [
        {"task_id": "a", "sample": 0, "correct": 1.0, "f1": 1.0},
        {"task_id": "a", "sample": 1, "correct": 0.0, "f1": 0.5},
        {"task_id": "b", "sample": 0, "correct": 0.0, "f1": 0.0},
        {"task_id": "b", "sample": 1, "correct": 0.0, "f1": 0.0},
    ]
    out = summarize(rows, ks=(1, 2))
    assert out["pass@1"] == pytest.approx(0.25)  # (0.5 + 0) / 2
    assert out["pass@2"] == pytest.approx(0.5)
    assert out["any_correct"] == pytest.approx(0.5) and out["f1"] == pytest.approx(0.375)
    assert "sample" not in out
