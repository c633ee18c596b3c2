"""`LearnerConfig`: every knob of the shared RL loop, typed, with its help text.

Defaults are GRPO's (docs/algorithms.md §3.3); each algorithm's config subclasses it and changes
defaults or adds keys; presets live in configs/. `agent-envs train --algo X --help` prints every
key with its type, default and help.

    >>> cfg = LearnerConfig(prompts_per_step=8, mini_batch_prompts=4)
    >>> cfg.validate(); cfg.num_minibatches
    2
    >>> LearnerConfig(lr_schedule="linear").validate()
    Traceback (most recent call last):
    ...
    ValueError: config field 'lr_schedule' must be one of ['constant', 'cosine'], got 'linear'
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Literal

from agent_envs.base.config import check_types, option, require
from algorithms.core.threads import THREADS_HELP, Threads, choose_threads
from algorithms.models.lora import LoRAConfig

Engine = Literal["hf", "vllm", "vllm-server"]
AdvantageEstimator = Literal["grpo", "rloo"]
ScaleRewards = Literal["group", "batch", "none"]
PolicyLoss = Literal["ppo_clip", "ppo_clip_gradpreserve"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KLEstimator = Literal["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k1+", "k3+", "low_var_kl+"]
Credit = Literal["outcome", "tree", "turn"]


@dataclass
class AdvantageConfig:
    """How an outcome advantage is spread over a trajectory's tokens (a learner's `advantage` field:
    `advantage.credit=tree` on the command line; formulas in docs/algorithms.md §11.1)."""

    credit: Credit = option(
        "outcome", "outcome: every token gets its trajectory's advantage; tree (arpo, aepo): plus the "
        "value gain of its node over the branch point before it; turn (grpo, dapo): per turn, against "
        "the group's trajectories that reached that turn")


@dataclass
class RewardConfig:
    """The learner's step on the env's rewards (a learner's `reward` field). The per-call tool cost
    itself is the env's (`env_kwargs.reward_kwargs.tool_cost`, logged as the `tool_cost`
    component); scaling it needs the whole group, so it is here (docs/algorithms.md §11.2)."""

    tool_cost_scaling: Literal["none", "pass_rate"] = option(
        "none", "none: the env's tool cost as charged; pass_rate: multiplied by the group's pass rate "
        "(mean `correct`), so a group that never solves its task pays nothing for trying tools")


@dataclass
class AgentConfig:
    """The program `rollout_source: agent` runs once per sample (a learner's `agent` field:
    `agent.command='python my_agent.py'`; the contract it is run under: docs/interop.md)."""

    command: str = option("", "the agent program's command line (shell-quoted; run without a shell)")
    answer: Literal["message", "stdout"] = option(
        "message", "message: the last assistant message of its session; stdout: what it prints")
    timeout_s: float = option(300.0, "a run past this many seconds is killed, with its processes, and fails")
    concurrency: int = option(4, "agent runs at once")
    failure_reward: float = option(0.0, "reward of a failed run (crash, timeout, no model call, no answer)")
    max_output_bytes: int = option(1 << 20, "stdout kept per run; answer: stdout fails a run that prints more")
    env: dict = option(factory=dict, help="extra environment variables of every run")

    def validate(self) -> None:
        check_types(self, "agent.")
        require(math.isfinite(self.timeout_s) and self.timeout_s > 0, "agent.timeout_s", "must be > 0", self.timeout_s)
        require(self.concurrency >= 1, "agent.concurrency", "must be >= 1", self.concurrency)
        require(math.isfinite(self.failure_reward), "agent.failure_reward", "must be finite", self.failure_reward)
        require(self.max_output_bytes >= 1, "agent.max_output_bytes", "must be >= 1", self.max_output_bytes)


@dataclass
class LearnerConfig:
    """Every knob of the shared loop; cross-field rules are in `validate()`."""

    # what to train, where
    model: str = option("tiny", 'a named model ("tiny": built locally, "smollm2": SmolLM2-135M-Instruct), '
                        "an HF checkpoint dir or a hub id")
    lora: LoRAConfig = option(factory=LoRAConfig, help="LoRA adapters instead of full fine-tuning (lora.enabled=true)")
    env: str = option("AgentMath-v0", "a registered gymnasium env id")
    env_kwargs: dict = option(factory=dict, help="keyword arguments of gymnasium.make (dotted keys reach in)")
    engine: Engine = option(
        "hf", "rollout engine: hf (shares the learner's weights), vllm (in-process) or vllm-server "
        "(`agent-envs serve-rollout`; engine_kwargs: base_url, sync_dir)")
    engine_kwargs: dict = option(factory=dict, help="keyword arguments of the rollout engine")
    output_dir: str = option("runs/grpo", "run directory: checkpoints, logs, final model")
    seed: int = option(0, "seed of prompt order, rollout sampling and initialisation")
    threads: Threads = option("auto", THREADS_HELP)
    # rollout
    total_steps: int = option(100, "RL steps")
    prompts_per_step: int = option(4, "prompt draws per RL step, over all ranks")
    group_size: int = option(8, "G: responses per prompt (ARPO/AEPO: the tree budget M)")
    max_response_tokens: int = option(256, "per episode, model and tool tokens together")
    rollout_source: Literal["envs", "gateway", "agent"] = option(
        "envs", "envs: the learner rolls out its env; gateway: rewarded sessions of agents calling the "
        "OpenAI-compatible endpoint it serves on gateway_port; agent: agent.command run per sample on "
        "the env's task, graded by the env (docs/interop.md)")
    agent: AgentConfig = option(factory=AgentConfig, help="rollout_source=agent: the program and its limits")
    gateway_port: int = option(8200, "rollout_source=gateway: port of the endpoint, on 127.0.0.1")
    gateway_timeout_s: float | None = option(
        None, "rollout_source=gateway: how long a step waits for its sessions (null: no limit)")
    temperature: float = option(1.0, "rollout sampling temperature (the trainer scales logits by it)")
    top_p: float = option(1.0, "nucleus sampling mass")
    top_k: int = option(-1, "top-k sampling (-1: off)")
    # optimisation
    mini_batch_prompts: int | None = option(None, "prompts per optimizer step (null: the whole RL step)")
    ppo_epochs: int = option(1, "passes over each RL step's batch")
    micro_batch_size: int = option(8, "sequences per forward/backward on one rank")
    packing: Literal["flat", "tree"] = option(
        "flat", "flat: each sequence computed whole; tree: a micro-batch packed with each shared prompt "
        "and fork prefix computed once (same log-probs, loss and gradients; docs/algorithms.md)")
    lr: float = option(1e-6, "AdamW learning rate")
    weight_decay: float = option(0.01, "AdamW weight decay")
    adam_betas: tuple[float, float] = option((0.9, 0.999), "AdamW betas")
    lr_schedule: Literal["constant", "cosine"] = option("constant", "over all optimizer steps")
    warmup_steps: int = option(0, "optimizer steps of linear warm-up")
    min_lr_ratio: float = option(0.0, "cosine floor, as a fraction of lr")
    max_grad_norm: float | None = option(1.0, "gradient clipping norm (null: no clipping)")
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = option(
        "auto", "auto: bf16 where the GPU supports it, else no"
    )
    gradient_checkpointing: bool = option(False, "recompute activations in backward to save memory")
    # advantages and loss
    advantage_estimator: AdvantageEstimator = option("grpo", "outcome advantage: grpo or rloo")
    scale_rewards: ScaleRewards = option("group", "advantage std: per group, per batch, or none (Dr. GRPO)")
    adv_eps: float = option(1e-6, "added to the std of the advantage normalisation")
    advantage: AdvantageConfig = option(
        factory=AdvantageConfig, help="per-token credit: outcome, tree or turn (advantage.credit=tree)")
    reward: RewardConfig = option(
        factory=RewardConfig, help="the learner's step on the env's rewards (reward.tool_cost_scaling=pass_rate)")
    policy_loss: PolicyLoss = option(
        "ppo_clip", "ppo_clip, or ppo_clip_gradpreserve (scaled gradient above the upper clip, AEPO)"
    )
    clip_ratio_low: float = option(0.2, "ε_low of the PPO clip")
    clip_ratio_high: float = option(0.2, "ε_high of the PPO clip")
    clip_ratio_c: float | None = option(3.0, "dual-clip bound c (null: off)")
    loss_agg_mode: LossAggMode = option("token-mean", "how token losses aggregate (docs/algorithms.md §2.3)")
    loss_scale_len: int | None = option(
        None, "L_const of seq-mean-token-sum-norm (null: max_response_tokens)"
    )
    kl_coef: float = option(0.0, "KL penalty weight (0: no reference model is loaded or run)")
    kl_estimator: KLEstimator = option("low_var_kl", "KL estimator of the penalty")
    entropy_coeff: float = option(0.0, "entropy bonus weight")
    log_entropy: bool = option(True, "log the training forward pass's entropy as a metric")
    rollout_is: Literal["none", "tis"] = option(
        "none", "rollout importance correction: none or tis (token-level truncated IS)"
    )
    rollout_is_threshold: float = option(2.0, "TIS truncation C")
    # rollout health checks (docs/diagnostics.md)
    health_checks: Literal["warn", "fatal", "off"] = option(
        "warn", "check every batch (prefix, loss mask, truncation, reward, log-probs): warn, fatal or off"
    )
    health_logprob_tol: float = option(
        1.0, "the logprob check fails when |engine - trainer| on a trained token exceeds this (nats)"
    )
    # asynchronous training (docs/scaling.md)
    max_staleness: int = option(
        0, "policy versions a trained token may lag the trained weights; > 0 generates the next "
        "step's rollouts while this step updates (0: synchronous)"
    )
    partial_rollouts: Literal["continue", "drop"] = option(
        "continue", "async: episodes in flight at a weight sync go on under the new weights "
        "(continue) or their groups are dropped (drop)"
    )
    # logging and checkpoints
    save_every: int = option(0, "RL steps between checkpoints (0: only at the end)")
    keep_checkpoints: int = option(2, "newest checkpoints kept")
    tensorboard: bool = option(True, "write TensorBoard logs")
    wandb: bool = option(False, "log to Weights & Biases")
    wandb_project: str = option("agent-envs", "Weights & Biases project")
    progress: bool = option(True, "show a progress bar")
    save_trajectories: bool = option(False, "write each step's trajectories to <output_dir>/trajectories/")
    # held-out tasks (never drawn for training) and validation on them: greedy, one episode each, eval/*
    eval_every: int = option(0, "RL steps between greedy validations (0: off)")
    eval_episodes: int = option(
        32, "the env's last tasks, never drawn for training (also with eval_every: 0) and validated on; "
        "0 holds nothing out (only with eval_every: 0)"
    )
    export_model: bool = option(True, "save_pretrained the final policy to <output_dir>/final_model")

    def validate(self) -> None:
        check_types(self)

        def need(ok: bool, key: str, what: str) -> None:
            if not ok:
                raise ValueError(f"config field {key!r}: {what}, got {getattr(self, key)!r}")

        need(self.total_steps >= 0, "total_steps", "must be >= 0")
        need(self.prompts_per_step >= 1, "prompts_per_step", "must be >= 1")
        need(self.group_size >= 1, "group_size", "must be >= 1")
        need(self.max_response_tokens >= 1, "max_response_tokens", "must be >= 1")
        need(self.temperature > 0, "temperature", "must be > 0 for training rollouts")
        need(self.ppo_epochs >= 1, "ppo_epochs", "must be >= 1")
        need(self.micro_batch_size >= 1, "micro_batch_size", "must be >= 1")
        mb = self.mini_batch_prompts or self.prompts_per_step
        need(
            self.prompts_per_step % mb == 0,
            "mini_batch_prompts",
            f"must divide prompts_per_step={self.prompts_per_step}",
        )
        need(self.kl_coef >= 0, "kl_coef", "must be >= 0")
        need(self.health_logprob_tol > 0, "health_logprob_tol", "must be > 0")
        need(self.clip_ratio_c is None or self.clip_ratio_c > 1, "clip_ratio_c", "must be > 1 or null")
        need(self.max_staleness >= 0, "max_staleness", "must be >= 0")
        need(
            not self.max_staleness or self.rollout_is != "none",
            "rollout_is",
            f"asynchronous training (max_staleness={self.max_staleness}) trains on older policies' "
            "samples and needs the off-policy correction: set rollout_is: tis",
        )
        need(self.save_every >= 0, "save_every", "must be >= 0")
        need(self.rollout_source == "envs" or (self.engine == "hf" and not self.max_staleness), "rollout_source",
             "gateway sessions are sampled by the learner's own module: it needs engine: hf and max_staleness: 0")
        require(self.rollout_source != "agent" or bool(self.agent.command.strip()), "agent.command",
                "must name the program that rollout_source: agent runs (agent.command='python my_agent.py')",
                self.agent.command)
        self.agent.validate()
        need(self.eval_every >= 0, "eval_every", "must be >= 0")
        need(self.eval_episodes >= 0, "eval_episodes", "must be >= 0")
        need(self.eval_episodes >= 1 or not self.eval_every, "eval_episodes",
             f"must be >= 1 when validation is on (eval_every={self.eval_every})")
        tree = any(f.name == "tree" for f in dataclasses.fields(self))  # the tree rollouts' learners have one
        require(self.advantage.credit != "tree" or tree, "advantage.credit",
                "tree needs tree rollouts (--algo arpo or aepo); flat groups have turn", self.advantage.credit)
        require(self.advantage.credit != "turn" or not tree, "advantage.credit",
                "turn is for flat groups (grpo, dapo); tree rollouts have tree", self.advantage.credit)
        choose_threads(self.threads, cores=1, load=0.0)  # raises on a bad value, naming the field
        # the engine samples from the truncated distribution, but `forward` recomputes log-probs
        # of the full softmax at T: the PPO ratio and IS weights are then biased
        for key, truncates in (("top_p", self.top_p < 1), ("top_k", self.top_k > 0)):
            if truncates:
                warnings.warn(
                    f"config field {key!r}={getattr(self, key)!r}: the trainer applies only the "
                    "temperature to its log-probs, not top_p/top_k, so they differ from the rollout "
                    "engine's; set top_p: 1.0 and top_k: -1 for on-policy ratios",
                    stacklevel=2,
                )

    @property
    def num_minibatches(self) -> int:
        return self.prompts_per_step // (self.mini_batch_prompts or self.prompts_per_step)


__all__ = [
    "AdvantageConfig",
    "AgentConfig",
    "AdvantageEstimator",
    "Credit",
    "Engine",
    "KLEstimator",
    "LearnerConfig",
    "LossAggMode",
    "PolicyLoss",
    "RewardConfig",
    "ScaleRewards",
]
