"""The judge against a real OpenAI-compatible server: vLLM's API server (CPU) with a tiny local
model on 127.0.0.1. The model is random, so this checks the protocol and the parsing (a verdict
is parsed, or a clear parse error is reported), not the verdict's wisdom.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agent_envs.rewards.judge import LLMJudge

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

Q, GOLD = "What is the capital of France?", ["Paris"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("vllm")
    from algorithms.models.tiny import build_tiny_model

    model = build_tiny_model()
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in the server process: one start-up, not three
    }
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "tiny-judge", "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "1024", "--dtype", "float32", "--enforce-eager",
        "--distributed-executor-backend", "uni",
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300  # start-up is ~40 s on an idle 2-core machine
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{Path(log).read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vLLM server not up after 300 s:\n{Path(log).read_text()[-3000:]}")
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


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
