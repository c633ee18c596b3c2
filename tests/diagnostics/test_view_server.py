"""The viewer's JSON endpoints on run folders written with the real `Trajectory` writer and the
tiny model's real tokenizer: runs, filters, branch trees, per-token entropies, text pieces
without a tokenizer, evaluation folders, runs still being written, errors, and the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from algorithms.rollout.trajectory import Trajectory, write_jsonl
from baselines.diagnostics.view.server import make_app

REPO = Path(__file__).resolve().parents[2]
THINK = "<think> I add: 2 + 3 ≈ 5 😀 </think> "  # characters of several bytes, split over tokens
CALL = "<python> print(2 + 3) </python>"
RESULT = " <result>\n5\n</result> "
ANSWERS = ["<answer> \\boxed{5} </answer>", "<answer> \\boxed{7} </answer>"]


@pytest.fixture(scope="module")
def tokenizer_file() -> Path:
    from algorithms.models.tiny import build_tiny_model

    return build_tiny_model(seed=0) / "tokenizer.json"


@pytest.fixture(scope="module")
def tok(tokenizer_file):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_file))


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def group(tok, group_id: int, question: str, tool: bool = True) -> list[Trajectory]:
    """A root that calls the tool and answers 5 (correct) and a fork of it, after the tool
    result, that answers 7 (wrong); without `tool`, one root that answers at once."""
    prompt = encode(tok, f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
    head = [(encode(tok, THINK + CALL), 1), (encode(tok, RESULT), 0)] if tool else []
    out = []
    for k, answer in enumerate(ANSWERS if tool else ANSWERS[:1]):
        parts = [*head, (encode(tok, answer), 1)]
        ids = [t for p, _ in parts for t in p]
        mask = [m for p, m in parts for _ in p]
        offset = sum(len(p) for p, _ in head)
        out.append(
            Trajectory(
                prompt_ids=prompt,
                response_ids=ids,
                loss_mask=mask,
                logprobs=[-0.5 * m for m in mask],
                entropy=[0.1 * (i % 7) * m for i, m in enumerate(mask)],
                reward=1.0 - k,
                components={"correct": 1.0 - k, "format_ok": True, "parsed_action": "x" * 200},
                group_id=group_id,
                task_id=f"t{group_id}",
                tool_calls=int(tool),
                traj_id=k,
                parent_id=0 if k else None,
                branch_offset=offset if k else None,
                response_text="".join(tok.decode(p, skip_special_tokens=False) for p, _ in parts),
                lineage={"depth": k, "kind": "fork" if k else "initial"},
                advantage=0.7 - 1.4 * k,
            )
        )
    return out


def learner_run(folder: Path, tok, algo: str, tokenizer_file: Path | None, steps: int = 2) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"algo": algo, "model": "not-a-local-folder"}))
    (folder / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward_mean": 0.5}) + "\n" for s in range(1, steps + 1))
    )
    for s in range(1, steps + 1):
        trajs = group(tok, 0, f"What is 2 + 3? (step {s})") + group(tok, 1, "Say 5.", tool=False)
        write_jsonl(trajs, folder / "trajectories" / f"step_{s:06d}.jsonl")
    if tokenizer_file is not None:
        (folder / "final_model").mkdir()
        shutil.copy(tokenizer_file, folder / "final_model" / "tokenizer.json")
    return folder


async def get(client: TestClient, url: str, status: int = 200) -> dict:
    response = await client.get(url)
    assert response.status == status, await response.text()
    return await response.json()


@pytest.fixture
async def runs_client(tmp_path, tok, tokenizer_file):
    learner_run(tmp_path / "arpo" / "seed0", tok, "arpo", tokenizer_file)
    learner_run(tmp_path / "grpo", tok, "grpo", None, steps=1)
    async with TestClient(TestServer(make_app(tmp_path))) as client:
        yield client


async def test_runs_under_a_folder_with_their_algorithm_and_steps(runs_client):
    runs = {r["name"]: r for r in (await get(runs_client, "/api/runs"))["runs"]}
    assert set(runs) == {"arpo/seed0", "grpo"}
    assert (runs["arpo/seed0"]["algo"], runs["arpo/seed0"]["steps"]) == ("arpo", [1, 2])
    assert (runs["grpo"]["algo"], runs["grpo"]["steps"], runs["grpo"]["errors"]) == ("grpo", [1], [])


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            "",
            {
                ("arpo/seed0", 1, 0),
                ("arpo/seed0", 1, 1),
                ("arpo/seed0", 2, 0),
                ("arpo/seed0", 2, 1),
                ("grpo", 1, 0),
                ("grpo", 1, 1),
            },
        ),
        ("algo=grpo", {("grpo", 1, 0), ("grpo", 1, 1)}),
        ("run=arpo/seed0&step=2", {("arpo/seed0", 2, 0), ("arpo/seed0", 2, 1)}),
        # group 1 answers correctly without a tool; group 0 has a right and a wrong answer
        ("algo=arpo&outcome=incorrect", {("arpo/seed0", 1, 0), ("arpo/seed0", 2, 0)}),
        ("algo=arpo&outcome=correct&tool=unused", {("arpo/seed0", 1, 1), ("arpo/seed0", 2, 1)}),
        ("algo=grpo&tool=used", {("grpo", 1, 0)}),
    ],
)
async def test_prompt_filters(runs_client, query, expected):
    rows = (await get(runs_client, "/api/prompts?" + query))["prompts"]
    assert {(r["run"], r["step"], r["group"]) for r in rows} == expected


async def test_prompt_row_summarises_the_group(runs_client):
    rows = (await get(runs_client, "/api/prompts?run=arpo/seed0&step=1"))["prompts"]
    first = next(r for r in rows if r["group"] == 0)
    assert first["task"] == "What is 2 + 3? (step 1)"  # decoded with the run's tokenizer
    assert (first["trajectories"], first["forks"], first["correct"], first["tool_calls"]) == (2, 1, 1, 2)
    assert first["reward_mean"] == pytest.approx(0.5)
    # without a tokenizer the task is named by its id
    rows = (await get(runs_client, "/api/prompts?run=grpo"))["prompts"]
    assert [r["task"] for r in rows] == ["t0", "t1"]


async def test_prompt_tree_tokens_and_pieces(runs_client, tok):
    view = await get(runs_client, "/api/prompt?run=arpo/seed0&step=1&group=0")
    assert view["tokenizer"] and view["task"] == "What is 2 + 3? (step 1)"
    root, fork = view["trajectories"]
    offset = len(encode(tok, THINK + CALL + RESULT))
    assert (root["parent"], fork["parent"], fork["branch_offset"]) == (None, 0, offset)
    assert (root["advantage"], fork["advantage"]) == (pytest.approx(0.7), pytest.approx(-0.7))
    assert (root["reward"], root["correct"], fork["correct"]) == (1.0, True, False)
    assert "parsed_action" not in root["components"] and root["components"]["format_ok"] is True

    # thinking | the tool call, split off to fold with its result | the result | the answer
    assert [(p["kind"], p["shared"]) for p in root["pieces"]] == [
        ("gen", False),
        ("call", False),
        ("env", False),
        ("gen", False),
    ]
    assert [p["text"] for p in root["pieces"][:3]] == [
        tok.decode(encode(tok, text), skip_special_tokens=False) for text in (THINK, CALL, RESULT)
    ]
    assert "tokens" not in root["pieces"][2]  # inserted text has no entropy
    # the fork's prefix is marked shared; its own part is the wrong answer
    assert [p["shared"] for p in fork["pieces"]] == [True, True, True, False]
    assert "boxed{7}" in fork["pieces"][3]["text"]
    # every generated token carries its entropy, and the tokens spell the decoded text
    row = group(tok, 0, "x")[0]
    tokens = [t for p in root["pieces"] if p["kind"] != "env" for t in p["tokens"]]
    assert [h for _, h in tokens] == [h for h, m in zip(row.entropy, row.loss_mask, strict=True) if m]
    whole = tok.decode(row.response_ids, skip_special_tokens=False)
    assert "".join(p["text"] for p in root["pieces"]) == whole and "😀" in whole
    assert "😀" in [text for text, _ in tokens] and not any("\ufffd" in text for text, _ in tokens)


async def test_without_a_tokenizer_segments_of_the_text_carry_mean_entropies(runs_client, tok):
    view = await get(runs_client, "/api/prompt?run=grpo&step=1&group=0")
    assert not view["tokenizer"]
    pieces = view["trajectories"][0]["pieces"]
    assert [p["kind"] for p in pieces] == ["gen", "call", "env", "gen"]
    assert pieces[1]["text"] == CALL and "<result>" in pieces[2]["text"] and "boxed{5}" in pieces[3]["text"]
    row = group(tok, 0, "x")[0]
    n_first = len(encode(tok, THINK + CALL))  # one generated segment: thinking and call share its mean
    assert pieces[0]["entropy"] == pieces[1]["entropy"] == pytest.approx(sum(row.entropy[:n_first]) / n_first)
    assert all("tokens" not in p for p in pieces)


async def test_health_warnings_pass_through(tmp_path, tok):
    run = learner_run(tmp_path / "run", tok, "aepo", None, steps=1)
    path = run / "trajectories" / "step_000001.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["health"] = ["response truncated at the token budget", "entropy collapsed"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    async with TestClient(TestServer(make_app(run))) as client:
        view = await get(client, "/api/prompt?run=run&step=1&group=0")
        assert [t["health"] for t in view["trajectories"]] == [[], rows[1]["health"]]
        assert [r["health"] for r in (await get(client, "/api/prompts"))["prompts"]] == [2, 0]


async def test_a_run_still_training_shows_new_steps_and_skips_a_half_written_line(tmp_path, tok):
    run = learner_run(tmp_path / "live", tok, "arpo", None, steps=1)
    async with TestClient(TestServer(make_app(run))) as client:
        assert (await get(client, "/api/runs"))["runs"][0]["steps"] == [1]
        line = json.dumps(group(tok, 0, "later")[0].to_dict())
        step2 = run / "trajectories" / "step_000002.jsonl"
        step2.write_text(line + "\n" + line[:40])  # the writer is mid-line
        runs = (await get(client, "/api/runs"))["runs"]
        assert runs[0]["steps"] == [1, 2] and runs[0]["errors"] == []
        assert (await get(client, "/api/prompts?step=2"))["prompts"][0]["trajectories"] == 1
        step2.write_text(line + "\n" + line + "\n")
        assert (await get(client, "/api/prompts?step=2"))["prompts"][0]["trajectories"] == 2


async def test_errors_name_the_file_line_and_what_exists(tmp_path, tok):
    run = learner_run(tmp_path / "bad", tok, "arpo", None, steps=1)
    path = run / "trajectories" / "step_000001.jsonl"
    path.write_text("{not json\n" + path.read_text())
    async with TestClient(TestServer(make_app(run))) as client:
        errors = (await get(client, "/api/runs"))["runs"][0]["errors"]
        assert len(errors) == 1 and f"{path}:1: not valid JSON" in errors[0]
        assert "no run 'nope'" in (await get(client, "/api/prompt?run=nope&step=1&group=0", 404))["error"]
        assert (
            "no prompt at step 9" in (await get(client, "/api/prompt?run=bad&step=9&group=0", 404))["error"]
        )
        assert "integers" in (await get(client, "/api/prompt?run=bad&step=x&group=0", 400))["error"]
    empty = tmp_path / "empty_run"
    (empty / "trajectories").mkdir(parents=True)
    async with TestClient(TestServer(make_app(empty))) as client:
        assert "save_trajectories=true" in (await get(client, "/api/runs"))["runs"][0]["errors"][0]
    with pytest.raises(FileNotFoundError, match="not a folder"):
        make_app(tmp_path / "missing")
    (tmp_path / "no_runs" / "notes").mkdir(parents=True)
    async with TestClient(TestServer(make_app(tmp_path / "no_runs"))) as client:
        assert "no learner run (metrics.jsonl)" in (await get(client, "/api/runs", 500))["error"]


async def test_an_evaluation_folder_is_one_step_of_flat_groups(tmp_path):
    out = tmp_path / "eval"
    out.mkdir()
    samples = [
        {
            "task_id": "a",
            "sample": 0,
            "reward": 1.0,
            "correct": 1.0,
            "tool_calls": 1,
            "response": "<answer> 1 </answer>",
        },
        {
            "task_id": "a",
            "sample": 1,
            "reward": 0.0,
            "correct": 0.0,
            "tool_calls": 0,
            "response": "<answer> 2 </answer>",
        },
        {
            "task_id": "b",
            "sample": 0,
            "reward": 0.0,
            "correct": 0.0,
            "tool_calls": 0,
            "response": "no answer",
        },
    ]
    (out / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (out / "summary.json").write_text(json.dumps({"metrics": {"pass@1": 0.25}, "config": {"model": "m"}}))
    async with TestClient(TestServer(make_app(out))) as client:
        assert [(r["algo"], r["steps"]) for r in (await get(client, "/api/runs"))["runs"]] == [
            ("evaluate", [0])
        ]
        rows = (await get(client, "/api/prompts?outcome=correct"))["prompts"]
        assert [(r["task_id"], r["trajectories"], r["correct"]) for r in rows] == [("a", 2, 1)]
        view = await get(client, "/api/prompt?run=eval&step=0&group=1")
        assert view["trajectories"][0]["pieces"] == [
            {"kind": "gen", "shared": False, "text": "no answer", "entropy": None}
        ]


async def test_an_evaluation_with_token_rows_shows_their_entropies(tmp_path, tok, tokenizer_file):
    out = tmp_path / "eval"
    out.mkdir()
    trajs = group(tok, 0, "What is 2 + 3?", tool=False) + group(tok, 1, "Say 5.", tool=False)
    write_jsonl(trajs, out / "trajectories.jsonl")
    # the samples of the same episodes: shown only by outputs written before trajectories.jsonl
    samples = [{"task_id": t.task_id, "reward": t.reward, "response": "not shown"} for t in trajs]
    (out / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    summary = {"metrics": {"reward_mean": 1.0}, "config": {"model": str(tokenizer_file.parent)}}
    (out / "summary.json").write_text(json.dumps(summary))
    async with TestClient(TestServer(make_app(out))) as client:
        [run] = (await get(client, "/api/runs"))["runs"]
        assert (run["kind"], run["steps"], run["reward_mean"]) == ("evaluate", [0], 1.0)
        view = await get(client, "/api/prompt?run=eval&step=0&group=0")
        assert view["tokenizer"] and view["task"] == "What is 2 + 3?"
        [shown] = view["trajectories"]
        tokens = [t for p in shown["pieces"] for t in p["tokens"]]
        assert [h for _, h in tokens] == trajs[0].entropy and "not shown" not in str(shown)


async def test_the_page_and_its_assets_are_served(runs_client):
    for url, marker in [
        ("/", "viewer.js"),
        ("/static/viewer.js", "/api/prompt"),
        ("/static/viewer.css", "details"),
    ]:
        response = await runs_client.get(url)
        assert response.status == 200 and marker in await response.text()


def test_cli_serves_on_a_free_port(tmp_path, tok):
    import urllib.request

    run = learner_run(tmp_path / "cli_run", tok, "arpo", None, steps=1)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_envs.cli", "view", str(run), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("agent-envs view: http://127.0.0.1:"), line
        url = line.split()[2]
        with urllib.request.urlopen(url + "api/runs", timeout=30) as response:
            assert json.load(response)["runs"][0]["steps"] == [1]
        # a second viewer on the same port, and one on a missing folder, say what to do
        port = url.rstrip("/").rsplit(":", 1)[1]
        for args, message in [
            ((str(run), "--port", port), "pick another with --port"),
            (("nowhere",), "is not a folder"),
        ]:
            other = subprocess.run(
                [sys.executable, "-m", "agent_envs.cli", "view", *args],
                capture_output=True,
                text=True,
                env=env,
                cwd=tmp_path,
                timeout=120,
            )
            assert other.returncode == 2 and message in other.stderr, other.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_learner_records_sequence_and_per_token_advantages():
    """What the tree shows as a branch's advantage: the sequence value, or with per-token
    advantages (ARPO hard attribution) their mean over the tokens the trajectory trains."""
    import torch

    from algorithms.core.metrics import record_advantages as _record_advantages

    def traj() -> Trajectory:
        return Trajectory(
            prompt_ids=[1], response_ids=[2, 3, 4], loss_mask=[1, 0, 1], logprobs=[-1.0, 0.0, -1.0]
        )

    trajs = [traj(), traj()]
    _record_advantages(trajs, torch.tensor([0.5, -0.5]), torch.ones(2, 3))
    assert [t.advantage for t in trajs] == [0.5, -0.5]
    per_token = torch.tensor([[1.0, 9.0, 3.0], [4.0, 4.0, 4.0]])
    _record_advantages(trajs, per_token, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    assert [t.advantage for t in trajs] == [2.0, None]  # the second trains no token
    assert json.loads(json.dumps(trajs[0].to_dict()))["advantage"] == 2.0
