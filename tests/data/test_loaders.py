"""Loaders on small files written in tmp_path: every format, the normalisation rules, and the
errors (file, line, field) a user sees for bad rows or missing data."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_envs.data import DataError, load_benchmark, load_tasks
from agent_envs.data.registry import BENCHMARKS

REPO = Path(__file__).resolve().parents[2]

ROWS = [
    {"id": "a", "question": "Capital of France?", "golden_answers": ["Paris"]},
    {"id": "b", "question": "2+2?", "answer": 4},
]


def write_jsonl(path: Path, rows: list, gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def test_all_formats_give_the_same_tasks(tmp_path: Path) -> None:
    files = [
        write_jsonl(tmp_path / "x.jsonl", ROWS),
        write_jsonl(tmp_path / "x.jsonl.gz", ROWS, gz=True),
        tmp_path / "x.json",
        tmp_path / "wrapped.json",
        tmp_path / "x.parquet",
    ]
    files[2].write_text(json.dumps(ROWS))
    files[3].write_text(json.dumps({"data": ROWS}))
    pq.write_table(pa.Table.from_pylist([{**r, "answer": str(r.get("answer", ""))} for r in ROWS]), files[4])
    for f in files:
        tasks = load_tasks(f, reward="qa")
        assert [(t.id, t.question, t.answers) for t in tasks] == [
            ("a", "Capital of France?", ["Paris"]),
            ("b", "2+2?", ["4"]),
        ], f
        assert (
            tasks[0].metadata["source"].endswith("line 1")
            or "record 1" in tasks[0].metadata["source"]
            or ("row 1" in tasks[0].metadata["source"])
        )


def test_source_field_conventions_are_normalised(tmp_path: Path) -> None:
    rows = [
        {"question": "Janet has 3 ducks...", "answer": "She has 3+2=5.\n#### 5"},  # GSM8K
        {"problem": "Half of one?", "solution": "It is $\\boxed{\\frac{1}{2}}$."},  # MATH without answer
        {"Question": "GAIA q", "Final answer": "17", "task_id": "t-1"},  # GAIA
        {"question": "MuSiQue q", "answer": "Ondine", "answer_aliases": ["the play Ondine"]},
        {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "verl q"}],
         "reward_model": {"ground_truth": ["x", "y"]}, "ability": "math", "extra_info": {"index": 7}},
        {"question": "yes/no q", "answer": True},
    ]  # fmt: skip
    tasks = load_tasks(write_jsonl(tmp_path / "mixed.jsonl", rows), reward="qa", per_row_reward=True)
    assert [t.answers for t in tasks] == [
        ["5"],
        ["\\frac{1}{2}"],
        ["17"],
        ["Ondine", "the play Ondine"],
        ["x", "y"],
        ["yes"],
    ]
    assert [t.id for t in tasks] == [
        "mixed-00000",
        "mixed-00001",
        "t-1",
        "mixed-00003",
        "mixed-7",
        "mixed-00005",
    ]
    assert tasks[4].question == "verl q" and tasks[4].reward == "math" and tasks[0].reward == "qa"
    assert tasks[2].metadata["Question"] == "GAIA q"  # original fields are kept


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"id": "a", "question": "q", "answer": "x"}\n{"id": "b", "question": \n', r"bad\.jsonl, line 2: not valid JSON"),
        ('{"id": "a", "answer": "x"}\n', r"line 1: no question field"),
        ('{"id": "a", "question": "q"}\n', r"line 1: no answer field"),
        ('{"id": "a", "question": "q", "answer": null}\n', r"line 1: no answer field .*'answer' is null"),
        ('{"id": "a", "question": "", "answer": "x"}\n', r"line 1: field 'question' is empty"),
        ('{"id": "a", "question": "q", "answer": [["x"]]}\n', r"line 1: field answer\[0\] must be a string"),
        ('["q", "a"]\n', r"line 1: a record must be a JSON object"),
        ('{"id": "a", "question": "q", "answer": "x"}\n\n{"id": "a", "question": "r", "answer": "y"}\n',
         r"line 3: field 'id' = 'a' repeats the id of line 1"),
    ],
)  # fmt: skip
def test_bad_rows_name_file_line_and_field(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        load_tasks(path)


def test_bad_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "x.csv").write_text("q,a\n")
    with pytest.raises(DataError, match="unsupported file type"):
        load_tasks(tmp_path / "x.csv")
    (tmp_path / "obj.json").write_text('{"version": 1, "meta": "x"}')
    with pytest.raises(DataError, match="'data'/'rows'/'examples'"):
        load_tasks(tmp_path / "obj.json")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no records"):
        load_tasks(tmp_path / "empty.jsonl")


def test_blank_golden_answers_are_dropped_and_flagged(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "question": "q", "golden_answers": [" ", "x"]},
        {"id": "b", "question": "q", "answer": " "},
    ]
    a, b = load_tasks(write_jsonl(tmp_path / "blank.jsonl", rows))
    assert a.answers == ["x"] and b.answers == [] and b.metadata["no_golden_answer"]


def test_load_benchmark_data_files_and_missing_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = write_jsonl(tmp_path / "mine.jsonl", [{"id": "m", "question": "1/2?", "answer": "0.5"}])
    (task,) = load_benchmark("math500", data_files=str(own))
    assert task.reward == "math" and task.metadata["benchmark"] == "math500"
    monkeypatch.setenv("AGENT_ENVS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("AGENT_ENVS_NO_HF", "1")
    with pytest.raises(FileNotFoundError) as e:
        load_benchmark("aime24")
    msg = str(e.value)
    assert (
        "data_files='path/to/test.jsonl'" in msg
        and "aime24/test.jsonl" in msg
        and "AGENT_ENVS_DATA_DIR" in msg
    )
    with pytest.raises(FileNotFoundError, match="encrypted"):
        load_benchmark("xbench")  # no HF copy: the message says where the full data is
    with pytest.raises(KeyError, match="unknown benchmark 'mmlu'.*load_tasks"):
        load_benchmark("mmlu")


def test_an_unreachable_hub_fails_in_about_a_second(tmp_path: Path) -> None:
    # a fresh process, as a user runs it: the hub client reads its offline switch at import
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: the "hub" refuses connections
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "AGENT_ENVS_NO_HF", "AGENT_ENVS_DATA_DIR")}
    env |= {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": str(tmp_path / "hf_home")}
    # the imports' time grows with the machine's load; the make's own time is what the hub
    # client's retries (sleeps, ~24 s) used to fill, so it is measured apart
    code = (
        "import sys, time, gymnasium as gym, agent_envs\n"
        "start = time.monotonic()\n"
        "try:\n    gym.make('AgentMath-AIME24-v0')\n"
        "finally:\n    print(f'make: {time.monotonic() - start:.3f}', file=sys.stderr)\n"
    )
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    make_s = float(proc.stderr.split("make: ")[-1].split()[0])
    print(f"unreachable hub: error after {elapsed:.2f} s, {make_s:.2f} s of it in gym.make (the rest: start, imports)")
    assert proc.returncode != 0 and "FileNotFoundError: benchmark 'aime24'" in proc.stderr, proc.stderr
    assert f"the hub at http://127.0.0.1:{port} is unreachable (Connection refused) and no copy is cached" in proc.stderr
    assert "data_files=" in proc.stderr and "AGENT_ENVS_DATA_DIR" in proc.stderr and "HuggingFaceH4/aime_2024" in proc.stderr
    assert "Retrying" not in proc.stderr and make_s < 3  # the hub client's own retries took ~24 s


def test_where_to_get_the_data_names_only_what_a_user_has() -> None:
    for spec in BENCHMARKS.values():
        assert "shared" not in spec.full_data.lower(), (spec.name, spec.full_data)


def test_hugging_face_path_with_a_local_dataset_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`datasets.load_dataset` on a local folder: the real HF code path, without a network."""
    from agent_envs.data import loaders, registry

    repo = tmp_path / "hf_gaia"
    repo.mkdir()
    rows = [
        {"task_id": "t1", "Question": "text only?", "Final answer": "yes", "file_name": ""},
        {"task_id": "t2", "Question": "see the attached image", "Final answer": "7", "file_name": "x.png"},
    ]
    write_jsonl(repo / "validation.jsonl", rows)
    spec = registry.BenchmarkSpec(
        name="gaia", family="search", reward="judge", env_id="AgentSearch-GAIA-v0",
        default_file="gaia/dev_text_103.jsonl.gz", default_split="dev_text_103", description="d", metric="m",
        hf_id=str(repo), hf_split="validation", text_only=True,
    )  # fmt: skip
    monkeypatch.setitem(registry.BENCHMARKS, "gaia", spec)
    monkeypatch.setenv("AGENT_ENVS_DATA_DIR", str(tmp_path / "nothing_here"))
    monkeypatch.delenv("AGENT_ENVS_NO_HF", raising=False)
    tasks = loaders.load_benchmark("gaia")
    assert [(t.id, t.answers, t.reward) for t in tasks] == [("t1", ["yes"], "judge")]  # image task dropped


def test_an_offline_cache_check_that_never_misses_a_cached_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_envs.data.loaders import _hf_copy_may_be_cached

    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert not _hf_copy_may_be_cached("HuggingFaceH4/aime_2024")  # nothing there: no `datasets` import
    (tmp_path / "hub" / "datasets--HuggingFaceH4--aime_2024").mkdir(parents=True)
    assert _hf_copy_may_be_cached("HuggingFaceH4/aime_2024")
    assert not _hf_copy_may_be_cached("openai/gsm8k")
    (tmp_path / "datasets" / "openai___gsm8k").mkdir(parents=True)  # built by an older `datasets`
    assert _hf_copy_may_be_cached("openai/gsm8k")
    assert _hf_copy_may_be_cached(str(tmp_path))  # a local dataset folder
