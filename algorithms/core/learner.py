"""The RL loop shared by GRPO, DAPO, ARPO and AEPO: read this file first.

    >>> import tempfile
    >>> from algorithms.core.learner import Learner
    >>> from algorithms.core.learner_config import LearnerConfig
    >>> cfg = LearnerConfig(model="tiny", env="AgentMath-v0", total_steps=1, prompts_per_step=2,
    ...                     group_size=2, max_response_tokens=16, output_dir=tempfile.mkdtemp(),
    ...                     progress=False, tensorboard=False, export_model=False)
    >>> [metrics] = Learner(cfg).train()  # doctest: +ELLIPSIS
    [grpo] loading model ...
    [grpo] resolved config:...
    >>> metrics["num_trajectories"]
    4.0

One RL step, `Learner.train_step` (docs/algorithms.md §2.1):

1. collect: seeded prompt draws, `group_size` episodes each, rewards from the envs;
2. advantages: `compute_advantages` (GRPO's: `advantages.outcome_advantages`; per token with
   `advantage.credit: tree | turn`, `credit`);
3. loss: `ppo_epochs` passes over mini-batches of `mini_batch_prompts` prompts, in micro-batches,
   each scored by `losses.loss_and_metrics` over denominators taken once per mini-batch over every
   rank, so the loss is a true global token mean (§2.3–§2.4);
4. update: one optimizer step per mini-batch (`Learner.update`);
5. sync: the new weights go into the rollout engine.

`Learner.train` runs steps until `total_steps`, with validation, logs and checkpoints around them;
the learner is the one owner of its state (`step`, the sampler, the producer of an async run).

Beside it in `algorithms/core/`: `model_setup` (model, optimizer, engine), `schedule`, `logprobs`,
`tree_packing`, `metrics`, `health_watch`, `evaluation`, `checkpoint`, `run` (the run log and
messages), `ranks`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from agent_envs.base.config import config_dict
from algorithms.base.seeds import draw_seed, flat_group_id
from algorithms.core import model_setup as setup
from algorithms.core.advantages import outcome_advantages, pass_rate_tool_cost
from algorithms.core.async_rollout import AsyncRollout, async_engine
from algorithms.core.batch import (
    MicroBatch,
    PromptDraw,
    PromptSampler,
    RolloutBatch,
    local_share,
    micro_batches,
    minibatch_rows,
)
from algorithms.core.checkpoint import load_checkpoint, resolve_resume, save_checkpoint
from algorithms.core.credit import credit_scale, tree_credit, turn_credit
from algorithms.core.evaluation import evaluate, held_out_tasks
from algorithms.core.group_sampling import group_rollout
from algorithms.core.health_watch import HealthWatch
from algorithms.core.learner_config import LearnerConfig
from algorithms.core.logprobs import frozen_logprobs, token_logprobs
from algorithms.core.losses import LossConfig, loss_and_metrics
from algorithms.core.metrics import MinibatchMetrics, StepMetrics, record_advantages, rollout_metrics
from algorithms.core.ranks import Ranks
from algorithms.core.run import announce, open_run_log, warn_without_tool_calls
from algorithms.core.run_folder import claim_run_folder
from algorithms.core.threads import apply_threads
from algorithms.core.tree_packing import TreePacker
from algorithms.rollout.engine import SamplingParams
from algorithms.rollout.trajectory import write_jsonl


class Learner:
    """GRPO on Accelerate. An algorithm subclasses it and overrides only these hooks:

    - `rollout(draws)`: this rank's trajectories of its draws (ARPO/AEPO: the tree rollout)
    - `collect(step)`: one step's trajectories and rollout metrics (DAPO: dynamic sampling)
    - `shape_rewards(trajectories)`: the scalar reward per trajectory (DAPO: overlong shaping)
    - `compute_advantages(batch)`: advantages [B] or [B, T] and the loss mask (ARPO: attribution)
    - `needs_entropy()`: whether the training forward pass computes per-token entropy (AEPO)
    - `prepare_minibatch(batch, rows)`: statistics of a mini-batch before its micro-batches (AEPO)
    - `adjust_advantages(batch, micro, advantages, extras, stats)`: per micro-batch advantages (AEPO)

    and the class attributes `name`, `config_class` and `one_version_per_group` (tree rollouts:
    asynchronous weight syncs wait for the batch in flight, docs/scaling.md). The loss itself is
    configuration (`LossConfig.of(config)`), not a hook.
    """

    name = "grpo"
    config_class: type[LearnerConfig] = LearnerConfig
    one_version_per_group = False

    def __init__(self, config: LearnerConfig, *, accelerator: Any = None, engine: Any = None,
                 env_factory: Callable[[], Any] | None = None) -> None:  # fmt: skip
        from accelerate.utils import set_seed

        config.validate()
        self.config = cfg = config
        apply_threads(cfg.threads)
        self.accelerator = acc = accelerator or setup.make_accelerator(cfg.mixed_precision)
        self.ranks = Ranks(acc)
        self.world, self.rank = self.ranks.world, self.ranks.rank
        # G trajectories per prompt draw (tree rollouts: the budget M)
        setup.set_accumulation(acc, cfg, cfg.group_size)
        set_seed(cfg.seed + self.rank)
        self.run_dir = Path(cfg.output_dir)
        self.model, self.tokenizer, self.model_path = setup.load_policy(
            cfg.model, accelerator=acc, gradient_checkpointing=cfg.gradient_checkpointing, label=self.name,
            lora=cfg.lora)  # fmt: skip
        self.ref_model = setup.reference_model(self.model) if cfg.kl_coef > 0 else None
        self.optimizer, self.scheduler = setup.make_optimizer(self.model, cfg)
        self.model, self.optimizer, self.scheduler = acc.prepare(self.model, self.optimizer, self.scheduler)
        if self.ref_model is not None:
            self.ref_model = acc.prepare_model(self.ref_model, evaluation_mode=True)
        # the one forward pass, which chooses the packing (docs/algorithms.md, tree packing). DDP-style
        # wrappers expect one forward per backward, and gradient checkpointing turns the KV cache
        # off: sharing prompts (and packing responses) is for the single-process case
        self.packer = TreePacker(forks=cfg.packing == "tree",
                                 share_prompts=self.world == 1 and not cfg.gradient_checkpointing)
        self.env_factory = env_factory or setup.env_factory(cfg, self.tokenizer)
        self.engine = engine if engine is not None else setup.make_engine(
            cfg, path=self.model_path, tokenizer=self.tokenizer, accelerator=acc, model=self.model)  # fmt: skip
        if cfg.engine == "vllm-server":
            self.sync_engine()  # the server may hold another checkpoint: sample from this policy
        self.health, self.engine = HealthWatch.start(
            cfg, self.engine, self.env_factory, self.tokenizer, self.ranks
        )
        self.gateway = (setup.gateway_source(cfg, self.engine, algo=self.name, world=self.world)
                        if cfg.rollout_source == "gateway" else None)  # fmt: skip
        self.agents = (setup.agent_source(cfg, self.engine, self.env_factory, self.tokenizer, algo=self.name,
                                          world=self.world) if cfg.rollout_source == "agent" else None)  # fmt: skip
        self.producer: AsyncRollout | None = None  # the rollout thread while an async run trains
        num_tasks = len(self.env_factory().tasks)
        self.eval_tasks = held_out_tasks(num_tasks, cfg)
        # every prompt draw (sync, the async producer, DAPO's rounds, tree rollouts) comes from this
        # sampler, whose indices stop before the held-out tail that evaluations score on
        self.sampler = PromptSampler(num_tasks - len(self.eval_tasks), cfg.seed)
        self.step = 0
        if cfg.max_staleness:
            self.engine = async_engine(self.engine, policy=acc.unwrap_model(self.model), world=self.world,
                                       max_staleness=cfg.max_staleness, version=self.step)  # fmt: skip
        # every rollout samples with these (each episode's seed comes from its prompt draw)
        self.sampling_params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                              max_tokens=cfg.max_response_tokens, seed=cfg.seed)  # fmt: skip

    # ---- hooks, with GRPO's behaviour; then the prompt draws and the forward pass ----------------

    def rollout(self, draws: Sequence[PromptDraw]) -> list[Any]:
        """GRPO's flat group sampling (algorithms/core/group_sampling.py)."""
        cfg = self.config
        if self.agents is not None:  # an agent program plays each sample instead (docs/interop.md)
            return self.agents.rollout(draws, cfg.group_size)
        return group_rollout(
            draws, engine=self.engine, env_factory=self.env_factory, tokenizer=self.tokenizer,
            group_size=cfg.group_size, params=self.sampling_params, max_response_tokens=cfg.max_response_tokens,
        )  # fmt: skip

    def collect(self, step: int) -> tuple[list[Any], dict[str, float]]:
        if self.gateway is not None:  # rewarded sessions of agents instead (docs/interop.md)
            return self.gateway.trajectories(self.config.prompts_per_step * self.config.group_size)
        return self.rollout(self.step_draws(step)), {}

    def shape_rewards(self, trajectories: Sequence[Any]) -> torch.Tensor:
        rewards = torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32)
        if self.config.reward.tool_cost_scaling == "none" or not trajectories:
            return rewards
        def component(key: str) -> torch.Tensor:
            return torch.tensor([float(t.components.get(key, 0.0) or 0.0) for t in trajectories])
        groups = [t.group_id for t in trajectories]
        return pass_rate_tool_cost(rewards, component("tool_cost"), component("correct"), groups)

    def compute_advantages(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        over_ranks = cfg.advantage_estimator == "grpo" and cfg.scale_rewards == "batch" and self.world > 1
        every = self.ranks.gather(batch.rewards) if over_ranks else None
        adv = outcome_advantages(
            batch.rewards, batch.group_ids, estimator=cfg.advantage_estimator,
            scale_rewards=cfg.scale_rewards, eps=cfg.adv_eps, every_reward=every,
        )  # fmt: skip
        credit = cfg.advantage.credit
        if credit == "outcome":
            return adv, batch.loss_mask
        trajs = batch.trajectories
        scale = credit_scale(batch.rewards, batch.group_ids, estimator=cfg.advantage_estimator,
                             scale_rewards=cfg.scale_rewards, eps=cfg.adv_eps, every_reward=every)  # fmt: skip
        lengths = [len(t.response_ids) for t in trajs]
        if credit == "tree":  # [B, T]: per node of the tree (algorithms/core/credit.py)
            adv = tree_credit(
                adv, batch.rewards, keys=[(t.group_id, t.traj_id) for t in trajs],
                parents=[None if t.parent_id is None else (t.group_id, t.parent_id) for t in trajs],
                offsets=[t.branch_offset or 0 for t in trajs], lengths=lengths, scale=scale,
            )  # fmt: skip
        else:  # turn
            adv = turn_credit(batch.rewards, batch.group_ids.tolist(), segment_starts=[t.segment_starts for t in trajs],
                              lengths=lengths, scale=scale, leave_one_out=cfg.advantage_estimator == "rloo")  # fmt: skip
        return adv[:, : batch.loss_mask.shape[1]], batch.loss_mask

    def needs_entropy(self) -> bool:
        # any feature or metric that needs the entropy turns it on, not entropy_coeff alone (D9)
        return self.config.log_entropy or self.config.entropy_coeff != 0

    def prepare_minibatch(self, batch: RolloutBatch, rows: list[int]) -> Any:
        return None  # handed to `adjust_advantages` for each of the mini-batch's micro-batches

    def adjust_advantages(
        self,
        batch: RolloutBatch,
        micro: MicroBatch,
        advantages: torch.Tensor,
        extras: dict[str, torch.Tensor],
        minibatch_stats: Any = None,
    ) -> torch.Tensor:
        return advantages  # `extras`: this forward pass's `logprobs` and `entropy`, detached

    def draw_prompts(self, step: int, count: int, first_group: int) -> list[PromptDraw]:
        """Global prompt draws of a step, identical on every rank."""
        seed, groups = self.config.seed, range(first_group, first_group + count)
        drawn = self.sampler.draw(count)
        return [PromptDraw(i, g, draw_seed(seed, step, g)) for g, i in zip(groups, drawn, strict=True)]

    def step_draws(self, step: int) -> list[PromptDraw]:
        """This rank's prompt draws of RL step `step`."""
        cfg = self.config
        first = flat_group_id(step, 0, prompts_per_step=cfg.prompts_per_step)
        draws = self.draw_prompts(step, cfg.prompts_per_step, first)
        return local_share(draws, cfg.num_minibatches, self.rank, self.world)

    def forward(self, model: Any, batch: RolloutBatch, micro: MicroBatch, *, with_entropy: bool,
                entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        """Log-probs [b, width] of the micro-batch's response tokens (and their entropy) at the
        rollout temperature (algorithms/core/logprobs.py)."""
        trajs = [batch.trajectories[r] for r in micro.rows]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        logits = self.packer(model, trajs, micro.width, pad_id=pad, device=self.accelerator.device)
        targets = batch.response_ids[micro.rows, : micro.width].to(self.accelerator.device)
        temperature = self.config.temperature
        return token_logprobs(logits, targets, temperature=temperature, with_entropy=with_entropy,
                              entropy_grad=entropy_grad)  # fmt: skip

    # ---- the step --------------------------------------------------------------------------------

    def train_step(self) -> dict[str, float]:
        """One RL step; returns its metrics (identical on every rank)."""
        cfg, t0 = self.config, time.perf_counter()
        self.model.eval()
        # 1. collect (in asynchronous training, the batch the producer thread rolled out)
        producer = self.producer
        trajs, metrics = producer.take(self.step) if producer is not None else self.collect(self.step)
        t_rollout = time.perf_counter() - t0
        health = self.health.check_rollouts(trajs, self.engine)
        # 2. rewards and advantages
        batch = RolloutBatch.from_trajectories(trajs, self.shape_rewards(trajs))
        batch.advantages, batch.loss_mask = self.compute_advantages(batch)
        record_advantages(trajs, batch.advantages, batch.loss_mask)
        metrics.update(rollout_metrics(batch, self.ranks.gather_lists))
        # π_old is frozen before the first update, unless there is only one (on-policy shortcut)
        size = cfg.micro_batch_size
        if cfg.num_minibatches > 1 or cfg.ppo_epochs > 1:
            batch.old_logprobs, batch.old_entropy = frozen_logprobs(self.forward, self.model, batch, size)
        if self.ref_model is not None:
            batch.ref_logprobs, _ = frozen_logprobs(self.forward, self.ref_model, batch, size)
        # 3-4. loss and update: one optimizer step per mini-batch, `ppo_epochs` passes
        self.model.train()
        step = StepMetrics()
        for _ in range(cfg.ppo_epochs):
            for rows in minibatch_rows(batch, cfg.num_minibatches):
                step.add(self.update(batch, rows))
        metrics.update(step.is_ratio())
        if health is not None:
            metrics.update(self.health.step_metrics(health, trajs))
        metrics.update(step.means() | self.packer.take_metrics())
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        self.step += 1
        self.sync_engine()  # 5. sync: the engine samples the next step from the updated policy
        metrics["time_rollout_s"], metrics["time_step_s"] = t_rollout, time.perf_counter() - t0
        if cfg.save_trajectories and self.accelerator.is_main_process:
            write_jsonl(trajs, self.run_dir / "trajectories" / f"step_{self.step:06d}.jsonl")
        return metrics

    def update(self, batch: RolloutBatch, rows: list[int]) -> dict[str, float]:
        """One optimizer step on the mini-batch `rows`, accumulated over micro-batches; returns its
        metrics summed over micro-batches and ranks."""
        cfg, acc, dev = self.config, self.accelerator, self.accelerator.device
        stats = self.prepare_minibatch(batch, rows)
        mask = batch.loss_mask[rows]
        n_tok, n_seq = self.ranks.sum(mask.sum()).to(dev), self.ranks.sum((mask.sum(-1) > 0).sum()).to(dev)
        loss_config, want_entropy = LossConfig.of(cfg), self.needs_entropy()
        ga = acc.gradient_accumulation_steps
        metrics, grad_norm = MinibatchMetrics(), None
        for micro in micro_batches(batch, rows, ga):
            with acc.accumulate(self.model):
                lp, ent = self.forward(self.model, batch, micro, with_entropy=want_entropy,
                                       entropy_grad=cfg.entropy_coeff != 0)  # fmt: skip
                inputs = batch.loss_inputs(micro, lp, num_tokens=n_tok, num_seqs=n_seq, device=dev)
                extras = {"logprobs": lp.detach(), **({"entropy": ent.detach()} if ent is not None else {})}
                inputs.advantages = self.adjust_advantages(batch, micro, inputs.advantages, extras, stats)
                if self.health.enabled and not micro.dummy:
                    self.health.note_gap(micro.rows, inputs)
                loss, part = loss_and_metrics(inputs, lp, loss_config, entropy=ent)
                metrics.add(part)
                # global denominators make micro-batch losses sum to the mini-batch loss; × W undoes
                # DDP's average over ranks and × GA undoes accelerate's division by GA (§2.4)
                acc.backward(loss * self.world * ga)
                if acc.sync_gradients:
                    if cfg.max_grad_norm is not None:
                        grad_norm = acc.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                    self.optimizer.step()
                    self.scheduler.step()
                    self.optimizer.zero_grad(set_to_none=True)
        return metrics.reduce(self.ranks, grad_norm)

    def sync_engine(self) -> None:
        """Push the updated weights into the rollout engine (and reset its prefix cache)."""
        if self.config.max_staleness:  # the versioned engine of an async run: the weights are version `step`
            return self.engine.sync_weights(self.accelerator.unwrap_model(self.model), version=self.step)
        setup.push_weights(self.accelerator, self.model, self.engine, self.config.engine)

    # ---- the run ---------------------------------------------------------------------------------

    def train(self, resume: str | os.PathLike | bool | None = None, overwrite: bool = False) -> list[dict[str, float]]:
        """Run steps until `total_steps`; returns the logged metrics of the steps run here
        (collective: every rank calls it). Resume from a checkpoint when asked (docs/training.md,
        Resume), validate before the first step, every `eval_every` steps and at the end, log every
        step, checkpoint every `save_every` steps and at the end, and export the final policy to
        `<output_dir>/final_model`. An `output_dir` that holds another run is refused unless
        `resume` continues it (with the same config) or `overwrite` removes it (run_folder.py)."""
        cfg, acc = self.config, self.accelerator
        claim_run_folder(self.run_dir, "train", config=self.run_config(), resume=bool(resume), overwrite=overwrite)
        # every rank looks at the folder before any rank writes into it: a rank that looked after the
        # main one wrote config.json would take this very run for another one
        acc.wait_for_everyone()
        start = resolve_resume(resume, self.run_dir)
        if start is not None:
            state = load_checkpoint(acc, start)
            self.step = int(state["step"])
            self.sampler.load_state_dict(state["sampler"])
            self.sync_engine()
        logger = open_run_log(cfg, self.run_dir, run_config=self.run_config(), world=self.world,
                              enabled=acc.is_main_process, resume_step=self.step if start is not None else None)  # fmt: skip
        if acc.is_main_process:
            announce(self.name, cfg, run_dir=self.run_dir, resume=resume, start=start, step=self.step)
        history = []
        try:
            if cfg.eval_every and start is None:
                logger.log(0, self.validate())
            if cfg.max_staleness:
                self.producer = AsyncRollout(
                    self.engine, self.collect, self.sampler, max_staleness=cfg.max_staleness,
                    drop=cfg.partial_rollouts == "drop", whole_batches=self.one_version_per_group,
                )  # fmt: skip
                self.producer.start(self.step, cfg.total_steps)
            while self.step < cfg.total_steps:
                metrics = self.train_step()
                if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.total_steps):
                    metrics.update(self.validate())
                logger.log(self.step, metrics)
                history.append({"step": self.step, **metrics})
                if cfg.save_every and self.step % cfg.save_every == 0 and self.step < cfg.total_steps:
                    self.save()
                if self.step == 1 and acc.is_main_process:
                    warn_without_tool_calls(metrics)
            if cfg.total_steps > 0:
                self.save()
            if cfg.export_model:
                setup.export_policy(acc, self.model, self.tokenizer, self.run_dir / "final_model")
        finally:
            if self.producer is not None:
                self.producer.close()
                self.producer = None
            logger.close(plot=acc.is_main_process)
        return history

    def run_config(self) -> dict[str, Any]:
        """What `config.json` records and a resumed run must match: the algorithm and its resolved config."""
        return {"algo": self.name, **config_dict(self.config)}

    def validate(self) -> dict[str, float]:
        """Greedy episodes on the held-out tasks (algorithms/core/evaluation.py)."""
        return evaluate(model=self.model, engine=self.engine, env_factory=self.env_factory, tasks=self.eval_tasks,
                        max_response_tokens=self.config.max_response_tokens, health=self.health, ranks=self.ranks)  # fmt: skip

    def save(self) -> Path:
        """Checkpoint at this step (collective; docs/training.md, Reliability)."""
        # the producer draws prompts ahead of the learner: save the draw position of the last step taken
        sampler = self.producer.sampler_state if self.producer is not None else self.sampler.state_dict()
        state = {"sampler": sampler, "algo": self.name}
        return save_checkpoint(self.accelerator, self.run_dir, self.step, state, keep_last=self.config.keep_checkpoints)


__all__ = ["Learner"]
