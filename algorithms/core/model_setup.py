"""What a learner trains and samples with: the accelerator, the policy and its frozen reference,
AdamW with the learning-rate schedule, the envs and the rollout engine; and the weight sync from
the policy into that engine.

    >>> from algorithms.core.model_setup import model_path
    >>> model_path("Qwen/Qwen2.5-7B-Instruct")
    'Qwen/Qwen2.5-7B-Instruct'

A model is loaded by its config name only (`load_policy(cfg.model, ...)`); `model_path` is the one
place that turns a name into something `from_pretrained` and vLLM can load.
"""

from __future__ import annotations

import copy
import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from algorithms.core.schedule import lr_factor


def make_accelerator(mixed_precision: str) -> Any:
    """An `Accelerator`; `auto` precision is bf16 where the GPU supports it, else none. The
    learner steps its scheduler itself, once per optimizer step."""
    from accelerate import Accelerator

    if mixed_precision == "auto":
        bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        mixed_precision = "bf16" if bf16 else "no"
    return Accelerator(mixed_precision=mixed_precision, step_scheduler_with_optimizer=False)


def set_accumulation(accelerator: Any, cfg: Any, sequences_per_prompt: int) -> None:
    """Accumulate gradients over GA micro-batches per mini-batch on one rank: fixed by the config,
    so every rank agrees (DeepSpeed accumulates itself: it gets the same numbers)."""
    world, micro_batch_size = accelerator.num_processes, cfg.micro_batch_size
    if cfg.prompts_per_step % (cfg.num_minibatches * world):
        raise ValueError(
            f"config: each of the {cfg.num_minibatches} mini-batches must split evenly over "
            f"{world} processes; make mini_batch_prompts a multiple of {world}"
        )
    per_rank = cfg.prompts_per_step // cfg.num_minibatches // world * sequences_per_prompt
    steps = max(1, math.ceil(per_rank / micro_batch_size))
    accelerator.gradient_accumulation_steps = steps
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None:
        ds = plugin.deepspeed_config
        ds["gradient_accumulation_steps"] = steps
        if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
            ds["train_micro_batch_size_per_gpu"] = micro_batch_size
        ds.pop("train_batch_size", None)


def model_path(name: str, accelerator: Any = None) -> str:
    """The folder or hub id to load for the config's `model`, from the one model resolver: a named
    model ("tiny", "smollm2") is built or converted once, by the main process first."""
    from algorithms.models.resolve import NAMED_MODELS, resolve_model

    if accelerator is None or name not in NAMED_MODELS:
        return resolve_model(name)
    with accelerator.main_process_first():
        return resolve_model(name)


def load_policy(
    name: str, *, accelerator: Any, gradient_checkpointing: bool = False, label: str = "learner", lora: Any = None
) -> tuple[Any, Any, str]:
    """(model, tokenizer, path) of the config's `model`, in float32 (Accelerate casts for mixed
    precision), with LoRA adapters when `lora.enabled` (only they train); `label` prefixes the log
    line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path(name, accelerator)
    if accelerator.is_main_process:  # also the marker the preflight tests look for
        print(f"[{label}] loading model {path}", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if lora is not None and lora.enabled:
        from algorithms.models.lora import wrap_lora

        model = wrap_lora(model, lora)
    return model, tokenizer, path


def reference_model(model: Any) -> Any:
    """A frozen copy of the policy as loaded: π_ref of the KL term."""
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    return ref.eval()


def make_optimizer(model: Any, cfg: Any) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the trainable parameters, and its warm-up/cosine schedule over every optimizer
    step of the run (total_steps × mini-batches × ppo_epochs)."""
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.lr,
        betas=tuple(cfg.adam_betas),
        weight_decay=cfg.weight_decay,
    )
    # a partial, not a closure: LambdaLR's state_dict keeps it as {} (as checkpoints always had)
    factor = functools.partial(
        lr_factor,
        total_steps=cfg.total_steps * cfg.num_minibatches * cfg.ppo_epochs,
        warmup_steps=cfg.warmup_steps,
        schedule=cfg.lr_schedule,
        min_ratio=cfg.min_lr_ratio,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def env_factory(cfg: Any, tokenizer: Any) -> Callable[[], Any]:
    """A function that makes a fresh env of the config's `env` and `env_kwargs`."""

    def make() -> Any:
        import gymnasium as gym

        import agent_envs  # noqa: F401  (registers the ids)

        kwargs = {"tokenizer": tokenizer, "max_response_tokens": cfg.max_response_tokens}
        kwargs.update(cfg.env_kwargs)
        return gym.make(cfg.env, **kwargs).unwrapped

    return make


def make_engine(cfg: Any, *, path: str, tokenizer: Any, accelerator: Any, model: Any) -> Any:
    """The rollout engine of `cfg.engine` (docs/rollout.md)."""
    if cfg.engine == "hf":
        from algorithms.rollout.hf import HFEngine

        # the engine decodes with the learner's own module: always in sync, no copy. It loads its
        # own copy in async training, where it generates while the module updates, and under LoRA,
        # where decoding through the unmerged adapters costs more than a merged copy each step
        # (docs/benchmarks.md, "Real model: time per RL step")
        source = path if cfg.max_staleness or cfg.lora.enabled else accelerator.unwrap_model(model)
        return HFEngine(source, tokenizer, device=str(accelerator.device), seed=cfg.seed, **cfg.engine_kwargs)
    if cfg.engine == "vllm-server":
        from algorithms.rollout.vllm_server import VLLMServerEngine

        if "base_url" not in cfg.engine_kwargs:
            raise ValueError("engine=vllm-server needs engine_kwargs.base_url (e.g. http://127.0.0.1:8000/v1), "
                             "the address of `agent-envs serve-rollout`")
        return VLLMServerEngine(tokenizer=tokenizer, **cfg.engine_kwargs)
    from algorithms.rollout.vllm import VLLMEngine

    return VLLMEngine(path, **{"seed": cfg.seed, **cfg.engine_kwargs})


def gateway_source(cfg: Any, engine: Any, *, algo: str, world: int) -> Any:
    """The gateway the learner of algorithm `algo` trains from with `rollout_source: gateway`
    (docs/interop.md): its `engine` served on 127.0.0.1; each step's batch is GRPO groups of
    rewarded sessions."""
    from algorithms.gateway.training import GatewaySource

    if algo != "grpo":  # DAPO, ARPO and AEPO change the rollout that sessions replace
        raise ValueError(f"config field 'rollout_source': gateway sessions replace the rollout, which "
                         f"{algo} changes; train them with --algo grpo")
    if world > 1:
        raise ValueError("config field 'rollout_source': gateway training runs in one process")
    return GatewaySource(engine, port=cfg.gateway_port, model_name=cfg.model, timeout_s=cfg.gateway_timeout_s,
                         max_response_tokens=cfg.max_response_tokens)


def agent_source(cfg: Any, engine: Any, env_factory: Any, tokenizer: Any, *, algo: str, world: int) -> Any:
    """The agent program the learner of algorithm `algo` runs per sample with `rollout_source:
    agent` (docs/interop.md), against its `engine` behind the gateway."""
    from algorithms.gateway.agent import AgentSource

    if algo not in ("grpo", "dapo"):  # ARPO and AEPO fork episodes mid-way: a program cannot be
        raise ValueError(f"config field 'rollout_source': agent runs cannot be forked as {algo}'s tree rollouts "
                         "are; train with --algo grpo or dapo")
    if world > 1:
        raise ValueError("config field 'rollout_source': agent training runs in one process")
    return AgentSource(engine, env_factory, tokenizer, cfg.agent, env_id=cfg.env, model_name=cfg.model,
                       max_response_tokens=cfg.max_response_tokens)


def push_weights(accelerator: Any, model: Any, engine: Any, kind: str) -> None:
    """Load the policy's current weights into a synchronous rollout engine of kind `kind`.
    Collective: every rank joins the gather of the full weights (FSDP and ZeRO-3 shard them)."""
    module = accelerator.unwrap_model(model)
    if kind == "hf" and getattr(engine, "model", None) is module:
        return  # it decodes with the learner's module itself
    state = accelerator.get_state_dict(model)
    from algorithms.models.lora import merged_state_dict, merged_weights

    # a LoRA policy hands over full weights under the base model's names, adapters merged
    if kind == "vllm-server":
        # one server for all ranks: the main process hands the weights over
        if accelerator.is_main_process:
            engine.sync_weights(merged_state_dict(module, state), config=module.config)
    else:
        # colocated engines (vLLM, or HF with its own copy), one per rank: FSDP and ZeRO-3 leave
        # the full weights on rank 0 only, which streams them to the others tensor by tensor while
        # each rank's engine loads them
        from algorithms.core.weight_gather import every_rank_weights

        engine.sync_weights(merged_weights(every_rank_weights(state, accelerator.device), module))
    del state
    accelerator.wait_for_everyone()


def export_policy(accelerator: Any, model: Any, tokenizer: Any, out_dir: str | os.PathLike) -> Path:
    """`save_pretrained` the policy and tokenizer (loadable by transformers and vLLM); a LoRA
    policy is saved merged, a plain checkpoint."""
    from algorithms.models.lora import save_merged

    out = Path(out_dir)
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        save_merged(accelerator.unwrap_model(model), out, state)
        tokenizer.save_pretrained(out)
    accelerator.wait_for_everyone()
    return out


__all__ = [
    "agent_source",
    "env_factory",
    "export_policy",
    "gateway_source",
    "load_policy",
    "make_accelerator",
    "make_engine",
    "make_optimizer",
    "model_path",
    "push_weights",
    "reference_model",
    "set_accumulation",
]
