"""The judge against a real OpenAI-compatible server: vLLM's API server (CPU) with a tiny local
model on 127.0.0.1. The model is random, so this checks the protocol and the parsing (a verdict
is parsed, or a clear parse error is reported), not the verdict's wisdom.
"""

from __future__ import annotations

import pytest

from agent_envs.rewards.judge import LLMJudge
from tests.servers import free_port, running_server, vllm_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

Q, GOLD = "What is the capital of France?", ["Paris"]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("vllm")
    from algorithms.models.tiny import build_tiny_model

    port = free_port()
    cmd = vllm_command(build_tiny_model(), "tiny-judge", port, "--distributed-executor-backend", "uni")
    # engine core in the server process: one start-up, not three
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with running_server(cmd, port, tmp_path_factory.mktemp("vllm") / "server.log", env, "/v1/models") as url:
        yield f"{url}/v1"


def test_strict_judge_over_vllm_parses_or_reports(vllm_server: str) -> None:
    judge = LLMJudge(base_url=vllm_server, max_tokens=8, max_retries=0)  # model name from /v1/models
    verdicts = [judge.judge(Q, GOLD, p) for p in ("Paris", "Lyon")]
    assert judge.model == "tiny-judge"
    for v in verdicts:
        assert isinstance(v.raw, str)  # the completion came back over the real protocol
        if v.correct is None:
            assert v.error.startswith(
                "unparseable verdict: judge reply does not begin with Correct or Incorrect"
            )
        else:
            assert v.error is None


def test_constrained_judge_over_vllm_gives_a_parsed_cached_verdict(vllm_server: str) -> None:
    # vLLM's structured outputs force the reply to be one of the two words, so even a random
    # model yields a verdict; this exercises the success path end to end
    judge = LLMJudge(
        base_url=vllm_server, model="tiny-judge", max_tokens=16, max_retries=0,
        extra_body={"structured_outputs": {"choice": ["Correct", "Incorrect"]}},
    )  # fmt: skip
    v = judge.judge(Q, GOLD, "Paris")
    assert v.error is None, v.error
    assert v.correct in (True, False) and v.raw in ("Correct", "Incorrect")
    again = judge.judge(Q, GOLD, "Paris")
    assert again.cached and again.correct == v.correct


def test_reference_rule_over_vllm_always_decides(vllm_server: str) -> None:
    judge = LLMJudge(base_url=vllm_server, model="tiny-judge", judge_rule="reference", max_tokens=8)
    assert judge.judge(Q, GOLD, "paris").correct is True  # equal answers decide before the reply
    assert judge.judge(Q, GOLD, "Lyon").correct in (True, False)
