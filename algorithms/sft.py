"""Cold-start SFT on tool-use traces: the model learns the protocol before RL.

    >>> from algorithms.sft import SFTConfig, run_sft
    >>> import tempfile
    >>> cfg = SFTConfig(model="tiny", env="AgentMath-v0", num_examples=8, steps=2, batch_size=4,
    ...                 eval_episodes=2, eval_max_response_tokens=16, output_dir=tempfile.mkdtemp(),
    ...                 progress=False, tensorboard=False)
    >>> result = run_sft(cfg)  # doctest: +ELLIPSIS
    [sft] loading model ...
    >>> 0.0 <= result["eval"]["protocol_valid"] <= 1.0
    True

Training data is either the env's own gold traces (each world task has `task.gold_trace`, a list
of actions; replaying them through the env yields the tool results), or a user JSONL file
(`data=`) with one episode per line in one of two forms:

* `{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]}`:
  rendered with the tokenizer's chat template; the loss covers the assistant turns only;
* `{"prompt": "<rendered prompt text>", "turns": [{"role": "model"|"env", "text": "..."}, ...]}`:
  the tag protocol as the runner sees it; the loss covers the model turns (and the EOS after the
  last one) only.

Token layout of a gold-trace episode matches the rollout runner's exactly: prompt ids from
`env.reset` (chat template), each action encoded on its own, each observation encoded on its own
with mask 0, and EOS after the final action (the model must learn to stop). At the end the
model is evaluated greedily on held-out tasks through the real runner and envs:
`protocol_valid` is the share of episodes whose response passes the protocol's format check.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from agent_envs.base.config import check_types, config_dict, option
from agent_envs.data.jsonl import iter_json_objects
from algorithms.base.preflight import check_env, check_model, check_output_dir
from algorithms.core.model_setup import load_policy
from algorithms.core.run_folder import claim_run_folder
from algorithms.core.run_log import RunLogger, read_metrics
from algorithms.core.schedule import lr_factor
from algorithms.core.threads import THREADS_HELP, Threads, apply_threads, choose_threads
from algorithms.models.lora import LoRAConfig, save_merged


@dataclass
class SFTConfig:
    """Cold-start SFT. Defaults follow docs/training.md (Tiny models on CPU): lr 1e-3 cosine, ~300 steps at
    batch 32."""

    model: str = option("tiny", 'a named model ("tiny": built locally, "smollm2": SmolLM2-135M-Instruct), '
                        "an HF checkpoint dir or a hub id")
    lora: LoRAConfig = option(factory=LoRAConfig, help="LoRA adapters instead of full fine-tuning (lora.enabled=true)")
    env: str = option("AgentMath-v0", "a registered gymnasium env id (its gold traces are the data)")
    env_kwargs: dict = option(factory=dict, help="keyword arguments of gymnasium.make")
    data: str | None = option(None, "JSONL of episodes (null: the env's gold traces)")
    num_examples: int = option(4000, "gold-trace episodes (tasks 0..n-1 of the env)")
    output_dir: str = option("runs/sft", "run directory: logs and the final model")
    seed: int = option(0, "seed of data order and initialisation")
    threads: Threads = option("auto", THREADS_HELP)
    steps: int = option(300, "optimizer steps")
    batch_size: int = option(32, "sequences per optimizer step")
    micro_batch_size: int | None = option(
        None, "sequences per forward and backward pass, their gradients summed into one step (null: the "
        "whole batch); the loss and step are the same, the memory smaller")
    lr: float = option(1e-3, "AdamW learning rate")
    lr_schedule: Literal["cosine", "constant"] = option("cosine", "learning-rate schedule")
    warmup_steps: int = option(10, "steps of linear warm-up")
    weight_decay: float = option(0.0, "AdamW weight decay")
    max_grad_norm: float | None = option(1.0, "gradient clipping norm (null: no clipping)")
    max_length: int = option(1024, "longer episodes are dropped (with a count in the log)")
    eval_episodes: int = option(64, "greedy held-out episodes at the end (tasks from the end of the env)")
    eval_max_response_tokens: int = option(128, "response budget of the held-out episodes")
    tensorboard: bool = option(True, "write TensorBoard logs")
    progress: bool = option(True, "show a progress bar")

    def validate(self) -> None:
        check_types(self)
        for key in ("steps", "batch_size", "num_examples", "max_length"):
            if getattr(self, key) < 1:
                raise ValueError(f"config field {key!r} must be >= 1, got {getattr(self, key)!r}")
        if self.lr <= 0:
            raise ValueError(f"config field 'lr' must be > 0, got {self.lr!r}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"config field 'micro_batch_size' must be >= 1 or null, got {self.micro_batch_size!r}")
        choose_threads(self.threads, cores=1, load=0.0)  # raises on a bad value, naming the field


@dataclass
class Example:
    """One training sequence: ids and a 0/1 loss mask of the same length."""

    ids: list[int]
    mask: list[int]
    source: str = ""


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _eos(tokenizer: Any) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token; SFT needs one to teach the model to stop")
    return int(tokenizer.eos_token_id)


def gold_trace_examples(env: Any, tokenizer: Any, indices: list[int]) -> list[Example]:
    """Replay each task's gold trace through the env; only the actions (and final EOS) train."""
    out = []
    for i in indices:
        _, info = env.reset(options={"index": i})
        task = env.task
        if not task.gold_trace:
            raise ValueError(f"task {task.id!r} (index {i}) has no gold_trace; pass data=<episodes.jsonl>")
        ids = list(info.get("prompt_token_ids") or _encode(tokenizer, env.state.prompt))
        mask = [0] * len(ids)
        reward, done = 0.0, False
        for action in task.gold_trace:
            a = _encode(tokenizer, action)
            ids += a
            mask += [1] * len(a)
            obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            if done:
                break
            o = _encode(tokenizer, obs)
            ids += o
            mask += [0] * len(o)
        # a teacher's deliberate mistake (metadata trace_correct False) is meant to fail
        if not done or (reward <= 0 and task.metadata.get("trace_correct", True)):
            raise ValueError(
                f"gold trace of task {task.id!r} does not solve it (reward {reward}); check the world"
            )
        ids.append(_eos(tokenizer))
        mask.append(1)
        out.append(Example(ids, mask, task.id))
    return out


def episode_form(row: dict, where: str) -> str:
    """"messages" or "turns": which of the two JSONL forms `row` is, or a ValueError naming the
    line and field (checked without a tokenizer, so before the model is loaded)."""
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"{where}: field 'messages' must be a non-empty list of {{role, content}} objects")
        for n, m in enumerate(messages):
            # content may be null (a tool-call turn) or a list of parts: chat templates take both
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(
                m.get("content"), str | list | None
            ):
                raise ValueError(f"{where}: field messages[{n}] must be {{'role': str, 'content': str}}, got {m!r:.80}")
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError(f"{where}: no assistant message to learn from")
        return "messages"
    if "prompt" in row or "turns" in row:
        if not isinstance(row.get("prompt"), str):
            raise ValueError(f"{where}: field 'prompt' must be a string (the rendered prompt)")
        if not isinstance(row.get("turns"), list):
            raise ValueError(f"{where}: field 'turns' must be a list of {{role, text}} objects")
        for n, turn in enumerate(row["turns"]):
            if (
                not isinstance(turn, dict)
                or turn.get("role") not in ("model", "env")
                or not isinstance(turn.get("text"), str)
            ):
                raise ValueError(f"{where}: field turns[{n}] must be {{'role': 'model'|'env', 'text': str}}")
        if not any(t["role"] == "model" and t["text"] for t in row["turns"]):
            raise ValueError(f"{where}: no model turn to learn from")
        return "turns"
    raise ValueError(f"{where}: expected field 'messages', or 'prompt' + 'turns'; got {sorted(row)[:8]}")


def check_sft_data(path: str | os.PathLike) -> int:
    """Read every episode of an SFT JSONL file and check its form; return the count."""
    count = 0
    for where, _, row in iter_json_objects(path, "SFT data file (config field 'data')"):
        episode_form(row, where)
        count += 1
    if not count:
        raise ValueError(f"{path}: no episodes (config field 'data')")
    return count


def _messages_example(row: dict, tokenizer: Any, where: str) -> Example:
    messages = row["messages"]
    ids: list[int] = []
    mask: list[int] = []
    for k, msg in enumerate(messages):
        if msg["role"] == "assistant":
            before = tokenizer.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True)
            after = tokenizer.apply_chat_template(messages[: k + 1], tokenize=False)
            if not after.startswith(before):
                raise ValueError(f"{where}: the chat template is not prefix-preserving at message {k}")
            prefix_ids = _encode(tokenizer, before)
            if prefix_ids[: len(ids)] != ids:  # keep the context exactly as rendered
                ids, mask = prefix_ids, [0] * len(prefix_ids)
            else:
                ids += prefix_ids[len(ids) :]
                mask += [0] * (len(prefix_ids) - len(mask))
            reply = _encode(tokenizer, after[len(before) :])
            ids += reply
            mask += [1] * len(reply)
    if not any(mask):
        raise ValueError(f"{where}: no assistant message to learn from")
    return Example(ids, mask, where)


def _turns_example(row: dict, tokenizer: Any, where: str) -> Example:
    ids = _encode(tokenizer, row["prompt"])
    mask = [0] * len(ids)
    for turn in row["turns"]:
        t = _encode(tokenizer, turn["text"])
        ids += t
        mask += [int(turn["role"] == "model")] * len(t)
    if not any(mask):
        raise ValueError(f"{where}: no model turn to learn from")
    ids.append(_eos(tokenizer))
    mask.append(1)
    return Example(ids, mask, where)


def jsonl_examples(path: str | os.PathLike, tokenizer: Any) -> list[Example]:
    """Episodes from a user JSONL file (see the module docstring for the two accepted forms)."""
    out = []
    for where, _, row in iter_json_objects(path, "SFT data file (config field 'data')"):
        build = _messages_example if episode_form(row, where) == "messages" else _turns_example
        out.append(build(row, tokenizer, where))
    if not out:
        raise ValueError(f"{path}: no episodes")
    return out


def _loss(model: Any, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor, n_tok: int, dev: Any,
          zero: bool = False) -> torch.Tensor:
    """Summed next-token NLL over the masked-in targets of these sequences, divided by the step's
    target count `n_tok` (so micro-batches add up to the batch's mean); `zero` weighs it 0."""
    logits = model(input_ids=ids.to(dev), attention_mask=attn.to(dev)).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1).to(dev), reduction="none"
    )
    m = mask[:, 1:].reshape(-1).to(dev)
    if zero:
        m = torch.zeros_like(m)
    return (nll * m).sum() / max(1, n_tok)


def _batch(examples: list[Example], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    mask = torch.zeros((len(examples), width))
    for i, e in enumerate(examples):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        attn[i, : len(e.ids)] = 1
        mask[i, : len(e.ids)] = torch.tensor(e.mask, dtype=torch.float)
    return ids, attn, mask


def evaluate_protocol(
    model: Any, tokenizer: Any, env_factory: Any, indices: list[int], max_response_tokens: int
) -> dict[str, float]:
    """Greedy episodes through the real runner and envs: protocol-valid share, accuracy, tool use."""
    from algorithms.core.group_sampling import run_coroutine
    from algorithms.rollout.engine import SamplingParams
    from algorithms.rollout.hf import HFEngine
    from algorithms.rollout.runner import run_episodes

    engine = HFEngine(model, tokenizer, device=str(next(model.parameters()).device))
    params = SamplingParams(temperature=0.0, max_tokens=max_response_tokens)
    trajs = run_coroutine(
        run_episodes(engine, env_factory, params, tasks=indices, max_response_tokens=max_response_tokens)
    )
    model.train()
    n = max(1, len(trajs))
    return {
        "episodes": float(len(trajs)),
        "protocol_valid": sum(bool(t.components.get("format_ok")) for t in trajs) / n,
        "accuracy": sum(float(t.components.get("correct", 0.0) or 0.0) for t in trajs) / n,
        "tool_call_rate": sum(t.tool_calls > 0 for t in trajs) / n,
        "reward_mean": sum(t.reward for t in trajs) / n,
    }


def finished_steps(cfg: SFTConfig) -> int | None:
    """`cfg.steps` when the run in `output_dir` logged its last step and saved its final model
    (which is written after the last step); None otherwise."""
    out = Path(cfg.output_dir)
    if not (out / "final_model" / "config.json").is_file():
        return None
    steps = [row.get("step", 0) for row in read_metrics(out)]
    return cfg.steps if steps and max(steps) >= cfg.steps else None


def preflight_sft(cfg: SFTConfig) -> None:
    """Everything that can be checked without the model (config, model path, env and its data,
    the JSONL episodes, the output folder), so a typo costs a second, not a model load."""
    cfg.validate()
    check_model(cfg.model)
    num_tasks = len(check_env(cfg.env, cfg.env_kwargs).tasks)
    if cfg.data:
        check_sft_data(cfg.data)
    elif num_tasks - cfg.eval_episodes < 1:
        raise ValueError(
            f"config field 'eval_episodes': env {cfg.env} has {num_tasks} tasks, too few to hold out "
            f"{cfg.eval_episodes} and train on the rest"
        )
    check_output_dir(cfg.output_dir)


def run_sft(cfg: SFTConfig, *, preflight: bool = True, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Train, save `<output_dir>/final_model` (HF format), evaluate; return the results.

    An `output_dir` that holds another run is refused (algorithms/core/run_folder.py) unless
    `overwrite` removes it or `resume` continues it: a finished run (its final model saved after
    its last step) is kept as it is; an unfinished one trains again from step 0, since SFT keeps no
    checkpoints. `preflight=False` skips `preflight_sft` for a caller that has just run it."""
    # One function, long on purpose: like the RL loop, SFT reads top to bottom (data, model,
    # steps, save, evaluation), and its parts share the accelerator and the run's log.
    import gymnasium as gym
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    import agent_envs  # noqa: F401  (registers the ids)

    if claim_run_folder(cfg.output_dir, "sft", config={"algo": "sft", **config_dict(cfg)}, resume=resume,
                        overwrite=overwrite):
        done = finished_steps(cfg)
        if done is not None:
            print(f"sft: --resume: the run in {cfg.output_dir} finished all {done} steps; its final model is kept",
                  flush=True)
            return {"model": str(Path(cfg.output_dir) / "final_model"), "resumed_at_step": done}
        print(f"sft: --resume: the run in {cfg.output_dir} did not finish; SFT keeps no checkpoints, so it "
              "trains again from step 0", flush=True)
    if preflight:
        preflight_sft(cfg)
    apply_threads(cfg.threads)
    acc = Accelerator(step_scheduler_with_optimizer=False)
    set_seed(cfg.seed)
    model, tokenizer, _ = load_policy(cfg.model, accelerator=acc, label="sft", lora=cfg.lora)

    def env_factory() -> Any:
        return gym.make(cfg.env, **{"tokenizer": tokenizer, **cfg.env_kwargs}).unwrapped

    env = env_factory()
    if cfg.data:
        examples = jsonl_examples(cfg.data, tokenizer)
    else:
        n = min(cfg.num_examples, len(env.tasks) - cfg.eval_episodes)
        if n < 1:
            raise ValueError(
                f"env {cfg.env} has {len(env.tasks)} tasks: too few for {cfg.eval_episodes} held out"
            )
        examples = gold_trace_examples(env, tokenizer, list(range(n)))
    kept = [e for e in examples if len(e.ids) <= cfg.max_length]
    dropped = len(examples) - len(kept)
    if not kept:
        raise ValueError(f"every SFT episode is longer than max_length={cfg.max_length}")

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay)

    def lr_lambda(step: int) -> float:
        return lr_factor(step, total_steps=cfg.steps, warmup_steps=cfg.warmup_steps, schedule=cfg.lr_schedule)

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    model, opt, sched = acc.prepare(model, opt, sched)
    log = RunLogger(
        cfg.output_dir,
        config={"algo": "sft", **config_dict(cfg), "examples": len(kept), "dropped_too_long": dropped},
        total_steps=cfg.steps,
        enabled=acc.is_main_process,
        tensorboard=cfg.tensorboard,
        progress=cfg.progress,
    )
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(len(kept))
    cursor = 0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    world, rank = acc.num_processes, acc.process_index
    model.train()
    t0 = time.perf_counter()
    try:
        for step in range(1, cfg.steps + 1):
            if cursor + cfg.batch_size > len(order):
                order, cursor = rng.permutation(len(kept)), 0
            picked = [kept[i] for i in order[cursor : cursor + cfg.batch_size]]
            cursor += cfg.batch_size
            local = picked[rank::world]
            dummy = not local  # more ranks than examples: a zero-weight pass keeps DDP aligned
            if dummy:
                local = picked[:1]
            n_tok = sum(sum(e.mask[1:]) for e in picked)  # targets are shifted by one
            size = cfg.micro_batch_size or len(local)
            parts = [local[i : i + size] for i in range(0, len(local), size)]
            loss = torch.zeros((), device=acc.device)
            for i, part in enumerate(parts):
                # gradients are all-reduced once, after the step's last micro-batch
                with acc.no_sync(model) if i < len(parts) - 1 else contextlib.nullcontext():
                    part_loss = _loss(model, *_batch(part, pad), n_tok, acc.device, zero=dummy)
                    acc.backward(part_loss * world)
                loss += part_loss.detach()
            grad_norm = (
                acc.clip_grad_norm_(model.parameters(), cfg.max_grad_norm) if cfg.max_grad_norm else None
            )
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            metrics = {"loss": float(acc.reduce(loss.detach(), "sum")), "lr": sched.get_last_lr()[0]}
            if grad_norm is not None:
                metrics["grad_norm"] = float(grad_norm)
            log.log(step, metrics)
        train_s = time.perf_counter() - t0
        out = Path(cfg.output_dir) / "final_model"
        unwrapped = acc.unwrap_model(model)
        if acc.is_main_process:
            save_merged(unwrapped, out)  # a LoRA run's adapters merged: a plain checkpoint
            tokenizer.save_pretrained(out)
        acc.wait_for_everyone()
        result: dict[str, Any] = {"model": str(out), "examples": len(kept), "train_s": train_s}
        if cfg.eval_episodes and acc.is_main_process:
            held_out = list(range(len(env.tasks) - cfg.eval_episodes, len(env.tasks)))
            result["eval"] = evaluate_protocol(
                unwrapped, tokenizer, env_factory, held_out, cfg.eval_max_response_tokens
            )
            log.log(cfg.steps, {f"eval_{k}": v for k, v in result["eval"].items()})
            (Path(cfg.output_dir) / "eval.json").write_text(json.dumps(result["eval"], indent=1))
    finally:
        log.close(plot=acc.is_main_process)
    return result


__all__ = [
    "Example",
    "SFTConfig",
    "check_sft_data",
    "episode_form",
    "evaluate_protocol",
    "finished_steps",
    "gold_trace_examples",
    "jsonl_examples",
    "preflight_sft",
    "run_sft",
]
