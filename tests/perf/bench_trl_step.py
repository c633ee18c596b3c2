"""Our GRPO step against TRL's GRPOTrainer on the same work, SmolLM2-135M-Instruct on the CPU.

    python tests/perf/bench_trl_step.py [--threads 2] [--rounds 3] [--micro 8] [--tokens 256]
        [--engine ENGINE] [--no-trl]

The work, on both sides: 4 prompts x 4 completions of at most `--tokens` tokens at T = 1 (no top-k,
no top-p), LoRA r 16 (alpha 32) on every attention and MLP projection, micro-batches of `--micro`
rows, one optimizer step. Ours is `GRPOLearner.train_step` built from configs/grpo_smollm2.yaml
(its engine and settings: the path users run) on the base SmolLM2 folder; TRL's is
`GRPOTrainer` (pinned as in tests/interop/test_trl_grpo.py, in its own venv) on the same prompts:
the AgentMath-v0 prompts our learner draws, as chat-formatted text, scored by the same env.

Each side is a worker process that loads once and then runs one step per request, so the two
never compute at the same time: a warm-up step each, then `--rounds` rounds that alternate which
side goes first, every process at `--threads` threads. Printed per round and as medians: the step
time of each side and their ratio, the ratio per 1,000 generated tokens, each side's split
between generation (ours: `time_rollout_s`; TRL: `_generate_and_score_completions`) and the
update; and our two parts against their own limits, measured right after each of our steps:

* generation against the bare engine: the same engine generating the step's prompts, every row
  exactly as many tokens as its trajectory's model tokens (EOS ignored), in one batch;
* the update against a bare LoRA forward + backward + AdamW of the step's trajectories, each
  distinct prompt once per micro-batch (`bench_real_model.shared_prompt_train_pass`).

Targets (docs/benchmarks.md): step <= 0.5x TRL's; generation <= 1.2x bare; update <= 1.2x bare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULT = "RESULT "  # prefix of a worker's answer line: engines print their own lines on stdout


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads of each side")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up step")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4, help="completions per prompt")
    ap.add_argument("--tokens", type=int, default=256, help="max completion tokens")
    ap.add_argument("--micro", type=int, default=8, help="rows per forward/backward on both sides")
    ap.add_argument("--engine", default=None, help="our rollout engine (default: the preset's)")
    ap.add_argument("--no-trl", action="store_true", help="our side only (with its limits)")
    ap.add_argument("--worker", choices=("ours", "trl"), help=argparse.SUPPRESS)
    ap.add_argument("--prompts-file", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def answer(obj: dict) -> None:
    print(RESULT + json.dumps(obj), flush=True)


def give_back_memory() -> None:
    """Return freed heap to the system after a step: the idle side keeps only what it holds, so
    both fit in memory beside each other (glibc keeps freed activations otherwise)."""
    import contextlib
    import ctypes

    with contextlib.suppress(OSError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def requests() -> Any:
    """The driver's requests, one line each, until it closes stdin or says stop."""
    for line in sys.stdin:
        if line.strip() == "stop":
            return
        yield line.strip()


# ---- our side ------------------------------------------------------------------------------------


def run_ours(args: argparse.Namespace) -> None:
    import torch

    from agent_envs.base.config import build_config
    from algorithms.base.presets import presets_dir
    from algorithms.grpo import GRPOConfig, GRPOLearner
    from algorithms.models.lora import wrap_lora
    from algorithms.models.resolve import resolve_model

    threads = os.environ["OMP_NUM_THREADS"]
    from tests.perf.bench_real_model import hf_generate, shared_prompt_train_pass

    os.environ["OMP_NUM_THREADS"] = threads  # that module sets its own count on import
    path = str(resolve_model("smollm2"))
    overrides = [
        f"model={path}",
        f"output_dir={tempfile.mkdtemp()}",
        "total_steps=10000",
        "save_every=0",
        f"prompts_per_step={args.prompts}",
        f"group_size={args.samples}",
        f"max_response_tokens={args.tokens}",
        "temperature=1.0",
        "top_p=1.0",
        "top_k=-1",
        f"micro_batch_size={args.micro}",
        f"threads={args.threads}",
        "progress=false",
        "tensorboard=false",
        "export_model=false",
        "lora.enabled=true",
        "lora.r=16",
        "lora.alpha=32",
    ]
    if args.engine:
        overrides.append(f"engine={args.engine}")
    cfg = build_config(GRPOConfig, presets_dir() / "grpo_smollm2.yaml", overrides)

    class RecordingLearner(GRPOLearner):
        """GRPO as it is; keeps the step's trajectories for the bare measures."""

        def collect(self, step: int) -> tuple[list[Any], dict[str, float]]:
            trajs, metrics = super().collect(step)
            self.last = trajs
            return trajs, metrics

    learner = RecordingLearner(cfg)
    # the prompts of the steps to come, for TRL's dataset: drawn, then the sampler put back
    state = learner.sampler.state_dict()
    env = learner.env_factory()
    rows = []
    for step in range(args.rounds + 1):
        for d in learner.step_draws(step):
            prompt, _ = env.reset(seed=d.seed, options={"index": d.index})
            rows.append({"prompt": prompt, "seed": d.seed, "index": d.index})
    learner.sampler.load_state_dict(state)
    tok = learner.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    # the bare update's own LoRA model and optimizer, as the learner's
    from transformers import AutoModelForCausalLM

    bare_model = wrap_lora(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), cfg.lora)
    bare_opt = torch.optim.AdamW([p for p in bare_model.parameters() if p.requires_grad], lr=cfg.lr)
    plain = (
        None
        if cfg.engine == "vllm"
        else AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    )

    def bare_generate(trajs: list[Any]) -> tuple[float, int]:
        lengths = [max(1, int(sum(t.loss_mask))) for t in trajs]
        t0 = time.perf_counter()
        if cfg.engine == "vllm":
            import vllm

            engine = learner.engine
            engine._set_threads(engine.threads)
            params = [
                vllm.SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=n, ignore_eos=True)
                for n in lengths
            ]
            outs = engine.llm.generate([{"prompt_token_ids": list(t.prompt_ids)} for t in trajs], params,
                                       use_tqdm=False)  # fmt: skip
            made = sum(len(o.outputs[0].token_ids) for o in outs)
        else:  # HF `generate` on the plain model, every row to the mean length: the same tokens
            mean = -(-sum(lengths) // len(lengths))
            made = hf_generate(plain, [list(t.prompt_ids) for t in trajs], mean, pad)
        return time.perf_counter() - t0, made

    say(f"[ours] engine {cfg.engine}, micro-batches of {cfg.micro_batch_size}, threads {cfg.threads}")
    answer({"rows": rows, "engine": cfg.engine})
    for _ in requests():
        t0 = time.perf_counter()
        m = learner.train_step()
        wall = time.perf_counter() - t0
        trajs = learner.last
        generated = int(sum(sum(t.loss_mask) for t in trajs))
        gen_wall, gen_made = bare_generate(trajs)
        t1 = time.perf_counter()
        shared_prompt_train_pass(bare_model, bare_opt, trajs, args.micro, pad)
        train_wall = time.perf_counter() - t1
        answer({"wall": wall, "gen": m["time_rollout_s"], "update": wall - m["time_rollout_s"],
                "generated": generated, "bare_gen": gen_wall, "bare_gen_tokens": gen_made, "bare_update": train_wall,
                "tool_calls": m.get("tool_calls_mean", 0.0)})  # fmt: skip
        give_back_memory()


# ---- TRL's side ----------------------------------------------------------------------------------


def run_trl(args: argparse.Namespace) -> None:
    import gymnasium as gym
    import torch
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import agent_envs  # noqa: F401  (registers the env ids)
    from algorithms.models.lora import DEFAULT_TARGETS
    from algorithms.models.resolve import resolve_model

    torch.set_num_threads(args.threads)
    path = str(resolve_model("smollm2"))
    tok = AutoTokenizer.from_pretrained(path)
    rows = json.loads(Path(args.prompts_file).read_text())

    def env_reward(prompts: list[str], completions: list[str], seed: list[int], index: list[int],
                   **_: Any) -> list[float]:  # fmt: skip
        """Our env's reward for the completion as the episode's first (and, for TRL, only) turn."""
        out = []
        for c, s, i in zip(completions, seed, index, strict=True):
            env = gym.make("AgentMath-v0", tokenizer=tok).unwrapped
            env.reset(seed=s, options={"index": i})
            _, reward, done, _, _ = env.step(c)
            out.append(float(reward) if done else 0.0)
            env.close()
        return out

    group = args.prompts * args.samples
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=group // args.micro, num_generations=args.samples,
        max_completion_length=args.tokens, temperature=1.0, top_p=1.0, top_k=0, learning_rate=1e-4,
        beta=0.0, max_steps=args.rounds + 1, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True, shuffle_dataset=False, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=list(DEFAULT_TARGETS),
                      task_type="CAUSAL_LM")  # fmt: skip
    trainer = GRPOTrainer(model=path, reward_funcs=env_reward, args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, peft_config=lora)  # fmt: skip
    generation: dict[str, float] = {"s": 0.0, "tokens": 0}
    inner = trainer._generate_and_score_completions

    def timed_generation(inputs: Any) -> Any:
        t = time.perf_counter()
        out = inner(inputs)
        generation["s"] += time.perf_counter() - t
        generation["tokens"] += int(out["completion_mask"].sum())
        return out

    trainer._generate_and_score_completions = timed_generation
    pending = requests()

    class Lockstep(TrainerCallback):
        """Each optimizer step waits for the driver's request and answers with its times."""

        def on_step_begin(self, *a: Any, **kw: Any) -> None:
            if next(pending, None) is None:
                os._exit(0)
            generation.update(s=0.0, tokens=0)
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            wall = time.perf_counter() - self.t0
            answer({"wall": wall, "gen": generation["s"], "update": wall - generation["s"],
                    "generated": generation["tokens"]})  # fmt: skip
            give_back_memory()

    trainer.add_callback(Lockstep())
    say(f"[trl] TRL {trl.__version__}, micro-batches of {args.micro}, threads {torch.get_num_threads()}")
    answer({"trl": trl.__version__})
    trainer.train()


# ---- the driver ----------------------------------------------------------------------------------


class Worker:
    """One side in its own process: a request line in, a RESULT line out."""

    def __init__(self, name: str, python: str, args: argparse.Namespace, extra: list[str]) -> None:
        self.name = name
        cmd = [python, __file__, "--worker", name, *extra, "--threads", str(args.threads), "--rounds",
               str(args.rounds), "--prompts", str(args.prompts), "--samples", str(args.samples), "--tokens",
               str(args.tokens), "--micro", str(args.micro)]  # fmt: skip
        if args.engine:
            cmd += ["--engine", args.engine]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": str(ROOT), "TRL_EXPERIMENTAL_SILENCE": "1"}  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=ROOT)  # fmt: skip

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT) :])
        raise RuntimeError(f"the {self.name} worker ended (exit {self.proc.wait()}); its stderr is above")

    def step(self) -> dict:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def trl_python() -> str:
    sys.path.insert(0, str(ROOT))
    from tests.interop.test_trl_grpo import trl_venv

    return str(trl_venv() / "bin" / "python")


def main(args: argparse.Namespace) -> None:
    load = [os.getloadavg()]
    say(f"threads {args.threads}; load {' '.join(f'{x:.2f}' for x in load[0])}; starting our worker")
    ours = Worker("ours", sys.executable, args, [])
    trl = None
    try:
        setup = ours.read()
        if not args.no_trl:
            prompts = Path(tempfile.mkdtemp()) / "prompts.json"
            prompts.write_text(json.dumps(setup["rows"]))
            say("starting the TRL worker")
            trl = Worker("trl", trl_python(), args, ["--prompts-file", str(prompts)])
            trl.read()
        sides = [("ours", ours)] + ([("trl", trl)] if trl else [])
        runs: dict[str, list[dict]] = {name: [] for name, _ in sides}
        for rnd in range(args.rounds + 1):
            order = sides if rnd % 2 == 0 else sides[::-1]
            for name, worker in order:
                r = worker.step()
                label = "warm-up" if rnd == 0 else f"round {rnd}"
                extra = (f"; bare generate {r['bare_gen']:.1f} s, bare update {r['bare_update']:.1f} s"
                         if name == "ours" else "")  # fmt: skip
                say(f"{label} {name}: step {r['wall']:.1f} s (generation {r['gen']:.1f} s, update "
                    f"{r['update']:.1f} s), {r['generated']} tokens generated{extra}")  # fmt: skip
                if rnd:
                    runs[name].append(r)
            if rnd and trl:
                a, b = runs["ours"][-1], runs["trl"][-1]
                say(f"round {rnd}: ours/TRL {a['wall'] / b['wall']:.2f} per step, "
                    f"{per_k(a) / per_k(b):.2f} per 1k generated tokens")  # fmt: skip
    finally:
        ours.close()
        if trl:
            trl.close()
    load.append(os.getloadavg())
    report(args, setup["engine"], runs, load)


def per_k(r: dict) -> float:
    return r["wall"] / max(r["generated"], 1) * 1000


def report(args: argparse.Namespace, engine: str, runs: dict[str, list[dict]], load: list) -> None:
    med = statistics.median
    print(
        f"\nSmolLM2-135M-Instruct, float32, LoRA r16, {args.prompts} x {args.samples} <= {args.tokens} tokens, "
        f"micro-batches of {args.micro}, {args.threads} threads, {args.rounds} rounds; our engine: {engine}"
    )
    print(f"load average (1/5/15 min): before {' '.join(f'{x:.2f}' for x in load[0])}; "
          f"after {' '.join(f'{x:.2f}' for x in load[1])}")  # fmt: skip
    print("| side | step s | generation s | update s | tokens generated | s per 1k tokens |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rs in runs.items():
        print(f"| {name} | {med(r['wall'] for r in rs):.1f} | {med(r['gen'] for r in rs):.1f} | "
              f"{med(r['update'] for r in rs):.1f} | {med(r['generated'] for r in rs):.0f} | "
              f"{med(per_k(r) for r in rs):.1f} |")  # fmt: skip
    ours = runs["ours"]
    if "trl" in runs:
        step = [a["wall"] / b["wall"] for a, b in zip(ours, runs["trl"], strict=True)]
        tok = [per_k(a) / per_k(b) for a, b in zip(ours, runs["trl"], strict=True)]
        print(
            f"\nours/TRL per step: {' '.join(f'{x:.2f}' for x in step)} (median {med(step):.2f}; target <= 0.5)"
        )
        print(
            f"ours/TRL per 1k generated tokens: {' '.join(f'{x:.2f}' for x in tok)} (median {med(tok):.2f})"
        )
    gen = [r["gen"] / (r["bare_gen"] * r["generated"] / max(r["bare_gen_tokens"], 1)) for r in ours]
    upd = [r["update"] / r["bare_update"] for r in ours]
    print(
        f"our generation / bare engine, same prompts and lengths: {' '.join(f'{x:.2f}' for x in gen)} "
        f"(median {med(gen):.2f}; target <= 1.2)"
    )
    print(
        f"our update / bare LoRA fwd+bwd+AdamW, same tokens: {' '.join(f'{x:.2f}' for x in upd)} "
        f"(median {med(upd):.2f}; target <= 1.2)"
    )


if __name__ == "__main__":
    ARGS = parse_args()
    warnings.filterwarnings("ignore")
    if ARGS.worker:
        import faulthandler
        import signal

        faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints where a slow worker is
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        sys.path.insert(0, str(ROOT))
        (run_ours if ARGS.worker == "ours" else run_trl)(ARGS)
    else:
        main(ARGS)
