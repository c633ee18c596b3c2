"""Learner step on ARPO batches: `packing: tree` against flat, on the same batches, in one process.

    OMP_NUM_THREADS=1 python tests/perf/bench_tree_packing.py [--batches 4] [--rounds 3]
        [--model DIR] [--micro-batch-size 16] [--budget 192] [--env-kwargs JSON] [--lora-r 16]

An ARPO learner (the tiny warmed model by default, AgentMath-v0 with the python sandbox, M = 8
trajectories per prompt from N = 2 initial paths with Z = 2, 2 prompts per step) rolls out
`--batches` batches once. Then three forward passes update the learner on the same batches, in
turn, each from the same saved weights and optimizer state: A = flat sequences (every token of
every trajectory computed, as with several processes), A' = flat with each prompt computed once
through its KV cache (the single-process default), B = `packing: tree` (prompts and fork
prefixes once, the rest packed into rows under a tree attention mask). The time is the learner
step without the rollout (forward, backward, optimizer step). Printed: the median step time of
each, B/A and B/A', `tree_token_ratio` (packed ÷ flat tokens) and the forks per prompt in the
batches (the rest of each group are fresh paths). One thread. A `--model` other than the tiny
one reads the env's own system prompt (the tiny model's warm-up prompt is for the tiny model
only); `--env-kwargs` and `--lora-r` give the env and adapters its run used, e.g. for the SmolLM2
SFT checkpoint (configs/base/smollm2.yaml; micro-batches of 8, as there: 16 took 12 GB and met
the out-of-memory killer):

    OMP_NUM_THREADS=1 python tests/perf/bench_tree_packing.py --model runs/sft_smollm2/final_model \\
        --batches 2 --rounds 2 --budget 128 --lora-r 16 --micro-batch-size 8 \\
        --env-kwargs '{"world": {"easy_fraction": 0.25, "teacher_shortcut": 0.4, "teacher_needless_tool": 0.2}}'
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402


def main() -> None:
    from algorithms.arpo import ARPOConfig, ARPOLearner
    from algorithms.core.batch import RolloutBatch, minibatch_rows
    from algorithms.core.logprobs import frozen_logprobs
    from algorithms.core.tree_packing import TreePacker
    from algorithms.models.lora import LoRAConfig
    from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT, build_tiny_model
    from algorithms.rollout.tree_config import TreeConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", default=None, help="default: the warmed tiny model")
    p.add_argument("--micro-batch-size", type=int, default=16)
    p.add_argument("--budget", type=int, default=192, help="response tokens per episode")
    p.add_argument("--env-kwargs", type=json.loads, default=None,
                   help="JSON keyword arguments of the env (default: the tiny model's warm-up system prompt)")
    p.add_argument("--lora-r", type=int, default=0, help="train LoRA adapters of this rank (0: full model)")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = args.model or str(build_tiny_model(seed=0, warmup_steps=150))
    env_kwargs = args.env_kwargs
    if env_kwargs is None:
        env_kwargs = {} if args.model else {"system_prompt": WARMUP_SYSTEM_PROMPT}
    cfg = ARPOConfig(model=model, env="AgentMath-v0", env_kwargs=env_kwargs,
                     lora=LoRAConfig(enabled=args.lora_r > 0, r=max(args.lora_r, 1)),
                     engine="hf", prompts_per_step=2, group_size=8, max_response_tokens=args.budget,
                     micro_batch_size=args.micro_batch_size, tree=TreeConfig(initial_rollouts=2, beam_size=2),
                     output_dir=tempfile.mkdtemp(), progress=False, tensorboard=False, threads=1,
                     health_checks="off", export_model=False)
    learner = ARPOLearner(cfg)
    batches, forks = [], []
    for step in range(args.batches):
        trajs, metrics = learner.collect(step)
        forks.append(metrics.get("rollout/forks_per_prompt", 0.0))
        batch = RolloutBatch.from_trajectories(trajs, learner.shape_rewards(trajs))
        batch.advantages, batch.loss_mask = learner.compute_advantages(batch)
        batches.append(batch)
    saved = (copy.deepcopy(learner.model.state_dict()), copy.deepcopy(learner.optimizer.state_dict()))

    def step_time(packer: TreePacker) -> tuple[float, float]:
        learner.packer = packer
        total = 0.0
        for batch in batches:
            learner.model.load_state_dict(saved[0])
            learner.optimizer.load_state_dict(saved[1])
            learner.model.train()
            start = time.process_time()
            if cfg.num_minibatches > 1 or cfg.ppo_epochs > 1:  # as train_step does
                batch.old_logprobs, batch.old_entropy = frozen_logprobs(learner.forward, learner.model, batch,
                                                                        cfg.micro_batch_size)
            for rows in minibatch_rows(batch, cfg.num_minibatches):
                learner.update(batch, rows)
            total += time.process_time() - start
        ratio = packer.take_metrics().get("tree_token_ratio", 1.0)
        return total / len(batches), ratio

    plain, flat, tree, ratios = [], [], [], []
    for r in range(args.rounds):
        plain.append(step_time(TreePacker(forks=False, share_prompts=False))[0])
        flat.append(step_time(TreePacker(forks=False))[0])
        seconds, ratio = step_time(TreePacker())
        tree.append(seconds)
        ratios.append(ratio)
        print(f"round {r + 1}: flat {plain[-1]:.3f} s, flat with shared prompts {flat[-1]:.3f} s, tree "
              f"{tree[-1]:.3f} s a step; tree_token_ratio {ratio:.3f}", flush=True)
    a, a2, b = statistics.median(plain), statistics.median(flat), statistics.median(tree)
    print(f"learner step on ARPO batches (median of {args.rounds} rounds, process CPU, 1 thread): flat {a:.3f} s, "
          f"flat with shared prompts {a2:.3f} s, tree {b:.3f} s; B/A {b / a:.2f}, B/A' {b / a2:.2f}; "
          f"tree_token_ratio {statistics.median(ratios):.3f}; forks per prompt {statistics.fmean(forks):.2f} "
          f"of {cfg.group_size - cfg.tree.initial_rollouts} possible")


if __name__ == "__main__":
    main()
