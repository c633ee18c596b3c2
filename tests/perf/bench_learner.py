"""One GRPO learner step: ours vs TRL's GRPOTrainer, same tiny model, batch and lengths, one run.

    OMP_NUM_THREADS=1 python tests/perf/bench_learner.py            # prints the per-step ratio

Both sides do the same work per step: sample G = 8 completions of at most L = 64 tokens for each
of B = 4 prompts from the tiny model at T = 1 (no top-k/top-p), score them, compute group
advantages and take one optimizer step (token-mean loss, β = 0, one mini-batch, one epoch).
Ours runs the real `Learner.train_step` with the HF engine over a tool-less `ToolEnv` (the same
rendered prompts); TRL runs `GRPOTrainer` (transformers `generate`, no vLLM) on the same prompt
strings. Single steps alternate A, B, A, B (8 each); the ratio is of median step times (target <= 1.0).
Rewards on both sides are trivial to compute (exact match; a length rule), so the comparison is of
the learners, not of graders.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
warnings.filterwarnings("ignore")

import torch  # noqa: E402

torch.set_num_threads(1)

B, G, L = 4, 8, 64
STEPS_PER_BLOCK, BLOCKS = 1, 8
QUESTIONS = [f"What is {a} * {b}?" for a, b in ((12, 34), (56, 78), (91, 23), (45, 67), (89, 10), (11, 21))]


def build_ours(model_path: str, out: str):
    from agent_envs.base.task import Task
    from agent_envs.core.env import ToolEnv
    from algorithms.core.learner import Learner
    from algorithms.core.learner_config import LearnerConfig

    tasks = [Task(id=f"q{i}", question=q, answers=["0"], reward="exact") for i, q in enumerate(QUESTIONS)]
    cfg = LearnerConfig(
        model=model_path, output_dir=out, prompts_per_step=B, group_size=G, max_response_tokens=L,
        micro_batch_size=B * G, lr=1e-6, total_steps=10_000, progress=False, tensorboard=False,
        export_model=False, log_entropy=False, eval_episodes=0,  # 6 questions: none to hold out
    )  # fmt: skip
    holder = {}

    def make_env():
        return ToolEnv(tasks, [], tokenizer=holder["tok"], max_response_tokens=L, max_response_chars=1 << 20)

    import transformers

    holder["tok"] = transformers.AutoTokenizer.from_pretrained(model_path)
    learner = Learner(cfg, env_factory=make_env)
    prompts = [make_env().reset(options={"index": i})[0] for i in range(len(tasks))]
    return learner, prompts


def build_trl(model_path: str, prompts: list[str], out: str, times: list[float]):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    tok = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    data = Dataset.from_dict({"prompt": [prompts[i % len(prompts)] for i in range(10_000)]})
    args = GRPOConfig(
        output_dir=out, per_device_train_batch_size=B * G, num_generations=G, max_completion_length=L,
        learning_rate=1e-6, beta=0.0, loss_type="dapo", temperature=1.0, top_k=0, top_p=1.0,
        use_cpu=True, report_to="none", save_strategy="no", logging_steps=1000, max_steps=STEPS_PER_BLOCK,
        disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    return GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [float(len(c) % 3) for c in completions],
        args=args,
        train_dataset=data,
        processing_class=tok,
        callbacks=[StepTimer()],
    )


def main() -> None:
    from algorithms.models.tiny import build_tiny_model

    model_path = str(build_tiny_model(seed=0))
    tmp = tempfile.mkdtemp()
    ours, prompts = build_ours(model_path, f"{tmp}/ours")
    trl_times: list[float] = []
    trainer = build_trl(model_path, prompts, f"{tmp}/trl", trl_times)
    ours_times: list[float] = []
    gen_lengths: list[float] = []
    from rich.progress import track

    for _ in track(range(BLOCKS), description="A/B blocks"):
        trainer.train()  # A: STEPS_PER_BLOCK TRL steps (a fresh optimizer each block; not timed)
        for _ in range(STEPS_PER_BLOCK):  # B: ours
            t = time.perf_counter()
            m = ours.train_step()
            ours_times.append(time.perf_counter() - t)
            gen_lengths.append(m["response_length_mean"])
    # the first step of each side pays one-off warm-up costs
    t_trl = statistics.median(trl_times[1:])
    t_ours = statistics.median(ours_times[1:])
    print(f"B={B} prompts x G={G} completions, max {L} tokens, tiny model, 1 thread")
    print(f"ours: mean generated length {statistics.mean(gen_lengths):.1f} tokens")
    print(f"TRL GRPOTrainer step: median {t_trl:.3f} s over {len(trl_times) - 1} steps")
    print(f"ours Learner.train_step: median {t_ours:.3f} s over {len(ours_times) - 1} steps")
    print(f"ratio ours/TRL = {t_ours / t_trl:.2f}  (target <= 1.0)")


if __name__ == "__main__":
    main()
