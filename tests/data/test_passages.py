"""A QA benchmark with no corpus configured searches the passages its question files carry.

The hand-made files run everywhere; the real HotpotQA and MuSiQue files (the shared data
folder) skip where it is absent, saying what to download.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401
from agent_envs.data.passages import collect_passages, row_passages


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# two questions sharing a distractor: the corpus holds it once
HAND_MADE = [
    {"id": "h1", "question": "Who founded the town where Ada was born?", "golden_answers": ["Bran"],
     "contexts": [{"id": "0", "title": "Ada", "paragraph_text": "Ada was born in Quellport.", "is_supporting": True},
                  {"id": "1", "title": "Quellport", "paragraph_text": "Quellport was founded by Bran.",
                   "is_supporting": True},
                  {"id": "2", "title": "Zephyr", "paragraph_text": "Zephyr is a wind.", "is_supporting": False}]},
    {"id": "h2", "question": "Which river flows through Quellport?", "golden_answers": ["Ost"],
     "contexts": [{"id": "0", "title": "Ost", "paragraph_text": "The Ost flows through Quellport.",
                   "is_supporting": True},
                  {"id": "1", "title": "Zephyr", "paragraph_text": "Zephyr is a wind.", "is_supporting": False}]},
]


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty data folder and cache of this test's own."""
    folder = tmp_path / "data"
    folder.mkdir()
    monkeypatch.setenv("AGENT_ENVS_DATA_DIR", str(folder))
    monkeypatch.setenv("AGENT_ENVS_CACHE", str(tmp_path / "cache"))
    return folder


def test_the_passages_of_a_benchmarks_files_are_its_corpus(data: Path, capfd: pytest.CaptureFixture) -> None:
    # the default split carries no passages (as ARPO's file); the IRCoT split does
    write_jsonl(data / "hotpotqa" / "arpo_eval_200.jsonl",
                [{"id": "a0", "question": "Who founded the town where Ada was born?", "golden_answers": ["Bran"]}])
    write_jsonl(data / "hotpotqa" / "dev_500_ircot_with_contexts.jsonl", HAND_MADE)
    env = gym.make("AgentQA-HotpotQA-v0")
    info_line = capfd.readouterr().err.strip()
    assert info_line.count("\n") == 0, info_line
    assert "4 passages" in info_line and "dev_500_ircot_with_contexts.jsonl" in info_line
    assert "arpo_eval_200" not in info_line  # it carries none
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("<think>x</think><search>Quellport founded</search>")
    assert "Doc 1(Title: Quellport) Quellport was founded by Bran." in obs and not terminated
    [corpus] = (data.parent / "cache" / "corpus").glob("hotpotqa-passages-*.jsonl")
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    assert [r["title"] for r in rows] == ["Ada", "Quellport", "Zephyr", "Ost"]
    assert len({r["id"] for r in rows}) == 4
    gym.make("AgentQA-HotpotQA-v0")  # the corpus is built once per process: no second line
    assert capfd.readouterr().err == ""


def test_a_users_own_file_with_passages_gets_them_as_corpus(data: Path, tmp_path: Path) -> None:
    own = write_jsonl(tmp_path / "mine.jsonl", HAND_MADE)
    env = gym.make("AgentQA-v0", data_files=str(own), corpus=None)
    assert isinstance(env.unwrapped, agent_envs.ToolEnv) and env.unwrapped.tasks[0].id == "h1"
    env = gym.make("AgentQA-HotpotQA-v0", data_files=str(own))
    env.reset(options={"index": 1})
    obs = env.step("<think>x</think><search>river Quellport</search>")[0]
    assert "The Ost flows through Quellport." in obs


@pytest.mark.parametrize(("env_id", "folder", "says"), [
    ("AgentQA-Bamboogle-v0", "bamboogle/test.jsonl", "agent-envs serve-retriever --corpus"),
    ("AgentQA-HotpotQA-v0", "hotpotqa/arpo_eval_200.jsonl", "agent-envs data download hotpotqa"),
    ("AgentSearch-WebWalkerQA-v0", "webwalkerqa/arpo_eval_200.jsonl", "search='web'"),
])
def test_a_benchmark_without_passages_says_in_one_line_what_it_needs(data: Path, env_id: str, folder: str,
                                                                      says: str) -> None:
    write_jsonl(data / folder, [{"id": "q", "question": "Who?", "golden_answers": ["Ada"]}])
    with pytest.raises(FileNotFoundError) as caught:
        gym.make(env_id)
    message = str(caught.value)
    assert "\n" not in message and says in message and "corpus=" in message and "retriever_url=" in message


def test_every_passage_layout_is_read() -> None:
    assert row_passages({"paragraphs": [{"idx": 0, "title": "A", "paragraph_text": "A  is\nfirst."}]}) == [
        ("A", "A is first.")]
    assert row_passages({"context": {"title": ["B", "C"], "sentences": [["B is", " second."], ["C."]]}}) == [
        ("B", "B is second."), ("C", "C.")]
    assert row_passages({"context": [["D", ["D is third."]]]}) == [("D", "D is third.")]
    assert row_passages({"question": "no passages"}) == [] and row_passages("not a row") == []


@pytest.mark.parametrize(("name", "file", "env_id", "count", "covered"), [
    ("hotpotqa", "dev_500_ircot_with_contexts.jsonl", "AgentQA-HotpotQA-v0", 4858, 137),
    ("musique", "dev_100_kag_with_paragraphs.jsonl", "AgentQA-MuSiQue-v0", 1839, 9),
])
def test_real_files_give_the_distractor_corpus(shared_data: Path, data: Path, capfd: pytest.CaptureFixture,
                                               name: str, file: str, env_id: str, count: int, covered: int) -> None:
    """The counts docs/benchmarks-data.md states: passages, and default-split questions among them."""
    (data / name).symlink_to(shared_data / name)  # the benchmark's folder alone: no corpus/ beside it
    passages, used = collect_passages([shared_data / name / file])
    assert len(passages) == count and used == [str(shared_data / name / file)]
    with_passages = {json.loads(line)["question"] for line in (shared_data / name / file).open()}
    default = [json.loads(line)["question"] for line in (shared_data / name / "arpo_eval_200.jsonl").open()]
    assert sum(q in with_passages for q in default) == covered
    env = gym.make(env_id)
    assert f"{count} passages" in capfd.readouterr().err
    # the gold paragraphs of the questions that carry them are in the corpus: searching a
    # supporting paragraph's own title finds it
    rows = [json.loads(line) for line in (shared_data / name / file).read_text().splitlines()[:20]]
    found = 0
    for row in rows:
        gold = next(p for p in row.get("contexts") or row["paragraphs"] if p["is_supporting"])
        env.reset(options={"index": 0})
        obs = env.step(f"<think>x</think><search>{gold['title']}</search>")[0]
        found += f"(Title: {gold['title']})" in obs
    assert found >= 18, found
