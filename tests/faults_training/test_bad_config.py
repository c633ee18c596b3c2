"""Bad configuration and data stop `train`, `sft` and `evaluate` before any model is loaded.

"No model was loaded" is asserted on the marker line each entry point prints just before it loads
one ("loading model ..."; the good runs in test_training_faults.py and below show that the marker
does appear). A few cases run the real CLI in a fresh process, as a user does, and time it; the
others call the same `main` in this process (fast, the same code path after the imports).
"""

from __future__ import annotations

import json
import resource
import sys
import time

import pytest
from training_runs import REPO, cli_env, run

from agent_envs.cli import main

GRPO_TINY, SFT_TINY = str(REPO / "configs/grpo_tiny.yaml"), str(REPO / "configs/sft_tiny.yaml")
# the presets' model is the quickstart's SFT output; "tiny" is there on every machine
TRAIN = ["train", "--algo", "grpo", "--config", GRPO_TINY, "model=tiny"]
SFT = ["sft", "--config", SFT_TINY, "model=tiny"]
EVALUATE = ["evaluate", "--engine", "hf"]
TINY_SFT = ["steps=1", "batch_size=2", "num_examples=4", "eval_episodes=2", "progress=false", "tensorboard=false"]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _fails_in_a_fresh_process(argv: list[str], *expected: str) -> None:
    cpu0, start = _children_cpu_s(), time.monotonic()
    proc = run([sys.executable, "-m", "agent_envs.cli", *argv], env=cli_env())
    elapsed, cpu = time.monotonic() - start, _children_cpu_s() - cpu0
    print(f"\n{elapsed:5.2f} s wall, {cpu:4.2f} s CPU: {proc.stderr.strip().splitlines()[-1][:160]}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    for text in expected:
        assert text in proc.stderr, (text, proc.stderr[-3000:])
    assert "loading model" not in proc.stdout, "the model was loaded before the error"
    assert "shared" not in proc.stderr.lower()  # no folder of ours that users do not have
    # CPU time does not grow with the machine's load as wall time does: loading and starting
    # nothing, the error costs the interpreter, the imports (torch: most of it) and the checks
    assert cpu < 15 and elapsed < 120, f"{elapsed:.1f} s wall, {cpu:.1f} s CPU before the error"


def _fails(capsys, argv: list[str], *expected: str) -> None:
    capsys.readouterr()
    assert main(argv) == 2
    out, message = capsys.readouterr()
    assert len(message.strip().splitlines()) == 1, message
    for text in expected:
        assert text in message, (text, message)
    assert "loading model" not in out, "the model was loaded before the error"
    assert "shared" not in message.lower()


def _write_lines(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


@pytest.mark.slow
def test_fresh_processes_fail_fast(tmp_path):
    _fails_in_a_fresh_process([*TRAIN, f"output_dir={tmp_path}", "lrr=1e-4"],
                              "train: override 'lrr=1e-4': unknown config key 'lrr' (did you mean 'lr'?)")  # fmt: skip
    missing = tmp_path / "missing.jsonl"
    _fails_in_a_fresh_process([*TRAIN, f"output_dir={tmp_path}", f"env_kwargs.data_files={missing}"],
                              f"data file '{missing}' does not exist")  # fmt: skip
    good = {"prompt": "Q: 1+1?", "turns": [{"role": "model", "text": "<answer>2</answer>"}]}
    rows = _write_lines(tmp_path / "episodes.jsonl", [good, {"prompt": "Q", "turns": [{"role": "tool", "text": "x"}]}])
    _fails_in_a_fresh_process([*SFT, f"output_dir={tmp_path}", f"data={rows}", *TINY_SFT],
                              f"{rows}:2: field turns[0] must be {{'role': 'model'|'env', 'text': str}}")  # fmt: skip
    _fails_in_a_fresh_process([*EVALUATE, "--env", "AgentMath-v0", "--model", str(tmp_path / "no_model")],
                              f"config field '--model': {tmp_path}/no_model does not exist")  # fmt: skip


def test_train_unknown_keys_and_wrong_types(tmp_path, capsys):
    _fails(capsys, [*TRAIN, f"output_dir={tmp_path}", "total_steps=ten"],
           "config field 'total_steps' must be an integer, got 'ten'")  # fmt: skip
    _fails(capsys, [*TRAIN, f"output_dir={tmp_path}", "tree.beam_size=3"], "unknown config key 'tree'")
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"inherit: {GRPO_TINY}\nsave_evry: 2\n")
    _fails(capsys, ["train", "--algo", "grpo", "--config", str(bad), "model=tiny", f"output_dir={tmp_path}"],
           f"{bad}: unknown config key 'save_evry' (did you mean 'save_every'?)")  # fmt: skip
    _fails(capsys, ["train", "--algo", "grpo", "--config", str(tmp_path / "nope.yaml")],
           f"config file {tmp_path}/nope.yaml not found")  # fmt: skip


def test_train_missing_model_env_and_checkpoint(tmp_path, capsys):
    _fails(capsys, [*TRAIN, f"output_dir={tmp_path}", f"model={tmp_path}/no_such_model"],
           f"config field 'model': {tmp_path}/no_such_model does not exist")  # fmt: skip
    (tmp_path / "not_a_model").mkdir()
    _fails(capsys, [*TRAIN, f"output_dir={tmp_path}", f"model={tmp_path}/not_a_model"],
           "not_a_model has no config.json")  # fmt: skip
    _fails(capsys, [*TRAIN, f"output_dir={tmp_path}", "env=AgentMath-v1"],
           "config field 'env': 'AgentMath-v1' is not a registered env id (did you mean 'AgentMath-v0'?)")  # fmt: skip
    _fails(capsys, [*TRAIN, f"output_dir={tmp_path}", "env_kwargs.max_tool_cals=2"],
           "train: env_kwargs.max_tool_cals: AgentMath-v0 has no such setting (did you mean 'max_tool_calls'?)")  # fmt: skip
    _fails(capsys, [*TRAIN, f"output_dir={tmp_path}", "env_kwargs.world.dificulty=2"],
           "unknown config key 'env_kwargs.world.dificulty' (did you mean 'difficulty'?)")  # fmt: skip
    _fails(capsys, [*TRAIN, f"output_dir={tmp_path}", "--resume-from", str(tmp_path / "elsewhere")],
           "--resume-from", "neither a checkpoint")  # fmt: skip


def test_train_bad_data_rows_name_file_line_and_field(tmp_path, capsys):
    rows = _write_lines(tmp_path / "problems.jsonl", [
        {"id": "a", "question": "1+1?", "answer": "2"},
        {"id": "b", "question": 4, "answer": "4"},
    ])  # fmt: skip
    _fails(capsys, [*TRAIN, f"output_dir={tmp_path}", f"env_kwargs.data_files={rows}"],
           f"train: {rows}, line 2: field 'question' must be a string, got int")  # fmt: skip
    broken = _write_lines(tmp_path / "broken.jsonl", [{"question": "1+1?", "answer": "2"}, '{"question": "3+3?",'])
    _fails(capsys, [*TRAIN, f"output_dir={tmp_path}", f"env_kwargs.data_files={broken}"],
           f"{broken}, line 2: not valid JSON")  # fmt: skip


def test_sft_bad_rows_and_missing_data(tmp_path, capsys):
    rows = _write_lines(tmp_path / "messages.jsonl", [{"messages": [{"role": "user", "content": 3}]}])
    _fails(capsys, [*SFT, f"output_dir={tmp_path}", f"data={rows}", *TINY_SFT],
           f"{rows}:1: field messages[0] must be")  # fmt: skip
    rows = _write_lines(tmp_path / "nothing.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    _fails(capsys, [*SFT, f"output_dir={tmp_path}", f"data={rows}", *TINY_SFT],
           f"{rows}:1: no assistant message to learn from")  # fmt: skip
    _fails(capsys, [*SFT, f"output_dir={tmp_path}", f"data={tmp_path}/nope.jsonl", *TINY_SFT],
           f"SFT data file (config field 'data') {tmp_path}/nope.jsonl not found")  # fmt: skip
    _fails(capsys, [*SFT, f"output_dir={tmp_path}", "stepz=3"], "unknown config key 'stepz' (did you mean 'steps'?)")


def test_evaluate_checks_env_before_the_engine(capsys):
    _fails(capsys, [*EVALUATE, "--env", "AgentMaths-v0", "--model", "tiny"],
           "config field 'env': 'AgentMaths-v0' is not a registered env id (did you mean 'AgentMath-v0'?)")  # fmt: skip
    _fails(capsys, [*EVALUATE, "--env", "AgentMath-v0", "--model", "tiny", "--first-task", "100000"],
           "leaves none to evaluate")  # fmt: skip


@pytest.mark.slow
def test_sft_with_good_data_does_load_the_model(tmp_path):
    good = {"prompt": "Q: 1+1?", "turns": [{"role": "model", "text": "<answer>2</answer>"}]}
    rows = _write_lines(tmp_path / "episodes.jsonl", [good, good])
    argv = [*SFT, f"output_dir={tmp_path}", f"data={rows}", *TINY_SFT, "eval_max_response_tokens=8"]
    proc = run([sys.executable, "-m", "agent_envs.cli", *argv])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[sft] loading model" in proc.stdout


def test_compare_checks_every_run_before_training_any(tmp_path, capsys):
    (tmp_path / "grpo.yaml").write_text(f"inherit: {GRPO_TINY}\nmodel: tiny\n")  # no dapo.yaml
    out = tmp_path / "cmp"
    _fails(capsys, ["compare", "--algos", "grpo,dapo", "--seeds", "0", "--out", str(out), "--config",
                    str(tmp_path / "{algo}.yaml"), "--jobs", "1"],
           f"compare: dapo seed 0: FileNotFoundError: config file {tmp_path}/dapo.yaml not found")  # fmt: skip
    assert not (out / "grpo-0" / "metrics.jsonl").exists()  # grpo, first in line, never started
    _fails(capsys, ["compare", "--algos", "grpo", "--seeds", "0,1", "--out", str(out), "--config",
                    str(tmp_path / "{algo}.yaml"), "--jobs", "1", "total_step=2"],
           "compare: grpo seed 0: ValueError: override 'total_step=2': unknown config key 'total_step'")  # fmt: skip
