"""`evaluate --record/--replay/--repeats`: an evaluation against a real retrieval server is
recorded, the server is killed, and the replay reproduces every score and response offline.

The model is a stand-in (`SearchThenAnswer`): a random tiny model almost never writes a search
call, and what is under test is the recording, not the model. It searches each question, then
answers either the gold answer or a word taken from the search result, chosen by the sampling
seed, so scores depend on both the tool's answers and the seeds. Everything else is real: the
`agent-envs serve-retriever` subprocess over the multi-hop corpus, HTTP, the env, the runner and
the reward."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

from algorithms.rollout.engine import SamplingParams, Segment
from baselines.evaluation.evaluate import EvalConfig, _run, evaluate, replay
from tests.servers import free_port

REPO = Path(__file__).resolve().parents[2]
CORPUS = "corpus/wiki_multihop_mini.jsonl"


class SearchThenAnswer:
    """Searches the question, then answers from the seed: gold, or a word of the search result.

    `query_suffix` changes what it searches: a different model, for the replay that must notice."""

    def __init__(self, tokenizer, tasks, query_suffix: str = "") -> None:
        self.tokenizer = tokenizer
        self.gold = {t.question: t.answers[0] for t in tasks}
        self.query_suffix = query_suffix

    def _segment(self, text: str, stop: str | None) -> Segment:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return Segment(ids, [-0.5] * len(ids), None, "stop" if stop else "eos", stop, text)

    async def agenerate(self, prompts, params):
        params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        out = []
        for ids, p in zip(prompts, params, strict=True):
            text = self.tokenizer.decode(ids)
            question = next(q for q in self.gold if q in text)
            # the system prompt shows the tags too: read only what came after the question
            results = re.findall(r"<result>(.*?)</result>", text.rsplit(question, 1)[1], flags=re.S)
            if not results:
                out.append(self._segment(f"<think> look it up </think> <search> {question}{self.query_suffix} "
                                         "</search>", "</search>"))
                continue
            digest = hashlib.sha256(f"{p.seed}|{question}".encode()).digest()
            words = re.findall(r"[A-Z][a-z]+", results[-1]) or ["nothing"]
            answer = self.gold[question] if digest[0] % 2 else words[digest[1] % len(words)]
            out.append(self._segment(f"<think> found it </think> <answer> \\boxed{{{answer}}} </answer>", None))
        return out

    def sync_weights(self, model) -> None:  # pragma: no cover - evaluation never syncs
        pass


@pytest.fixture
def retriever(shared_data: Path, tmp_path: Path):
    port = free_port()
    cmd = [sys.executable, "-m", "agent_envs.cli", "serve-retriever", "--corpus", str(shared_data / CORPUS),
           "--port", str(port), "--cache-dir", str(tmp_path / "index")]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, "serve-retriever exited early"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            assert time.monotonic() < deadline, "serve-retriever did not listen within 90 s"
            time.sleep(0.1)
    yield proc, f"http://127.0.0.1:{port}/retrieve"
    proc.kill()
    proc.wait(timeout=20)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from algorithms.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(str(build_tiny_model()))


def test_replay_reproduces_a_recorded_evaluation_without_the_server(tmp_path, retriever, tokenizer):
    proc, url = retriever
    env_kwargs = {"retriever_url": url, "topk": 1}
    tasks = gym.make("AgentQA-HotpotQA-v0", **env_kwargs).unwrapped.tasks
    engine = SearchThenAnswer(tokenizer, [tasks[i] for i in range(6)])
    cfg = EvalConfig(env="AgentQA-HotpotQA-v0", model="search-then-answer", engine="hf", n=1, limit=6,
                     temperature=1.0, max_response_tokens=4000, env_kwargs=env_kwargs, repeats=3,
                     record=str(tmp_path / "rec"))
    recorded = evaluate(cfg, engine)
    calls = [json.loads(line) for line in (tmp_path / "rec" / "tools.jsonl").read_text().splitlines()]
    assert len(calls) == 18 and all(c["tool"] == "search" and c["ok"] for c in calls)  # 6 tasks x 3 seeds
    noise = recorded["noise"]["pass@1"]
    assert noise["per_seed"] != [noise["per_seed"][0]] * 3, "the seeds should move the score"
    assert recorded["metrics"]["pass@1"] == pytest.approx(sum(noise["per_seed"]) / 3)

    proc.kill()  # replay needs no search service
    proc.wait(timeout=20)
    replayed = replay(tmp_path / "rec", engine)
    rep = replayed["replay"]
    print(f"\nreplay: {rep['tools']}, reproduced={rep['reproduced']}")
    assert rep["reproduced"], rep
    assert rep["tools"]["replayed"] == 18 and rep["tools"]["missing"] == 0
    assert replayed["noise"] == recorded["noise"]

    # a model that searches something else is not served invented results, and the replay says so
    other = SearchThenAnswer(tokenizer, [tasks[i] for i in range(6)], query_suffix=" born")
    changed = replay(tmp_path / "rec", other)["replay"]
    assert not changed["reproduced"] and changed["tools"]["missing"] == 18
    assert changed["samples_changed"] == 18 and changed["metric_differences"]


def test_replay_cli_names_a_folder_that_is_not_a_recording(tmp_path, capsys):
    import argparse

    args = argparse.Namespace(replay=str(tmp_path), model=None, tokenizer=None, engine=None, base_url=None)
    with pytest.raises(FileNotFoundError, match=r"not a recorded evaluation \(.*summary.json missing\)"):
        _run(args)


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="repeats=0"):
        EvalConfig(env="AgentMath-v0", model="x", repeats=0).validate()
