"""`agent-envs export`: runs written with the real `Trajectory` writer (by hand, and by a 1-step
tiny-model training run) exported as ATIF v1.7 and checked against the format's rules.

Harbor publishes ATIF as an RFC (harbor-framework/harbor, rfcs/0001-trajectory-format.md, v1.7)
with pydantic models, not as a JSON Schema file: `ATIF_SCHEMA` below writes the RFC's field
tables (required fields, types, the step sources, `extra="forbid"`-style closed objects) as a JSON
Schema for `jsonschema`, and `check_atif` adds the RFC's rules across fields (step ids 1, 2, ...;
agent-only fields on agent steps; an observation's `source_call_id` names a tool call of its
step; token ids and log-probs of a step align)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent_envs.cli import main
from algorithms.rollout.trajectory import Trajectory, write_jsonl
from baselines.diagnostics.export import ATIF_VERSION, export

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema checks ATIF documents (pip install jsonschema)")

_INT = {"type": "integer", "minimum": 0}
_IDS = {"type": "array", "items": {"type": "integer"}}


def _closed(properties: dict, required: list[str] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_METRICS = _closed({"prompt_tokens": _INT, "completion_tokens": _INT, "cached_tokens": _INT, "cost_usd": {"type": "number"},
                    "prompt_token_ids": _IDS, "completion_token_ids": _IDS,
                    "logprobs": {"type": "array", "items": {"type": "number"}}, "extra": {"type": "object"}})
_TOOL_CALL = _closed({"tool_call_id": {"type": "string"}, "function_name": {"type": "string"},
                      "arguments": {"type": "object"}, "extra": {"type": "object"}},
                     ["tool_call_id", "function_name", "arguments"])
_RESULT = _closed({"source_call_id": {"type": ["string", "null"]}, "content": {"type": ["string", "array", "null"]},
                   "subagent_trajectory_ref": {"type": "array"}, "extra": {"type": "object"}})
_STEP = _closed({
    "step_id": {"type": "integer", "minimum": 1}, "timestamp": {"type": "string"},
    "source": {"enum": ["system", "user", "agent"]}, "model_name": {"type": "string"},
    "reasoning_effort": {"type": ["string", "number"]}, "message": {"type": ["string", "array"]},
    "reasoning_content": {"type": "string"}, "tool_calls": {"type": "array", "items": _TOOL_CALL},
    "observation": _closed({"results": {"type": "array", "items": _RESULT}}, ["results"]),
    "metrics": _METRICS, "llm_call_count": _INT, "is_copied_context": {"type": "boolean"},
    "extra": {"type": "object"},
}, ["step_id", "source", "message"])
ATIF_SCHEMA = _closed({
    "schema_version": {"type": "string", "pattern": r"^ATIF-v1\.\d+$"},
    "session_id": {"type": "string"}, "trajectory_id": {"type": "string"},
    "agent": _closed({"name": {"type": "string"}, "version": {"type": "string"}, "model_name": {"type": "string"},
                      "tool_definitions": {"type": "array"}, "extra": {"type": "object"}}, ["name", "version"]),
    "steps": {"type": "array", "items": _STEP, "minItems": 1},
    "notes": {"type": "string"},
    "final_metrics": _closed({"total_prompt_tokens": _INT, "total_completion_tokens": _INT, "total_cached_tokens": _INT,
                              "total_cost_usd": {"type": "number"}, "total_steps": _INT, "extra": {"type": "object"}}),
    "continued_trajectory_ref": {"type": "string"}, "subagent_trajectories": {"type": "array"},
    "extra": {"type": "object"},
}, ["schema_version", "agent", "steps"])
_AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")


def check_atif(doc: dict) -> None:
    """Raise (jsonschema.ValidationError or AssertionError) where `doc` breaks an ATIF v1.7 rule."""
    jsonschema.validate(doc, ATIF_SCHEMA)
    assert doc["schema_version"] == ATIF_VERSION == "ATIF-v1.7"
    assert [s["step_id"] for s in doc["steps"]] == list(range(1, len(doc["steps"]) + 1))
    for step in doc["steps"]:
        if step["source"] != "agent":
            assert not set(_AGENT_ONLY) & set(step), step
        calls = {c["tool_call_id"] for c in step.get("tool_calls", [])}
        for result in step.get("observation", {}).get("results", []):
            assert result.get("source_call_id") in calls | {None}, (result, calls)
        metrics = step.get("metrics", {})
        if "completion_token_ids" in metrics:
            assert len(metrics["completion_token_ids"]) == len(metrics["logprobs"]) == metrics["completion_tokens"]
            assert len(metrics["prompt_token_ids"]) == metrics["prompt_tokens"]
    assert doc["final_metrics"]["total_steps"] == len(doc["steps"])


def test_the_checker_refuses_what_atif_forbids():
    good = {"schema_version": "ATIF-v1.7", "agent": {"name": "a", "version": "1"},
            "steps": [{"step_id": 1, "source": "user", "message": "hi"}], "final_metrics": {"total_steps": 1}}
    check_atif(good)
    bad = [
        {**good, "agent": {"name": "a"}},  # version is required
        {**good, "steps": [{"step_id": 1, "source": "tool", "message": "x"}]},  # not a source
        {**good, "steps": [{"step_id": 2, "source": "user", "message": "x"}]},  # ids start at 1
        {**good, "steps": [{"step_id": 1, "source": "user", "message": "x", "metrics": {}}]},  # agent-only
        {**good, "steps": [{"step_id": 1, "source": "agent", "message": "x", "messsage": "typo"}]},
        {**good, "steps": [{"step_id": 1, "source": "agent", "message": "x", "tool_calls": [
            {"tool_call_id": "c", "function_name": "f", "arguments": {}}],
            "observation": {"results": [{"source_call_id": "d", "content": "?"}]}}]},
    ]
    for doc in bad:
        with pytest.raises((jsonschema.ValidationError, AssertionError)):
            check_atif(doc)


# ---- a hand-built run: a root that calls the python tool, and a fork after the tool result ----------

THINK = "<think> I add: 2 + 3 ≈ 5 😀 </think> "  # characters of several bytes, split over tokens
CALL = "<python> print(2 + 3) </python>"
RESULT = " <result>\n5\n</result> "
ANSWERS = ["<answer> \\boxed{5} </answer>", "<answer> \\boxed{7} </answer>"]
SYSTEM = "You solve math problems."


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    from algorithms.models.tiny import build_tiny_model

    return build_tiny_model(seed=0)


@pytest.fixture(scope="module")
def tok(tiny_model):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_model / "tokenizer.json"))


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def hand_run(folder: Path, tok, tokenizer_file: Path | None) -> tuple[Path, list[Trajectory]]:
    prompt = encode(tok, f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
                         "<|im_start|>assistant\n")
    head = [(encode(tok, THINK + CALL), 1), (encode(tok, RESULT), 0)]
    trajs = []
    for k, answer in enumerate(ANSWERS):
        parts = [*head, (encode(tok, answer), 1)]
        ids = [t for p, _ in parts for t in p]
        mask = [m for p, m in parts for _ in p]
        trajs.append(Trajectory(
            prompt_ids=prompt, response_ids=ids, loss_mask=mask,
            logprobs=[-0.01 * (i + 1) * m for i, m in enumerate(mask)], reward=1.0 - k,
            components={"correct": 1.0 - k}, group_id=0, task_id="sum-0", tool_calls=1, terminated=True,
            end_reason="answer", segment_starts=[0, len(head[0][0]) + len(head[1][0])], traj_id=k,
            parent_id=0 if k else None, branch_offset=len(head[0][0]) + len(head[1][0]) if k else None,
            response_text="".join(tok.decode(p, skip_special_tokens=False) for p, _ in parts),
            advantage=0.5 - k))
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"algo": "arpo", "model": "not-a-local-folder"}))
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    write_jsonl(trajs, folder / "trajectories" / "step_000001.jsonl")
    if tokenizer_file is not None:
        (folder / "final_model").mkdir()
        shutil.copy(tokenizer_file, folder / "final_model" / "tokenizer.json")
    return folder, trajs


def test_a_hand_built_run_with_a_fork_exports_as_valid_atif(tmp_path, tok, tiny_model):
    run, trajs = hand_run(tmp_path / "arpo-0", tok, tiny_model / "tokenizer.json")
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 0
    files = sorted((tmp_path / "out" / "arpo-0" / "step_000001").glob("*.json"))
    assert [f.name for f in files] == ["group0000-traj0000.json", "group0000-traj0001.json"]
    root, fork = (json.loads(f.read_text()) for f in files)
    for doc in (root, fork):
        check_atif(doc)
    system, user, call, answer = root["steps"]
    assert (system["source"], system["message"]) == ("system", SYSTEM)
    assert (user["source"], user["message"]) == ("user", "What is 2 + 3?")
    assert call["message"] == THINK + CALL and answer["message"] == ANSWERS[0]
    assert call["tool_calls"] == [{"tool_call_id": "call_1", "function_name": "python",
                                   "arguments": {"input": "print(2 + 3)"}}]
    assert call["observation"] == {"results": [{"source_call_id": "call_1", "content": RESULT}]}
    n_call = len(encode(tok, THINK + CALL))
    start = n_call + len(encode(tok, RESULT))
    t = trajs[0]
    assert call["metrics"]["completion_token_ids"] == t.response_ids[:n_call]
    assert call["metrics"]["logprobs"] == pytest.approx(t.logprobs[:n_call])
    assert answer["metrics"]["completion_token_ids"] == t.response_ids[start:]
    assert answer["metrics"]["logprobs"] == pytest.approx(t.logprobs[start:])
    assert answer["metrics"]["prompt_token_ids"] == t.prompt_ids + t.response_ids[:start]
    assert root["final_metrics"]["total_completion_tokens"] == sum(t.loss_mask)
    assert root["final_metrics"]["extra"]["reward"] == 1.0 and root["final_metrics"]["extra"]["advantage"] == 0.5
    assert root["extra"]["task_id"] == "sum-0" and "parent_trajectory_id" not in root["extra"]
    # the fork: the steps it shares with its parent are marked copied; it names its parent
    assert fork["session_id"] == root["session_id"] and fork["trajectory_id"] != root["trajectory_id"]
    assert fork["extra"]["parent_trajectory_id"] == root["trajectory_id"]
    assert fork["extra"]["branch_offset"] == start
    assert [s.get("is_copied_context", False) for s in fork["steps"]] == [False, False, True, False]
    assert fork["steps"][-1]["message"] == ANSWERS[1] and fork["final_metrics"]["extra"]["reward"] == 0.0


def test_jsonl_holds_the_same_documents_one_per_line(tmp_path, tok, tiny_model):
    run, _ = hand_run(tmp_path / "arpo-0", tok, tiny_model / "tokenizer.json")
    [jsonl] = export(run, tmp_path / "lines", "jsonl")
    assert jsonl == tmp_path / "lines" / "arpo-0" / "trajectories.atif.jsonl"
    docs = [json.loads(line) for line in jsonl.read_text().splitlines()]
    files = export(run, tmp_path / "files", "atif")
    assert docs == [json.loads(f.read_text()) for f in sorted(files)]


def test_without_a_tokenizer_tool_results_are_still_cut_out(tmp_path, tok):
    run, trajs = hand_run(tmp_path / "bare", tok, None)
    [root, fork] = (json.loads(f.read_text()) for f in sorted(export(run, tmp_path / "out")))
    for doc in (root, fork):
        check_atif(doc)
    user, call, answer = root["steps"]
    assert user["message"] == "" and user["extra"]["prompt_tokens"] == len(trajs[0].prompt_ids)
    assert call["tool_calls"][0]["function_name"] == "python" and call["message"].endswith("</python>")
    assert call["observation"]["results"][0]["content"].strip() == RESULT.strip()
    assert answer["message"].strip() == ANSWERS[0]  # the space after a result is cut by the text's tags
    assert [s.get("is_copied_context", False) for s in fork["steps"]] == [False, True, False]


def test_an_evaluation_folder_exports_as_step_0_every_sample_kept(tmp_path, tok):
    _, trajs = hand_run(tmp_path / "made", tok, None)
    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"config": {"model": "tiny"}}))
    (folder / "samples.jsonl").write_text('{"task_id": "sum-0"}\n')
    write_jsonl([trajs[0], trajs[0]], folder / "trajectories.jsonl")  # two samples, the same ids
    files = export(folder, tmp_path / "out")
    assert [f.relative_to(tmp_path / "out").as_posix() for f in sorted(files)] == [
        "eval/step_000000/group0000-traj0000-2.json", "eval/step_000000/group0000-traj0000.json"]
    for f in files:
        doc = json.loads(f.read_text())
        check_atif(doc)
        assert doc["extra"]["step"] == 0 and doc["agent"]["model_name"] == "tiny"


def test_a_folder_without_trajectories_is_one_line_and_status_2(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["export", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "save_trajectories=true" in err and str(run) in err, err


# ---- a real run: 1 GRPO step of the tiny model ----------------------------------------------------


@pytest.mark.slow  # about 25 s: a learner's start, one step and its save
@pytest.mark.filterwarnings("ignore:no tool calls")  # the untrained tiny model calls no tool
def test_a_tiny_model_run_exports_every_trajectory(tmp_path, tiny_model):
    from algorithms.core.learner import Learner
    from algorithms.core.learner_config import LearnerConfig

    out = tmp_path / "grpo"
    Learner(LearnerConfig(model=str(tiny_model), env="AgentMath-v0", output_dir=str(out), total_steps=1,
                          prompts_per_step=1, group_size=2, max_response_tokens=8, threads=1, eval_every=0,
                          save_trajectories=True, progress=False, tensorboard=False,
                          export_model=False)).train()  # fmt: skip
    rows = [json.loads(line) for line in (out / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    files = sorted(export(out, tmp_path / "atif"))
    assert len(files) == len(rows) == 2
    for file, row in zip(files, rows, strict=True):
        doc = json.loads(file.read_text())
        check_atif(doc)
        assert doc["agent"]["model_name"] == str(tiny_model) and doc["extra"]["algorithm"] == "grpo"
        assert doc["steps"][0]["source"] == "system", "the model folder's tokenizer decodes the prompt"
        agent = [s for s in doc["steps"] if s["source"] == "agent"]
        generated = [t for t, m in zip(row["response_ids"], row["loss_mask"], strict=True) if m]
        assert [t for s in agent for t in s["metrics"]["completion_token_ids"]] == generated
        assert doc["final_metrics"]["extra"]["reward"] == row["reward"]
