"""Recorded judge verdicts replayed offline: no endpoint, the same verdicts, misses reported."""

from __future__ import annotations

import pytest
from fake_judge import FakeJudgeServer, candidate_of

from agent_envs.rewards.judge import LLMJudge

Q = "What is the capital of France?"
GOLD = ["Paris"]


def test_offline_judge_replays_recorded_verdicts_and_reports_misses(tmp_path):
    verdicts = tmp_path / "judge.jsonl"
    with FakeJudgeServer(lambda p: "Correct" if "Paris" in candidate_of(p) else "Incorrect") as srv:
        live = LLMJudge(base_url=srv.url, cache_path=str(verdicts))  # model from /v1/models, resolved late
        recorded = [live.judge(Q, GOLD, pred) for pred in ("Paris", "Lyon", "Paris, France")]
        assert len(srv.requests) == 3
    # the server is gone: the offline judge needs no endpoint and asks nobody
    offline = LLMJudge(cache_path=str(verdicts), offline=True)
    replayed = [offline.judge(Q, GOLD, pred) for pred in ("Paris", "Lyon", "Paris, France")]
    assert [v.correct for v in replayed] == [v.correct for v in recorded] == [True, False, True]
    assert all(v.cached for v in replayed)
    miss = offline.judge(Q, GOLD, "Marseille")
    assert miss.correct is None and "not in the recorded verdicts" in miss.error


def test_offline_judge_without_recorded_verdicts_is_an_error_naming_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no recorded verdicts at .*judge.jsonl"):
        LLMJudge(cache_path=str(tmp_path / "judge.jsonl"), offline=True)
