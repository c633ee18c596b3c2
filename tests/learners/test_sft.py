"""Cold-start SFT: token layout and masks of each data form, bad rows named, and the tiny model
learning the protocol from the arithmetic world's gold traces (held-out greedy episodes)."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
from learner_support import SYSTEM_PROMPT
from transformers import AutoTokenizer

import agent_envs  # noqa: F401
from algorithms.models.tiny import build_tiny_model
from algorithms.sft import gold_trace_examples, jsonl_examples


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(build_tiny_model(seed=0))


def test_gold_trace_layout_matches_the_runner(tokenizer):
    env = gym.make("AgentMath-v0", tokenizer=tokenizer, system_prompt=SYSTEM_PROMPT).unwrapped
    [ex] = gold_trace_examples(env, tokenizer, [3])
    _, info = env.reset(options={"index": 3})
    actions = env.task.gold_trace
    enc = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in actions]
    prompt = info["prompt_token_ids"]
    assert ex.ids[: len(prompt)] == prompt and not any(ex.mask[: len(prompt)])
    # first action trains, then the tool result (mask 0), then the answer + EOS train
    a0 = slice(len(prompt), len(prompt) + len(enc[0]))
    assert ex.ids[a0] == enc[0] and all(ex.mask[a0])
    tail = len(enc[-1]) + 1
    assert ex.ids[-tail:] == enc[-1] + [tokenizer.eos_token_id] and all(ex.mask[-tail:])
    obs = ex.mask[a0.stop : len(ex.ids) - tail]
    assert obs and not any(obs)
    obs_text = tokenizer.decode(ex.ids[a0.stop : len(ex.ids) - tail])
    assert "<result>" in obs_text


def test_jsonl_forms_and_errors(tmp_path, tokenizer):
    path = tmp_path / "episodes.jsonl"
    rows = [
        {
            "prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
            "turns": [
                {"role": "model", "text": "<python>1+1</python>"},
                {"role": "env", "text": " <result>2</result>"},
                {"role": "model", "text": "<answer>2</answer>"},
            ],
        },
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "bye"},
                {"role": "assistant", "content": "ok"},
            ]
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    turns, msgs = jsonl_examples(path, tokenizer)
    trained = tokenizer.decode([i for i, m in zip(turns.ids, turns.mask, strict=True) if m])
    assert trained == "<python>1+1</python><answer>2</answer><|im_end|>"
    trained = tokenizer.decode([i for i, m in zip(msgs.ids, msgs.mask, strict=True) if m])
    assert "hello" in trained and "ok" in trained and "hi" not in trained and "bye" not in trained
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"turns": []}) + "\n")
    with pytest.raises(ValueError, match=r"episodes.jsonl:2: field 'prompt' must be a string"):
        jsonl_examples(path, tokenizer)
    path.write_text('{"prompt": "x", "turns": [{"role": "tool", "text": "y"}]}\n')
    with pytest.raises(ValueError, match=r":1: field turns\[0\] must be"):
        jsonl_examples(path, tokenizer)


@pytest.mark.slow
def test_sft_teaches_the_protocol(sft_run):
    ev = sft_run["eval"]
    print(f"\nSFT held-out greedy episodes: {ev}")
    assert ev["episodes"] == 48
    assert ev["protocol_valid"] >= 0.9, ev
    assert ev["tool_call_rate"] >= 0.9, ev


def test_micro_batches_give_the_whole_batch_step(tmp_path):
    """Two steps of 8 sequences, whole or in micro-batches of 3, 3 and 2: the same losses and weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from algorithms.core.run_log import read_metrics
    from algorithms.models.resolve import resolve_model
    from algorithms.sft import SFTConfig, run_sft

    runs = {}
    for micro in (None, 3):
        out = tmp_path / f"micro-{micro}"
        run_sft(SFTConfig(model="tiny", env="AgentMath-v0", num_examples=16, steps=2, batch_size=8, lr=1e-3,
                          micro_batch_size=micro, eval_episodes=0, output_dir=str(out), threads=1, progress=False,
                          tensorboard=False))
        weights = AutoModelForCausalLM.from_pretrained(out / "final_model").state_dict()
        runs[micro] = ([m["loss"] for m in read_metrics(out)], weights)
    (whole_loss, whole), (micro_loss, micro) = runs[None], runs[3]
    assert micro_loss == pytest.approx(whole_loss, rel=1e-5)
    assert all(torch.allclose(micro[n], t, atol=1e-5) for n, t in whole.items())
    start = AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).state_dict()
    assert any(not torch.equal(t, start[n]) for n, t in whole.items())  # the steps moved the weights
