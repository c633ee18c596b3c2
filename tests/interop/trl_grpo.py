"""Run by the TRL test in the venv with TRL pinned: 2 GRPOTrainer steps on AgentMath-v0 through
`agent_envs.interop.trl`, locally or against a `serve-env` server (`url`), printing what happened
as one JSON line.

    python tests/interop/trl_grpo.py '{"model": "/path/to/tiny", "url": null, "out": "/tmp/run"}'

The tiny model is random-init and could not write a tool call's JSON: the call's JSON is added to its
vocabulary as one token (between the tokens `<tool_call>` and `</tool_call>` it has), and the model fitted (plain torch, a few seconds) to answer the prompts
TRL builds with that token, so that the rollouts really call our tool methods through TRL's own
parsing of the decoded text.
"""

import json
import sys
from collections import Counter
from pathlib import Path

import torch
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from agent_envs.interop import trl as adapter

CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 + 2)"}}\n</tool_call>'
args = json.loads(sys.argv[1])
seen: Counter = Counter()
rewards: list[float] = []
_call = adapter.TrlEnv._call


def counted_call(self, tool, argument, value):
    """Our tool method's step, counted (and whether the sandbox printed what the code prints)."""
    out = _call(self, tool, argument, value)
    seen[tool] += 1
    seen["printed_4"] += out.strip() == "4"
    return out


adapter.TrlEnv._call = counted_call


def env_reward(completions, environments, **kwargs):
    scores = adapter.env_reward(completions, environments, **kwargs)
    rewards.extend(scores)
    seen["graded"] += sum("correct" in env.info for env in environments)  # our grader's components
    return scores


torch.manual_seed(0)
tokenizer = AutoTokenizer.from_pretrained(args["model"])
# TRL parses tool calls for the chat templates it knows: Qwen2.5's, which TRL ships, is ChatML
# like the tiny tokenizer's own
tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
tokenizer.add_tokens([CALL[len("<tool_call>"): -len("</tool_call>")]])
model = AutoModelForCausalLM.from_pretrained(args["model"], dtype=torch.float32)
model.resize_token_embeddings(len(tokenizer))
factory = adapter.trl_environment("AgentMath-v0", url=args["url"])

# fit: the prompts as TRL renders them (the env's methods as tools) -> one python call
probe = factory()
batch = []
for seed in range(4):
    messages = [{"role": "user", "content": probe.reset(seed=seed)}]
    prompt = tokenizer.apply_chat_template(messages, tools=[probe.python], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt + CALL + "<|im_end|>", add_special_tokens=False, return_tensors="pt")["input_ids"]
    labels = ids.clone()
    labels[:, : len(tokenizer(prompt, add_special_tokens=False)["input_ids"])] = -100
    batch.append((ids, labels))
probe.env.close()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
for _ in range(30):
    for ids, labels in batch:
        model(input_ids=ids, labels=labels).loss.backward()
    optimizer.step()
    optimizer.zero_grad()

# the row's seed picks the task, so both rollouts of a group play the same one
dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "seed": s} for s in range(4)])
config = GRPOConfig(output_dir=args["out"], max_steps=2, per_device_train_batch_size=2, num_generations=2,
                    max_completion_length=96, max_tool_calling_iterations=1, temperature=0.1, learning_rate=1e-4,
                    use_cpu=True, bf16=False, fp16=False, report_to="none", logging_steps=1, save_strategy="no",
                    dataloader_num_workers=0, seed=0)
trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=dataset,
                      reward_funcs=env_reward, environment_factory=factory)
trainer.train()
for env in trainer._environment_pool[None]:
    env.env.close()
print(json.dumps({"steps": trainer.state.global_step, "tool_calls": dict(seen), "rewards": rewards,
                  "trl": trl.__version__, "log": trainer.state.log_history[:2]}, default=str))
