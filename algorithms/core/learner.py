"""The RL learner loop on Accelerate, shared by GRPO, DAPO, ARPO and AEPO.

    >>> import tempfile
    >>> from algorithms.core.learner import Learner
    >>> from algorithms.core.learner_config import LearnerConfig
    >>> cfg = LearnerConfig(model="tiny", env="AgentMath-v0", total_steps=1, prompts_per_step=2,
    ...                     group_size=2, max_response_tokens=16, output_dir=tempfile.mkdtemp(),
    ...                     progress=False, tensorboard=False, export_model=False)
    >>> [metrics] = Learner(cfg).train()  # doctest: +ELLIPSIS
    [grpo] loading model ...
    [grpo] resolved config: ...
    >>> metrics["num_trajectories"]
    4.0

One RL step (docs/algorithms.md §2.1):

1. draw `prompts_per_step` prompts (seeded order; each draw is a fresh group id);
2. roll out `group_size` episodes per prompt through the rollout runner (`rollout` hook);
3. rewards from the envs (`shape_rewards` hook: DAPO adds overlong shaping);
4. advantages (`compute_advantages` hook: GRPO by default; ARPO/AEPO attribute per token);
5. `ppo_epochs` passes over mini-batches of `mini_batch_prompts` prompts, one optimizer step
   each, with micro-batch gradient accumulation. Every denominator (N_tok, B_S) is computed once
   per mini-batch and all-reduced over ranks, so the loss is a true global token mean whatever
   the split (§2.3–§2.4);
6. sync weights into the rollout engine, log, checkpoint.

Data parallelism: every rank rolls out its own share of each mini-batch's prompts with its own
engine, and trains on it; gradients are averaged by DDP/FSDP/DeepSpeed, and the loss is scaled
by W·GA so the average becomes the global sum. Exact resume: checkpoints hold the model,
optimizer, scheduler, all RNG states, the data position and the step; rollout sampling seeds are
a function of (seed, step, draw), so a resumed run draws the same batches and samples.

Algorithms subclass `Learner` and override hooks; each file is "GRPO, except ...".
"""

from __future__ import annotations

import asyncio
import copy
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agent_envs.base.config import config_dict
from algorithms.base.seeds import draw_seed, flat_group_id, flat_traj_id
from algorithms.core.advantages import ADVANTAGE_ESTIMATORS, grpo_advantages
from algorithms.core.async_rollout import AsyncRollout, async_engine, publish
from algorithms.core.batch import MicroBatch, PromptDraw, PromptSampler, RolloutBatch
from algorithms.core.checkpoint import load_checkpoint, resolve_resume, save_checkpoint
from algorithms.core.learner_config import LearnerConfig
from algorithms.core.logprobs import token_logprobs
from algorithms.core.losses import aggregate, kl_penalty, policy_loss
from algorithms.core.run_log import RunLogger
from algorithms.core.threads import apply_threads

POLICY_LOSSES = {"ppo_clip": "hard", "ppo_clip_gradpreserve": "grad_preserve"}


class Learner:
    """GRPO on Accelerate. Subclasses change behaviour through the hooks marked "hook"."""

    name = "grpo"
    config_class: type[LearnerConfig] = LearnerConfig
    # tree rollouts (forks share their parent's tokens) must come from one policy version each:
    # asynchronous weight syncs then wait for the batch in flight (docs/scaling.md)
    one_version_per_group = False

    def __init__(
        self,
        config: LearnerConfig,
        *,
        accelerator: Any = None,
        engine: Any = None,
        env_factory: Callable[[], Any] | None = None,
    ) -> None:
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        config.validate()
        self.config = cfg = config
        apply_threads(cfg.threads)
        precision = cfg.mixed_precision
        if precision == "auto":
            precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
        self.accelerator = accelerator or Accelerator(
            mixed_precision=precision, step_scheduler_with_optimizer=False
        )
        acc = self.accelerator
        self.world, self.rank = acc.num_processes, acc.process_index
        if cfg.prompts_per_step % (cfg.num_minibatches * self.world):
            raise ValueError(
                f"config: each of the {cfg.num_minibatches} mini-batches must split evenly over "
                f"{self.world} processes; make mini_batch_prompts a multiple of {self.world}"
            )
        self._set_accumulation(self._micro_batches_per_minibatch())
        set_seed(cfg.seed + self.rank)
        self.run_dir = Path(cfg.output_dir)
        self.model_path = self._resolve_model_path()
        self.model, self.tokenizer = self._load_model(self.model_path)
        self.ref_model = self._load_ref_model() if cfg.kl_coef > 0 else None
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=cfg.lr,
            betas=tuple(cfg.adam_betas),
            weight_decay=cfg.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda)
        self.model, self.optimizer, self.scheduler = acc.prepare(self.model, self.optimizer, self.scheduler)
        if self.ref_model is not None:
            self.ref_model = acc.prepare_model(self.ref_model, evaluation_mode=True)
        # DDP-style wrappers expect one forward per backward, and gradient checkpointing turns the
        # KV cache off: sharing prompts is for the single-process case
        self.share_prompts = self.world == 1 and not cfg.gradient_checkpointing
        self.env_factory = env_factory or self._default_env_factory
        self.engine = engine if engine is not None else self._make_engine()
        if cfg.engine == "vllm-server":
            self.sync_engine()  # the server may hold another checkpoint: sample from this policy
        self.health = self._make_health_checker()
        self._logprob_gaps: dict[int, tuple[float, int, float, float]] = {}
        self.producer: AsyncRollout | None = None  # the rollout thread while an async run trains
        num_tasks = self._num_tasks()
        held_out = cfg.eval_episodes if cfg.eval_every else 0
        if num_tasks <= held_out:
            raise ValueError(
                f"config field 'eval_episodes': env {cfg.env} has {num_tasks} tasks, too few to hold "
                f"out {held_out} for validation and train on the rest; lower eval_episodes"
            )
        self.eval_tasks = list(range(num_tasks - held_out, num_tasks))
        self.sampler = PromptSampler(num_tasks - held_out, cfg.seed)
        self.step = 0
        if cfg.max_staleness:
            self.engine = async_engine(self, self.engine)
        self.logger: RunLogger | None = None

    # ---- setup --------------------------------------------------------------------------------

    def _micro_batches_per_minibatch(self) -> int:
        """GA: micro-batches per mini-batch on one rank (fixed, so every rank agrees)."""
        cfg = self.config
        per_rank = cfg.prompts_per_step // cfg.num_minibatches // self.world * self.sequences_per_prompt()
        return max(1, math.ceil(per_rank / cfg.micro_batch_size))

    def _set_accumulation(self, steps: int) -> None:
        acc = self.accelerator
        acc.gradient_accumulation_steps = steps
        plugin = getattr(acc.state, "deepspeed_plugin", None)
        if plugin is not None:  # DeepSpeed accumulates itself: give it the same numbers
            ds = plugin.deepspeed_config
            ds["gradient_accumulation_steps"] = steps
            if ds.get("train_micro_batch_size_per_gpu", "auto") == "auto":
                ds["train_micro_batch_size_per_gpu"] = self.config.micro_batch_size
            ds.pop("train_batch_size", None)

    def sequences_per_prompt(self) -> int:
        """Trajectories per prompt draw (hook: tree rollouts keep a fixed budget M)."""
        return self.config.group_size

    def _resolve_model_path(self) -> str:
        if self.config.model == "tiny":
            from algorithms.models.tiny import build_tiny_model

            with self.accelerator.main_process_first():
                return str(build_tiny_model(seed=0))
        return self.config.model

    def _load_model(self, path: str) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.accelerator.is_main_process:  # also the marker the preflight tests look for
            print(f"[{self.name}] loading model {path}", flush=True)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if self.config.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        return model, tokenizer

    def _load_ref_model(self) -> Any:
        ref = copy.deepcopy(self.model)
        ref.requires_grad_(False)
        return ref.eval()

    def _default_env_factory(self) -> Any:
        import gymnasium as gym

        import agent_envs  # noqa: F401  (registers the ids)

        kwargs = {"tokenizer": self.tokenizer, "max_response_tokens": self.config.max_response_tokens}
        kwargs.update(self.config.env_kwargs)
        return gym.make(self.config.env, **kwargs).unwrapped

    def _num_tasks(self) -> int:
        env = self.env_factory()
        return len(env.tasks)

    def _make_engine(self) -> Any:
        cfg = self.config
        if cfg.engine == "hf":
            from algorithms.rollout.hf import HFEngine

            # the engine decodes with the learner's own module: always in sync, no copy; except in
            # async training, where it generates while the module updates: it loads its own copy
            model = self.model_path if cfg.max_staleness else self.accelerator.unwrap_model(self.model)
            return HFEngine(
                model,
                self.tokenizer,
                device=str(self.accelerator.device),
                seed=cfg.seed,
                **cfg.engine_kwargs,
            )
        if cfg.engine == "vllm-server":
            from algorithms.rollout.vllm_server import VLLMServerEngine

            if "base_url" not in cfg.engine_kwargs:
                raise ValueError("engine=vllm-server needs engine_kwargs.base_url (e.g. http://127.0.0.1:8000/v1), "
                                 "the address of `agent-envs serve-rollout`")
            return VLLMServerEngine(tokenizer=self.tokenizer, **cfg.engine_kwargs)
        from algorithms.rollout.vllm import VLLMEngine

        kwargs = {"seed": cfg.seed, **cfg.engine_kwargs}
        return VLLMEngine(self.model_path, **kwargs)

    def _make_health_checker(self) -> Any:
        """The rollout health checks of every batch; they watch the engine through a recorder."""
        from algorithms.rollout.health import HealthChecker, RecordedEngine

        cfg = self.config
        if cfg.health_checks == "off":
            return HealthChecker(mode="off")
        if not isinstance(self.engine, RecordedEngine):
            self.engine = RecordedEngine(self.engine)
        return HealthChecker.for_env(
            self.env_factory(),
            mode=cfg.health_checks,
            engine=self.engine,
            tokenizer=self.tokenizer,
            max_response_tokens=cfg.max_response_tokens,
            logprob_tol=cfg.health_logprob_tol,
        )

    def _lr_lambda(self, opt_step: int) -> float:
        cfg = self.config
        total = max(1, cfg.total_steps * cfg.num_minibatches * cfg.ppo_epochs)
        if cfg.warmup_steps and opt_step < cfg.warmup_steps:
            return (opt_step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (opt_step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    # ---- hooks ----------------------------------------------------------------------------------

    def sampling_params(self) -> Any:
        """Rollout sampling parameters (hook)."""
        from algorithms.rollout.engine import SamplingParams

        cfg = self.config
        return SamplingParams(
            temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_tokens=cfg.max_response_tokens
        )

    def draw_prompts(self, step: int, count: int, first_group: int) -> list[PromptDraw]:
        """Global prompt draws of a step, identical on every rank."""
        return [
            PromptDraw(index=i, group_id=first_group + k, seed=draw_seed(self.config.seed, step, first_group + k))
            for k, i in enumerate(self.sampler.draw(count))
        ]

    def local_share(self, draws: Sequence[PromptDraw]) -> list[PromptDraw]:
        """This rank's draws: within each mini-batch, a contiguous block per rank, so mini-batch k
        is the same set of prompts whatever the number of processes."""
        k = self.config.num_minibatches
        per_mb = len(draws) // k
        per_rank = per_mb // self.world
        out = []
        for m in range(k):
            start = m * per_mb + self.rank * per_rank
            out += draws[start : start + per_rank]
        return out

    def rollout(self, draws: Sequence[PromptDraw]) -> list[Any]:
        """Trajectories for this rank's draws, `sequences_per_prompt()` each, grouped by draw in
        order (hook: ARPO/AEPO use the tree rollout).

        Trajectory ids are global (`seeds.flat_traj_id`) and the runner derives each request's
        seed from (seed, trajectory id, turn), so samples do not depend on ranks or batching.
        """
        from algorithms.rollout.runner import run_paths, start_group

        cfg = self.config
        g = cfg.group_size
        params = self.sampling_params().with_(seed=cfg.seed)

        async def run() -> list[Any]:
            paths = []
            for d in draws:
                paths += start_group(
                    self.env_factory(),
                    self.tokenizer,
                    d.group_id,
                    g,
                    flat_traj_id(d.group_id, 0, g),
                    seed=d.seed,
                    options={"index": d.index},
                )
            await run_paths(self.engine, paths, params, cfg.max_response_tokens)
            return [p.to_trajectory() for p in paths]

        return _run_coroutine(run())

    def step_draws(self, step: int) -> list[PromptDraw]:
        """This rank's prompt draws of RL step `step`."""
        cfg = self.config
        first = flat_group_id(step, 0, prompts_per_step=cfg.prompts_per_step)
        return self.local_share(self.draw_prompts(step, cfg.prompts_per_step, first))

    def collect(self, step: int) -> tuple[list[Any], dict[str, float]]:
        """One step's local trajectories and rollout metrics (hook: DAPO's dynamic sampling,
        ARPO's tree metrics)."""
        return self.rollout(self.step_draws(step)), {}

    def shape_rewards(self, trajectories: Sequence[Any]) -> torch.Tensor:
        """The scalar reward per trajectory used for advantages (hook: DAPO overlong shaping)."""
        return torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32)

    def compute_advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Advantages ([B] or [B, T]) and the loss mask ([B, T]) (hook: ARPO attribution).

        Groups never straddle ranks (each rank rolls out whole groups), except for `batch` scaling,
        whose std is taken over every rank's rewards.
        """
        cfg = self.config
        if cfg.advantage_estimator == "rloo":
            return ADVANTAGE_ESTIMATORS["rloo"](batch.rewards, batch.group_ids), batch.loss_mask
        if cfg.scale_rewards == "batch" and self.world > 1:
            centred = grpo_advantages(batch.rewards, batch.group_ids, scale_rewards="none")
            every = self.accelerator.gather(batch.rewards.to(self.accelerator.device)).cpu()
            return centred / (every.std() + cfg.adv_eps), batch.loss_mask
        adv = grpo_advantages(
            batch.rewards, batch.group_ids, eps=cfg.adv_eps, scale_rewards=cfg.scale_rewards
        )
        return adv, batch.loss_mask

    def loss_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `policy_loss` (hook: AEPO's gradient-preserving clip)."""
        cfg = self.config
        return {
            "clip_low": cfg.clip_ratio_low,
            "clip_high": cfg.clip_ratio_high,
            "dual_clip": cfg.clip_ratio_c,
            "agg": cfg.loss_agg_mode,
            "upper_clip": POLICY_LOSSES[cfg.policy_loss],
            "max_len": cfg.loss_scale_len or cfg.max_response_tokens,
        }

    def needs_entropy(self) -> bool:
        """Whether the training forward pass computes per-token entropy (hook). Independent of
        `entropy_coeff` alone (docs/algorithms.md D9): any feature or metric that needs it turns it on."""
        return self.config.log_entropy or self.config.entropy_coeff != 0

    def prepare_minibatch(self, batch: RolloutBatch, rows: list[int]) -> Any:
        """Called before the micro-batches of a mini-batch (hook: mini-batch statistics); what it
        returns is handed to `adjust_advantages` for each of those micro-batches."""
        return None

    def adjust_advantages(
        self,
        batch: RolloutBatch,
        micro: MicroBatch,
        advantages: torch.Tensor,
        extras: dict[str, torch.Tensor],
        minibatch_stats: Any = None,
    ) -> torch.Tensor:
        """Per micro-batch advantages given this forward pass's per-token tensors (`entropy`,
        `logprobs`, detached) and what `prepare_minibatch` returned for its mini-batch (hook:
        AEPO's entropy-aware advantage)."""
        return advantages

    # ---- forward passes -----------------------------------------------------------------------

    def forward(
        self,
        model: Any,
        batch: RolloutBatch,
        micro: MicroBatch,
        *,
        with_entropy: bool,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs [b, width] of the response tokens (and entropy) at the rollout temperature.

        Prompts are left-padded and responses right-padded so every response starts at the same
        column; position ids skip the padding; only the response positions reach the LM head.
        """
        trajs = [batch.trajectories[r] for r in micro.rows]
        width = micro.width
        if self.share_prompts:
            logits = self._logits_sharing_prompts(model, trajs, width)
        else:
            logits = self._logits(model, trajs, width)
        targets = batch.response_ids[micro.rows, :width].to(self.accelerator.device)
        return token_logprobs(
            logits,
            targets,
            temperature=self.config.temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )

    def _logits(self, model: Any, trajs: list[Any], width: int) -> torch.Tensor:
        """Logits [b, width, vocab] predicting each response token, from one pass over
        prompt and response."""
        plen = max(len(t.prompt_ids) for t in trajs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        b = len(trajs)
        ids = torch.full((b, plen + width), pad, dtype=torch.long)
        attn = torch.zeros((b, plen + width), dtype=torch.long)
        for i, t in enumerate(trajs):
            p = len(t.prompt_ids)
            n = min(len(t.response_ids), width)
            ids[i, plen - p : plen] = torch.tensor(t.prompt_ids, dtype=torch.long)
            ids[i, plen : plen + n] = torch.tensor(t.response_ids[:n], dtype=torch.long)
            attn[i, plen - p : plen + n] = 1
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        dev = self.accelerator.device
        out = model(
            input_ids=ids.to(dev),
            attention_mask=attn.to(dev),
            position_ids=positions.to(dev),
            logits_to_keep=width + 1,
            use_cache=False,
        )
        return out.logits[:, :-1]

    def _logits_sharing_prompts(self, model: Any, trajs: list[Any], width: int) -> torch.Tensor:
        """`_logits`, with each distinct prompt run once: a group's G responses share a prompt,
        so its KV cache is computed once (with gradients) and repeated for them. Causal attention
        makes this the same computation as G full passes; the prompt tokens' share of the cost
        drops G-fold (about a third of a tiny GRPO step's training time)."""
        owner_of: dict[tuple[int, ...], int] = {}
        owners = [owner_of.setdefault(tuple(t.prompt_ids), len(owner_of)) for t in trajs]
        if len(owner_of) == len(trajs):
            return self._logits(model, trajs, width)
        prompts = list(owner_of)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        dev = self.accelerator.device
        plen = max(len(p) for p in prompts)
        p_ids = torch.full((len(prompts), plen), pad, dtype=torch.long)
        p_attn = torch.zeros((len(prompts), plen), dtype=torch.long)
        for i, p in enumerate(prompts):
            p_ids[i, plen - len(p) :] = torch.tensor(p, dtype=torch.long)
            p_attn[i, plen - len(p) :] = 1
        head = model(
            input_ids=p_ids.to(dev),
            attention_mask=p_attn.to(dev),
            position_ids=(p_attn.cumsum(-1) - 1).clamp(min=0).to(dev),
            logits_to_keep=1,
            use_cache=True,
        )
        cache = head.past_key_values
        if not all(type(layer).__name__ == "DynamicLayer" for layer in getattr(cache, "layers", [None])):
            # sliding-window or hybrid caches keep something other than every prompt position
            return self._logits(model, trajs, width)
        rows = torch.tensor(owners, device=dev)
        for layer in cache.layers:  # one copy of its prompt's keys and values per response
            layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
        b = len(trajs)
        ids = torch.full((b, width), pad, dtype=torch.long)
        r_attn = torch.zeros((b, width), dtype=torch.long)
        for i, t in enumerate(trajs):
            n = min(len(t.response_ids), width)
            ids[i, :n] = torch.tensor(t.response_ids[:n], dtype=torch.long)
            r_attn[i, :n] = 1
        starts = torch.tensor([len(t.prompt_ids) for t in trajs]).unsqueeze(1)
        out = model(
            input_ids=ids.to(dev),
            attention_mask=torch.cat([p_attn[owners], r_attn], dim=1).to(dev),
            position_ids=(starts + torch.arange(width)).to(dev),
            past_key_values=cache,
            use_cache=True,
        )
        # the prompt's last position predicts the first response token
        return torch.cat([head.logits[:, -1:][rows], out.logits[:, :-1]], dim=1)

    def micro_batches(self, rows: list[int], batch: RolloutBatch, count: int) -> list[MicroBatch]:
        """Split `rows` into exactly `count` micro-batches (ranks must agree on the count)."""
        parts = [p.tolist() for p in np.array_split(np.array(rows, dtype=np.int64), count)]
        out = []
        for part in parts:
            if part:
                lengths = [len(batch.trajectories[r].response_ids) for r in part]
                out.append(MicroBatch(rows=part, width=max(1, max(lengths))))
            else:  # fewer rows than micro-batches: a zero-weight pass keeps collectives aligned
                out.append(MicroBatch(rows=[rows[0] if rows else 0], width=1, dummy=True))
        return out

    @torch.no_grad()
    def _no_grad_pass(self, model: Any, batch: RolloutBatch, with_entropy: bool) -> tuple[torch.Tensor, Any]:
        width = batch.response_ids.shape[1]
        lps = torch.zeros(len(batch), width)
        ents = torch.zeros(len(batch), width) if with_entropy else None
        rows = list(range(len(batch)))
        size = self.config.micro_batch_size
        for start in range(0, len(rows), size):
            part = rows[start : start + size]
            w = max(1, max(len(batch.trajectories[r].response_ids) for r in part))
            lp, ent = self.forward(model, batch, MicroBatch(part, w), with_entropy=with_entropy)
            lps[part, :w] = lp.float().cpu()
            if ents is not None:
                ents[part, :w] = ent.float().cpu()
        return lps, ents

    # ---- the step -------------------------------------------------------------------------------

    def reduce_sum(self, value: torch.Tensor | float) -> torch.Tensor:
        """Sum a scalar over ranks (every rank must call it)."""
        t = torch.as_tensor(value, dtype=torch.float64, device=self.accelerator.device)
        if self.world > 1:
            t = self.accelerator.reduce(t, reduction="sum")
        return t.cpu()

    def _minibatch_rows(self, batch: RolloutBatch) -> list[list[int]]:
        """Row indices of each mini-batch: consecutive groups, in draw order."""
        order: list[int] = []
        for g in batch.group_ids.tolist():
            if g not in order:
                order.append(g)
        k = self.config.num_minibatches
        per = math.ceil(len(order) / k) if order else 0
        out = []
        for m in range(k):
            groups = set(order[m * per : (m + 1) * per])
            out.append([i for i, g in enumerate(batch.group_ids.tolist()) if g in groups])
        return out

    def train_step(self) -> dict[str, float]:
        """One RL step; returns its metrics (identical on every rank)."""
        cfg = self.config
        acc = self.accelerator
        t0 = time.perf_counter()
        model = self.model
        model.eval()
        if self.producer is not None:
            trajs, metrics = self.producer.take(self.step)
        else:
            trajs, metrics = self.collect(self.step)
        t_rollout = time.perf_counter() - t0
        health = self._check_health(trajs)
        rewards = self.shape_rewards(trajs)
        batch = RolloutBatch.from_trajectories(trajs, rewards)
        batch.advantages, batch.loss_mask = self.compute_advantages(batch)
        _record_advantages(trajs, batch.advantages, batch.loss_mask)
        metrics.update(self.rollout_metrics(batch))

        one_pass = cfg.num_minibatches == 1 and cfg.ppo_epochs == 1
        if not one_pass:  # π_old must be frozen before the first update
            batch.old_logprobs, batch.old_entropy = self._no_grad_pass(model, batch, with_entropy=False)
        if self.ref_model is not None:
            batch.ref_logprobs, _ = self._no_grad_pass(self.ref_model, batch, with_entropy=False)

        model.train()
        sums: dict[str, float] = {}
        n_updates = 0
        ga = acc.gradient_accumulation_steps
        for _ in range(cfg.ppo_epochs):
            for rows in self._minibatch_rows(batch):
                stats = self.prepare_minibatch(batch, rows)
                mask = batch.loss_mask[rows]
                n_tok = self.reduce_sum(mask.sum())
                n_seq = self.reduce_sum((mask.sum(-1) > 0).sum())
                part = self._train_minibatch(batch, rows, n_tok, n_seq, ga, stats)
                for k, v in part.items():
                    if k == "is_ratio/min":
                        sums[k] = min(sums.get(k, math.inf), v)
                    elif k == "is_ratio/max":
                        sums[k] = max(sums.get(k, -math.inf), v)
                    else:
                        sums[k] = sums.get(k, 0.0) + v
                n_updates += 1
        metrics.update(_is_ratio_metrics(sums))
        if health is not None:
            metrics.update(self._health_metrics(health, trajs))
        metrics.update({k: v / max(1, n_updates) for k, v in sums.items()})
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        self.step += 1
        self.sync_engine()
        metrics["time_rollout_s"] = t_rollout
        metrics["time_step_s"] = time.perf_counter() - t0
        if cfg.save_trajectories and acc.is_main_process:
            from algorithms.rollout.trajectory import write_jsonl

            write_jsonl(trajs, self.run_dir / "trajectories" / f"step_{self.step:06d}.jsonl")
        return metrics

    def _train_minibatch(
        self,
        batch: RolloutBatch,
        rows: list[int],
        n_tok: torch.Tensor,
        n_seq: torch.Tensor,
        ga: int,
        minibatch_stats: Any = None,
    ) -> dict[str, float]:
        cfg = self.config
        acc = self.accelerator
        model = self.model
        dev = acc.device
        kw = self.loss_kwargs()
        want_entropy = self.needs_entropy()
        entropy_grad = cfg.entropy_coeff != 0
        denoms = {"num_tokens": n_tok.to(dev), "num_seqs": n_seq.to(dev), "max_len": kw["max_len"]}
        local: dict[str, torch.Tensor] = {}

        def add(key: str, value: torch.Tensor) -> None:
            local[key] = local.get(key, 0.0) + value.detach().double().cpu()

        grad_norm = None
        ratio_min = torch.tensor(math.inf, dtype=torch.float64)
        ratio_max = torch.tensor(-math.inf, dtype=torch.float64)
        for micro in self.micro_batches(rows, batch, ga):
            with acc.accumulate(model):
                lp, ent = self.forward(
                    model, batch, micro, with_entropy=want_entropy, entropy_grad=entropy_grad
                )
                w = micro.width
                mask = batch.loss_mask[micro.rows, :w].to(dev)
                if micro.dummy:
                    mask = torch.zeros_like(mask)
                old = (
                    lp.detach() if batch.old_logprobs is None else batch.old_logprobs[micro.rows, :w].to(dev)
                )
                adv = batch.advantages
                adv = adv[micro.rows] if adv.dim() == 1 else adv[micro.rows, :w]
                extras = {"logprobs": lp.detach(), **({"entropy": ent.detach()} if ent is not None else {})}
                adv = self.adjust_advantages(batch, micro, adv.to(dev), extras, minibatch_stats)
                is_w = None
                behaviour = batch.rollout_logprobs[micro.rows, :w].to(dev)
                log_w = (old - behaviour).clamp(-20, 20) * mask
                if cfg.rollout_is == "tis":
                    is_w = log_w.exp().clamp(max=cfg.rollout_is_threshold)
                # the rollout importance ratio π_old/π_behaviour over trained tokens, before truncation
                on = mask > 0
                if bool(on.any()):
                    ratio = log_w.detach()[on].double().exp().cpu()
                    ratio_min = torch.minimum(ratio_min, ratio.min())
                    ratio_max = torch.maximum(ratio_max, ratio.max())
                    add("is_ratio/sum", ratio.sum())
                    add("is_ratio/tokens", on.sum())
                if self.health.enabled and not micro.dummy:
                    self._note_logprob_gap(micro.rows, (old - behaviour).detach().abs() * mask, mask)
                loss, m = policy_loss(lp, old, adv, mask, is_weights=is_w, **{**kw, **denoms})
                for k, v in m.items():
                    add(k, v)
                if self.ref_model is not None:
                    kl = kl_penalty(lp, batch.ref_logprobs[micro.rows, :w].to(dev), cfg.kl_estimator)
                    kl_loss = aggregate(kl, mask, cfg.loss_agg_mode, **denoms)
                    loss = loss + cfg.kl_coef * kl_loss
                    add("kl", kl_loss)
                if ent is not None:
                    if cfg.entropy_coeff != 0:
                        loss = loss - cfg.entropy_coeff * aggregate(ent, mask, cfg.loss_agg_mode, **denoms)
                    add(
                        "entropy",
                        aggregate(ent.detach(), mask, "token-mean", num_tokens=denoms["num_tokens"]),
                    )
                # mismatch between trainer and rollout engine (only meaningful where π_old was computed)
                add(
                    "rollout_mismatch_kl",
                    aggregate(-log_w, mask, "token-mean", num_tokens=denoms["num_tokens"]),
                )
                # global denominators make micro-batch losses sum to the mini-batch loss; × W undoes
                # DDP's average over ranks and × GA undoes accelerate's division by GA (§2.4)
                acc.backward(loss * self.world * ga)
                if acc.sync_gradients:
                    if cfg.max_grad_norm is not None:
                        grad_norm = acc.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    self.optimizer.step()
                    self.scheduler.step()
                    self.optimizer.zero_grad(set_to_none=True)
        keys = sorted(local)
        if keys:
            summed = self.reduce_sum(torch.stack([torch.as_tensor(local[k]) for k in keys]))
            out = {k: float(v) for k, v in zip(keys, summed, strict=True)}
        else:
            out = {}
        if self.world > 1:  # min of the ranks' minima, max of their maxima
            extremes = self.accelerator.gather(torch.stack([ratio_min, ratio_max]).to(acc.device)[None])
            ratio_min, ratio_max = extremes[:, 0].min().cpu(), extremes[:, 1].max().cpu()
        if math.isfinite(float(ratio_min)):
            out["is_ratio/min"], out["is_ratio/max"] = float(ratio_min), float(ratio_max)
        if grad_norm is not None:
            out["grad_norm"] = float(grad_norm)
        return out

    # ---- rollout health (docs/diagnostics.md) -----------------------------------------

    def _check_health(self, trajs: list[Any]) -> Any:
        """The trajectory checks of this step's rollouts, before any update (fatal mode raises
        here); the engine's record is then cleared for the next step."""
        if not self.health.enabled:
            return None
        report = self.health.check(trajs)
        if hasattr(self.engine, "forget"):
            self.engine.forget(trajs)
        self._logprob_gaps = {}
        self._health_verdict(report.faults)
        return report

    def _health_verdict(self, findings: list[Any]) -> None:
        """Warn about this rank's first failures; in fatal mode every rank raises together (one
        rank raising alone would leave the others waiting in the next collective)."""
        from algorithms.rollout.health import RolloutHealthError

        if self.health.mode == "fatal" and self.world > 1:
            total = float(self.reduce_sum(float(len(findings))))
            if total and not findings:
                raise RolloutHealthError("a rollout health check failed on another rank (its warning names it)")
        self.health.raise_or_warn(findings)

    def _note_logprob_gap(self, rows: list[int], gap: torch.Tensor, mask: torch.Tensor) -> None:
        """|π_old − π_behaviour| on the trained tokens of a micro-batch: per row its max, where,
        sum and token count (π_old is fixed within a step, so later epochs rewrite the same)."""
        worst, where = gap.max(dim=-1)
        sums, counts = gap.sum(-1), (mask > 0).sum(-1)
        for j, r in enumerate(rows):
            self._logprob_gaps[r] = (float(worst[j]), int(where[j]), float(sums[j]), float(counts[j]))

    def _health_metrics(self, report: Any, trajs: list[Any]) -> dict[str, float]:
        """`health/<check>` counts over every rank, the engine/trainer log-prob gap, the time taken."""
        from algorithms.rollout.health import CHECKS

        gaps = self._logprob_gaps
        findings = self.health.logprob_findings(trajs, {r: (g[0], g[1]) for r, g in gaps.items()})
        for f in findings:
            report.add(f)
        counts = self.reduce_sum(torch.tensor([float(report.counts[c]) for c in CHECKS]))
        out = {f"health/{c}": float(v) for c, v in zip(CHECKS, counts, strict=True)}
        total, tokens = self.reduce_sum(torch.tensor([sum(g[2] for g in gaps.values()),
                                                      sum(g[3] for g in gaps.values())]))
        worst = torch.tensor(max((g[0] for g in gaps.values()), default=0.0), dtype=torch.float64)
        if self.world > 1:
            worst = self.accelerator.gather(worst.to(self.accelerator.device)[None]).max().cpu()
        out["health/logprob_diff_mean"] = float(total / tokens) if tokens else 0.0
        out["health/logprob_diff_max"] = float(worst)
        out["health/time_ms"] = 1000 * report.seconds
        self._health_verdict(findings[:1])
        return out

    def sync_engine(self) -> None:
        """Push the updated weights into the rollout engine (and reset its prefix cache)."""
        if self.config.max_staleness:
            return publish(self)
        if self.config.engine == "hf":
            return  # it decodes with the learner's module itself
        if self.config.engine == "vllm-server":
            # One server for all ranks. Every rank joins the gather of the full weights (FSDP and
            # ZeRO-3 shard them); the main process hands them over, then all release them.
            state = self.accelerator.get_state_dict(self.model)
            if self.accelerator.is_main_process:
                self.engine.sync_weights(state, config=self.accelerator.unwrap_model(self.model).config)
            del state
            self.accelerator.wait_for_everyone()
            return
        # Colocated engines, one per rank: every rank joins the gather of the full weights, which
        # FSDP and ZeRO-3 leave on rank 0 only; rank 0 streams them to the others tensor by tensor
        # while each rank's engine loads them. Then all release them.
        from algorithms.core.weight_gather import every_rank_weights

        state = self.accelerator.get_state_dict(self.model)
        self.engine.sync_weights(every_rank_weights(state, self.accelerator.device))
        del state
        self.accelerator.wait_for_everyone()

    def evaluate(self) -> dict[str, float]:
        """Greedy episodes on the held-out tasks, split over ranks; `eval/*` means over all of them."""
        from algorithms.rollout.engine import SamplingParams
        from algorithms.rollout.health import CHECKS
        from algorithms.rollout.runner import run_episodes

        cfg = self.config
        mine = self.eval_tasks[self.rank :: self.world]
        trajs = []
        if mine:
            params = SamplingParams(temperature=0.0, max_tokens=cfg.max_response_tokens)
            self.model.eval()
            trajs = _run_coroutine(
                run_episodes(
                    self.engine,
                    self.env_factory,
                    params,
                    tasks=mine,
                    max_response_tokens=cfg.max_response_tokens,
                )
            )
        if self.health.enabled:
            self._health_verdict(self.health.check(trajs).faults)
        rows = {
            "reward_mean": [float(t.reward) for t in trajs],
            "accuracy": [float(t.components.get("correct", 0.0) or 0.0) for t in trajs],
            "protocol_valid": [float(bool(t.components.get("format_ok", False))) for t in trajs],
            "tool_calls_mean": [float(t.tool_calls) for t in trajs],
            "response_length_mean": [float(sum(t.loss_mask)) for t in trajs],
        }
        health = {f"health/{c}": [float(c in t.health) for t in trajs] for c in CHECKS}
        gathered = self._gather_lists({**rows, **health})
        out = {f"eval/{k}": float(np.mean(v)) for k, v in gathered.items() if v and k in rows}
        if self.health.enabled:
            out.update({f"eval/{k}": float(np.sum(v)) for k, v in gathered.items() if k in health})
        return out

    def rollout_metrics(self, batch: RolloutBatch) -> dict[str, float]:
        """Reward, accuracy, tool and length statistics over every rank's trajectories."""
        trajs = batch.trajectories
        gen = [float(sum(t.loss_mask)) for t in trajs]
        rows = {
            "reward": batch.rewards.tolist(),
            "env_reward": [float(t.reward) for t in trajs],
            "correct": [float(t.components.get("correct", 0.0) or 0.0) for t in trajs],
            "format_ok": [float(bool(t.components.get("format_ok", False))) for t in trajs],
            "tool_calls": [float(t.tool_calls) for t in trajs],
            "response_length": gen,
            "total_length": [float(len(t.response_ids)) for t in trajs],
            "truncated": [float(t.truncated) for t in trajs],
            "advantage": (
                batch.advantages if batch.advantages.dim() == 1 else batch.advantages[:, 0]
            ).tolist(),
        }
        gathered = self._gather_lists(rows)
        out: dict[str, float] = {"num_trajectories": float(len(gathered["reward"]))}
        for key, values in gathered.items():
            v = np.asarray(values, dtype=np.float64)
            if v.size == 0:
                continue
            out[f"{key}_mean"] = float(v.mean())
            if key in ("reward", "advantage", "response_length", "total_length"):
                out[f"{key}_std"] = float(v.std())
            if key in ("response_length", "total_length"):
                out[f"{key}_max"] = float(v.max())
        out["accuracy"] = out.pop("correct_mean", 0.0)
        out["truncation_rate"] = out.pop("truncated_mean", 0.0)
        return out

    def _gather_lists(self, rows: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if self.world == 1:
            return rows
        from accelerate.utils import gather_object

        parts = gather_object([rows])
        return {k: [x for p in parts for x in p[k]] for k in rows}

    # ---- the loop -------------------------------------------------------------------------------

    def learner_state(self) -> dict[str, Any]:
        # the producer draws prompts ahead of the learner: save the draw position of the last step taken
        sampler = self.producer.sampler_state if self.producer is not None else self.sampler.state_dict()
        return {"sampler": sampler, "algo": self.name}

    def load_learner_state(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])

    def save(self) -> Path:
        return save_checkpoint(
            self.accelerator,
            self.run_dir,
            self.step,
            self.learner_state(),
            keep_last=self.config.keep_checkpoints,
        )

    def train(self, resume: str | os.PathLike | bool | None = None) -> list[dict[str, float]]:
        """Run until `total_steps`; returns the logged metrics of the steps run here."""
        cfg = self.config
        acc = self.accelerator
        start = resolve_resume(resume, self.run_dir)
        if start is not None:
            self.load_learner_state(load_checkpoint(acc, start))
            self.sync_engine()
        self.logger = RunLogger(
            self.run_dir,
            config={"algo": self.name, **config_dict(cfg), "world_size": self.world},
            total_steps=cfg.total_steps,
            enabled=acc.is_main_process,
            tensorboard=cfg.tensorboard,
            wandb=cfg.wandb,
            wandb_project=cfg.wandb_project,
            progress=cfg.progress,
            resume_step=self.step if start is not None else None,
        )
        if acc.is_main_process:
            resolved = ", ".join(f"{k}={v!r}" for k, v in config_dict(cfg).items())
            print(f"[{self.name}] resolved config: {resolved}", flush=True)
            if start is not None:
                print(f"[{self.name}] resumed from {start} at step {self.step}", flush=True)
        history = []
        try:
            if cfg.eval_every and start is None:
                self.logger.log(0, self.evaluate())
            if cfg.max_staleness:
                self.producer = AsyncRollout(self)
                self.producer.start(self.step, cfg.total_steps)
            while self.step < cfg.total_steps:
                metrics = self.train_step()
                if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.total_steps):
                    metrics.update(self.evaluate())
                self.logger.log(self.step, metrics)
                history.append({"step": self.step, **metrics})
                if cfg.save_every and self.step % cfg.save_every == 0 and self.step < cfg.total_steps:
                    self.save()
                if self.step == 1 and metrics.get("tool_calls_mean", 1.0) == 0.0 and acc.is_main_process:
                    warnings.warn(
                        "no tool calls in the first step's rollouts: check the env's tools and stop "
                        "strings (docs/algorithms.md D23)",
                        stacklevel=2,
                    )
            if cfg.total_steps > 0:
                self.save()
            if cfg.export_model:
                self.export(self.run_dir / "final_model")
        finally:
            if self.producer is not None:
                self.producer.close()
                self.producer = None
            self.logger.close(plot=acc.is_main_process)
        return history

    def export(self, out_dir: str | os.PathLike) -> Path:
        """`save_pretrained` the policy and tokenizer (loadable by transformers and vLLM)."""
        acc = self.accelerator
        out = Path(out_dir)
        state = acc.get_state_dict(self.model)
        if acc.is_main_process:
            acc.unwrap_model(self.model).save_pretrained(out, state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(out)
        acc.wait_for_everyone()
        return out


def _record_advantages(trajs: Sequence[Any], advantages: torch.Tensor, mask: torch.Tensor) -> None:
    """Write each trajectory's advantage into it, for the saved trajectories and the viewer:
    the sequence value, or with per-token advantages (ARPO hard attribution) their mean over the
    tokens the trajectory trains (None when it trains none)."""
    for i, t in enumerate(trajs):
        if advantages.dim() == 1:
            t.advantage = float(advantages[i])
        else:
            n = float(mask[i].sum())
            t.advantage = float((advantages[i] * mask[i]).sum()) / n if n else None


def _is_ratio_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Pop the raw rollout-IS statistics of a step's mini-batches (already summed over ranks and
    micro-batches, minima and maxima already combined) and return `is_ratio/{min,mean,max}`; the
    mean is over every trained token of the step, not a mean of per-batch means."""
    total, tokens = sums.pop("is_ratio/sum", 0.0), sums.pop("is_ratio/tokens", 0.0)
    low, high = sums.pop("is_ratio/min", None), sums.pop("is_ratio/max", None)
    if not tokens or low is None or high is None:
        return {}
    return {"is_ratio/min": low, "is_ratio/mean": total / tokens, "is_ratio/max": high}


def _run_coroutine(coro: Any) -> Any:
    """Run a rollout coroutine from synchronous learner code, on the process-wide env loop (tools
    keep loop-bound resources, such as sandbox workers, across steps)."""
    from agent_envs.core.env import background_loop

    return asyncio.run_coroutine_threadsafe(coro, background_loop()).result()


__all__ = ["Learner"]
