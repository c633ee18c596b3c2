"""The GPU check: our rollout and learner paths timed on Qwen2.5-shaped models, in one command.

    python -m algorithms.gpu_check                  # one GPU, at most ~8 min: runs/gpu_check/
    python -m algorithms.gpu_check --dry-run        # toy shapes in seconds, on CPU too (a test runs it)

The learner rows train on synthetic batches; an ARPO-shaped one has forks that copy their parent's
response up to their branch point, which `packing: tree` computes once:

    >>> import numpy as np
    >>> from algorithms.gpu_check import DRY, arpo_trajectories
    >>> trajs = arpo_trajectories(DRY, vocab=1024, rng=np.random.default_rng(0))
    >>> fork = trajs[2]; parent = trajs[fork.parent_id]; cut = fork.branch_offset
    >>> fork.response_ids[:cut] == parent.response_ids[:cut], len(fork.input_ids) == len(parent.input_ids)
    (True, True)

It needs torch, transformers, accelerate and peft beside the package's own dependencies: no vLLM,
no flash-attn, no download. The models are randomly initialised from the Qwen2.5-0.5B and -1.5B shapes
(`algorithms.core.capacity.QWEN25`, the 151,936-token vocabulary included) and saved as bf16
checkpoints; the tokenizer is the tiny model's (`algorithms.models.tiny`), which is enough for
throughput. Per model, in this order, each against the bare model on the same tokens in the same run:

- `generate`: `HFEngine` tokens/s at two batch sizes (bf16 weights, seeded sampling at T = 1, as
  the learners sample); bare: a greedy decode loop over the model's KV cache, nothing else;
- `parity`: max |engine − learner| log-prob of the engine's own samples, the learner's through
  `Learner.forward` (fp32 weights under bf16 autocast); bare: max |bf16 − fp32| of a plain forward
  over the same tokens, the floor bf16 itself sets;
- `learner`: one GRPO update (`Learner.update`, 64 trajectories x 1,024 tokens), full and LoRA:
  step time, peak GPU memory, tokens/s; bare: the model's forward and backward of the same tokens in
  the same micro-batches and precision, with a plain cross-entropy and no optimizer step;
- `packing`: the same update on an ARPO-shaped batch (per prompt 2 paths and 6 forks, each fork a
  copy of its parent's response up to its branch point), `packing: flat` and `packing: tree`.

Results go to `gpu_check.json` and `gpu_check.md` in `--out`, rewritten after every row, so a run
stopped from outside keeps what it measured. `--time-limit-s` bounds the whole run: a row starts
only while the time left exceeds the longest row so far (setup included); the others are marked
skipped. The exit status is 1 when no row was measured. docs/scaling.md ("The GPU check") shows the
table and what each column means.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from agent_envs.base.config import add_flags, build_config, check_types, flag_values, option, require
from algorithms.core.capacity import QWEN25, ModelShape
from algorithms.gpu_check_batches import DRY, FULL, Sizes, arpo_trajectories, grpo_trajectories, random_tokens

if TYPE_CHECKING:
    from algorithms.core.learner import Learner

GIB = 2**30
# a shape with every part of the real ones (GQA, tied embeddings, a vocabulary above the tokenizer's)
TOY = ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=1024, tied=True)


@dataclass
class GPUCheckConfig:
    """The settings of `python -m algorithms.gpu_check`."""

    out: str = option("runs/gpu_check", "folder of gpu_check.json and gpu_check.md")
    time_limit_s: float = option(480.0, "the whole run's budget: no row starts once the time left is "
                                 "less than the longest row so far took; those rows are marked skipped")
    dry_run: bool = option(False, "toy model, small batches, float32 where bf16 does not run: checks "
                           "the command itself in seconds, on CPU too")
    models: tuple[str, ...] = option(("0.5B", "1.5B"), f"Qwen2.5 shapes to build, of {sorted(QWEN25)}")
    repeats: int = option(3, "timed repetitions of each measurement, after one untimed warm-up; "
                          "the median is reported")
    seed: int = option(0, "seed of the random weights, token ids and sampling")

    def validate(self) -> None:
        check_types(self)
        require(self.time_limit_s >= 0, "time_limit_s", "must be >= 0", self.time_limit_s)
        require(self.repeats >= 1, "repeats", "must be >= 1", self.repeats)
        unknown = [m for m in self.models if m not in QWEN25]
        require(not unknown and bool(self.models), "models", f"must name shapes of {sorted(QWEN25)}", self.models)




@dataclass
class Row:
    """One line of the table. `ours` and `bare` share `unit`; `ratio` is ours ÷ bare."""

    model: str
    measure: str
    setting: str
    unit: str
    status: str = "pending"  # ok | error | skipped | pending (not reached when the files were written)
    ours: float | None = None
    bare: float | None = None
    ratio: float | None = None
    time_s: float | None = None  # median of one measurement (a step, a generate call, a comparison)
    peak_mem_gib: float | None = None  # peak GPU memory allocated by torch (none on CPU)
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)


class Budget:
    """The run's time limit: a row may start while the time left exceeds the longest row so far."""

    def __init__(self, limit_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s, self.clock = limit_s, clock
        self.start, self.longest = clock(), 0.0

    def elapsed(self) -> float:
        return self.clock() - self.start

    def allows(self) -> bool:
        left = self.limit_s - self.elapsed()
        return left > 0 and left > self.longest

    def spent(self, seconds: float) -> None:
        self.longest = max(self.longest, seconds)


def run_rows(rows: Sequence[tuple[Row, Callable[[Row], None]]], budget: Budget,
             report: Callable[[], None] = lambda: None, log: Callable[[str], None] = print) -> None:  # fmt: skip
    """Run each row's measurement while the budget allows; mark the rest skipped. A row that
    raises is marked `error` with the exception's one line, and the run goes on."""
    for row, measure in rows:
        name = f"{row.model} {row.measure} {row.setting}"
        if not budget.allows():
            row.status = "skipped"
            row.note = f"time limit: {budget.elapsed():.0f} s of {budget.limit_s:.0f} s spent"
            log(f"[gpu-check {budget.elapsed():4.0f}s] {name}: skipped ({row.note})")
            continue
        log(f"[gpu-check {budget.elapsed():4.0f}s] {name} ...")
        began = budget.clock()
        try:
            measure(row)
            row.status = "ok"
        except Exception as exc:  # a row's failure (out of memory, a bug) is its result, not the run's end
            row.status, row.note = "error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        budget.spent(budget.clock() - began)
        log(f"[gpu-check {budget.elapsed():4.0f}s] {name}: {_summary(row)}")
        report()


# ---- one model's measurements ---------------------------------------------------------------------


class ModelBench:
    """One model's checkpoint, engine and learner (one learner at a time), made when a row first
    needs them; a failure to make one is kept and raised again for every row that needs it."""

    def __init__(self, name: str, shape: ModelShape, sizes: Sizes, cfg: GPUCheckConfig, ctx: RunContext) -> None:
        self.name, self.shape, self.sizes, self.cfg, self.ctx = name, shape, sizes, cfg, ctx
        self._engine: Any = None
        self._failed: Exception | None = None
        self._learner: Learner | None = None
        self._learner_key: tuple[str, bool] | None = None
        self.flat_step_s: float | None = None  # the ARPO batch's flat step, for the tree row
        self.path: Path | None = None  # the checkpoint, once built

    # -- resources

    @property
    def engine(self) -> Any:
        if self._failed is not None:
            raise self._failed
        if self._engine is None:
            try:
                self._engine = self._build()
            except Exception as exc:
                self._failed = exc
                raise
        return self._engine

    def _build(self) -> Any:
        """Save a random-init model of the shape (bf16, as checkpoints come) with the tokenizer,
        then load it into an `HFEngine` as a user's config would."""
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from algorithms.rollout.hf import HFEngine

        s, tok = self.shape, self.ctx.tokenizer
        config = Qwen2Config(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
                             num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                             tie_word_embeddings=s.tied, max_position_embeddings=32768, rope_theta=1e6,
                             rms_norm_eps=1e-6, use_sliding_window=False, bos_token_id=tok.eos_token_id,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
        torch.manual_seed(self.cfg.seed)
        with torch.device(self.ctx.device):  # initialise where it is fast
            model = Qwen2ForCausalLM(config)
        self.path = Path(self.ctx.tmp) / self.name
        model.to(torch.bfloat16).save_pretrained(self.path)
        tok.save_pretrained(self.path)
        del model
        self.ctx.free()
        return HFEngine(str(self.path), tok, dtype=self.ctx.dtype_name, device=self.ctx.device, seed=self.cfg.seed)

    def learner(self, packing: str = "flat", lora: bool = False) -> Any:
        """A GRPO learner of the checkpoint, sampling with the bench's engine (the previous one is
        dropped first: one learner's memory at a time)."""
        from algorithms.core.learner import Learner
        from algorithms.core.learner_config import LearnerConfig
        from algorithms.models.lora import LoRAConfig

        engine = self.engine
        if self._learner_key == (packing, lora):
            return self._learner
        self.drop_learner()
        z = self.sizes
        cfg = LearnerConfig(model=str(self.path), env="AgentMath-v0", engine="hf", prompts_per_step=z.prompts,
                            group_size=z.group, max_response_tokens=z.response_len, micro_batch_size=z.micro_batch,
                            packing=packing, lora=LoRAConfig(enabled=lora, r=z.lora_r, alpha=2.0 * z.lora_r),
                            mixed_precision=self.ctx.mixed_precision, output_dir=str(Path(self.ctx.tmp) / "run"),
                            seed=self.cfg.seed, threads=None, health_checks="off", progress=False,
                            tensorboard=False, export_model=False)  # fmt: skip
        self._learner = Learner(cfg, accelerator=self.ctx.accelerator, engine=engine)
        self._learner_key = (packing, lora)
        return self._learner

    def drop_learner(self) -> None:
        if self._learner is not None:
            self._learner = self._learner_key = None
            self.ctx.accelerator.free_memory()  # it keeps references to every prepared model
            self.ctx.free()

    def close(self) -> None:
        self.drop_learner()
        self._engine = None
        self.ctx.free()

    # -- rows

    def rows(self) -> list[tuple[Row, Callable[[Row], None]]]:
        z, m = self.sizes, self.name
        out = [(Row(m, "generate", f"batch {b}", "tokens/s"), lambda row, b=b: self.generate(row, b))
               for b in z.gen_batches]
        out.append((Row(m, "parity", f"batch {z.parity_batch}", "max abs Δ log p"), self.parity))
        n = z.prompts * z.group
        tokens = f"{n} x {z.prompt_len + z.response_len}"
        out.append((Row(m, "learner", f"full, {tokens}", "tokens/s"), lambda row: self.update(row, "grpo", "flat", False)))
        out.append((Row(m, "packing", f"ARPO flat, {tokens}", "tokens/s"), lambda row: self.update(row, "arpo", "flat", False)))
        out.append((Row(m, "packing", f"ARPO tree, {tokens}", "tokens/s"), lambda row: self.update(row, "arpo", "tree", False)))
        out.append((Row(m, "learner", f"LoRA r={z.lora_r}, {tokens}", "tokens/s"),
                    lambda row: self.update(row, "grpo", "flat", True)))  # fmt: skip
        return out

    def _prompts(self, count: int, length: int) -> list[list[int]]:
        rng = np.random.default_rng([self.cfg.seed, count, length])
        return [random_tokens(rng, len(self.ctx.tokenizer), length) for _ in range(count)]

    def generate(self, row: Row, batch: int) -> None:
        from algorithms.rollout.engine import SamplingParams

        engine, z, ctx = self.engine, self.sizes, self.ctx
        prompts = self._prompts(batch, z.gen_prompt)
        params = [SamplingParams(temperature=1.0, max_tokens=z.gen_tokens, seed=self.cfg.seed + i)
                  for i in range(batch)]  # fmt: skip
        engine.generate(prompts, [p.with_(max_tokens=4) for p in params])  # warm-up
        produced: list[int] = []

        def ours() -> None:
            produced.append(sum(len(s) for s in engine.generate(prompts, params)))

        seconds = ctx.median_time(ours, self.cfg.repeats, warmup=False)
        bare_s = ctx.median_time(lambda: bare_decode(engine.model, prompts, z.gen_tokens, ctx.device), self.cfg.repeats)
        row.time_s = seconds
        _fill(row, statistics.median(produced) / seconds, batch * z.gen_tokens / bare_s)
        row.extra = {"generated_tokens": float(statistics.median(produced)), "bare_s": bare_s}

    def parity(self, row: Row) -> None:
        """The engine's samples scored by the learner, as the rollout health check compares them."""
        from algorithms.core.batch import RolloutBatch
        from algorithms.core.logprobs import frozen_logprobs
        from algorithms.rollout.engine import SamplingParams
        from algorithms.rollout.trajectory import Trajectory

        engine, z = self.engine, self.sizes
        learner = self.learner()  # before any update: the engine holds the same weights
        prompts = self._prompts(z.parity_batch, z.gen_prompt)
        began = time.perf_counter()
        segs = engine.generate(prompts, [SamplingParams(temperature=1.0, max_tokens=z.gen_tokens,
                                                        seed=self.cfg.seed + i) for i in range(len(prompts))])
        trajs = [Trajectory(p, s.token_ids, [1] * len(s), list(s.logprobs), group_id=i)
                 for i, (p, s) in enumerate(zip(prompts, segs, strict=True))]  # fmt: skip
        batch = RolloutBatch.from_trajectories(trajs, torch.zeros(len(trajs)))
        learner.model.eval()
        lps, _ = frozen_logprobs(learner.forward, learner.model, batch, z.micro_batch)
        on = batch.loss_mask > 0
        gap = (lps - batch.rollout_logprobs).abs()[on]
        floor = bare_precision_gap(engine.model, trajs, self.ctx.device)
        row.time_s = time.perf_counter() - began
        _fill(row, float(gap.max()), floor)
        row.extra = {"mean_abs_diff": float(gap.mean()), "tokens": float(on.sum())}

    def update(self, row: Row, shape: str, packing: str, lora: bool) -> None:
        """Time `Learner.update` on a synthetic batch, then the bare forward/backward of its tokens."""
        z, ctx = self.sizes, self.ctx
        learner = self.learner(packing, lora)
        rng = np.random.default_rng([self.cfg.seed, 1 if shape == "arpo" else 0])
        make = arpo_trajectories if shape == "arpo" else grpo_trajectories
        trajs = make(z, self.shape.vocab, rng)
        batch = learner_batch(learner, trajs)
        learner.model.train()
        learner_update(learner, batch)  # warm-up: the optimizer's state exists after it
        ctx.reset_peak()
        seconds = ctx.median_time(lambda: learner_update(learner, batch), self.cfg.repeats, warmup=False)
        row.peak_mem_gib = ctx.peak_gib()
        packer_metrics = learner.packer.take_metrics() if learner.packer else {}
        bare_s = ctx.median_time(lambda: bare_forward_backward(learner, trajs, z.micro_batch), self.cfg.repeats)
        tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
        row.time_s = seconds
        _fill(row, tokens / seconds, tokens / bare_s)
        row.extra = {"tokens": float(tokens), "bare_s": bare_s, **packer_metrics}
        if shape == "arpo" and packing == "flat":
            self.flat_step_s = seconds
        if packing == "tree":
            ratio = packer_metrics.get("tree_token_ratio")
            row.note = f"tree_token_ratio {ratio:.2f}" if ratio is not None else ""
            if self.flat_step_s:
                row.extra["tree_over_flat_time"] = seconds / self.flat_step_s
                row.note += f"; tree ÷ flat step time {seconds / self.flat_step_s:.2f}"


def learner_batch(learner: Learner, trajs: list[Any]) -> Any:
    """The `RolloutBatch` of `trajs` with the learner's rewards and advantages (`train_step`, 2)."""
    from algorithms.core.batch import RolloutBatch

    batch = RolloutBatch.from_trajectories(trajs, learner.shape_rewards(trajs))
    batch.advantages, batch.loss_mask = learner.compute_advantages(batch)
    return batch


def learner_update(learner: Learner, batch: Any) -> None:
    """Steps 3-4 of `Learner.train_step` on a batch: π_old when it is needed, then one optimizer
    step per mini-batch (a rollout and the engine sync are not part of it)."""
    from algorithms.core.batch import minibatch_rows
    from algorithms.core.logprobs import frozen_logprobs

    cfg = learner.config
    if cfg.num_minibatches > 1 or cfg.ppo_epochs > 1:
        batch.old_logprobs, batch.old_entropy = frozen_logprobs(learner.forward, learner.model, batch,
                                                                cfg.micro_batch_size)  # fmt: skip
    for _ in range(cfg.ppo_epochs):
        for rows in minibatch_rows(batch, cfg.num_minibatches):
            learner.update(batch, rows)


def bare_forward_backward(learner: Learner, trajs: list[Any], micro_batch: int) -> None:
    """The model's own forward and backward over every trajectory's tokens, in the learner's
    micro-batches and precision: cross-entropy on the response positions, no optimizer step."""
    device = learner.accelerator.device
    for start in range(0, len(trajs), micro_batch):
        part = trajs[start : start + micro_batch]
        width = max(len(t.response_ids) for t in part)
        if any(len(t.prompt_ids) + len(t.response_ids) != len(part[0].input_ids) for t in part):
            raise ValueError("bare_forward_backward: the trajectories of a micro-batch must have one length")
        ids = torch.tensor([t.input_ids for t in part], device=device)
        logits = learner.model(input_ids=ids, logits_to_keep=width + 1, use_cache=False).logits[:, :-1]
        targets = torch.tensor([t.response_ids for t in part], device=device)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).backward()
    learner.optimizer.zero_grad(set_to_none=True)  # the learner's next update starts clean


@torch.no_grad()
def bare_decode(model: Any, prompts: list[list[int]], new_tokens: int, device: str) -> None:
    """Greedy decoding with the model's KV cache and nothing else (prompts of one length)."""
    out = model(input_ids=torch.tensor(prompts, device=device), use_cache=True, logits_to_keep=1)
    for _ in range(new_tokens - 1):
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)


@torch.no_grad()
def bare_precision_gap(model: Any, trajs: list[Any], device: str) -> float:
    """Max |log p| difference on the response tokens between a plain forward in the model's dtype
    and one in float32 (the same weights upcast): what the dtype alone accounts for."""

    def logprobs() -> list[torch.Tensor]:
        out = []
        for t in trajs:
            n = len(t.response_ids)
            if not n:
                continue
            logits = model(input_ids=torch.tensor([t.input_ids], device=device), logits_to_keep=n + 1).logits[0, :-1]
            lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(t.response_ids, device=device)[:, None])
            out.append(lp.squeeze(-1).cpu())
        return out

    low = logprobs()
    def tensors() -> list[tuple[str, torch.Tensor]]:
        return [*model.named_parameters(), *model.named_buffers()]

    dtypes = {name: t.dtype for name, t in tensors()}  # buffers such as RoPE's may be float32 already
    model.float()
    try:
        high = logprobs()
    finally:  # the weights came from a checkpoint in their dtype: the round trip is exact
        for name, t in tensors():
            t.data = t.data.to(dtypes[name])
    return max((float((a - b).abs().max()) for a, b in zip(low, high, strict=True)), default=0.0)


def _fill(row: Row, ours: float, bare: float) -> None:
    row.ours, row.bare = ours, bare
    row.ratio = ours / bare if bare else None


# ---- the run --------------------------------------------------------------------------------------


class RunContext:
    """What every model's rows share: device, precision, timing; the accelerator and the tokenizer
    are made when the first row needs them (a run with no time left makes neither)."""

    def __init__(self, tmp: str) -> None:
        self.tmp = tmp
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.bf16 = bf16_runs(self.device)
        self.dtype_name = "bfloat16" if self.bf16 else "float32"
        self.mixed_precision = "bf16" if self.bf16 else "no"

    @functools.cached_property
    def accelerator(self) -> Any:
        from algorithms.core.model_setup import make_accelerator

        return make_accelerator(self.mixed_precision)

    @functools.cached_property
    def tokenizer(self) -> Any:
        import transformers

        from algorithms.models.tiny import build_tiny_model

        transformers.utils.logging.disable_progress_bar()  # one line per row is the progress
        return transformers.AutoTokenizer.from_pretrained(build_tiny_model(seed=0))

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def median_time(self, fn: Callable[[], Any], repeats: int, *, warmup: bool = True) -> float:
        """Median wall seconds of `fn` over `repeats` calls (after one untimed call when `warmup`)."""
        if warmup:
            fn()
        times = []
        for _ in range(repeats):
            self.sync()
            began = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - began)
        return statistics.median(times)

    def reset_peak(self) -> None:
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated() / GIB if self.device == "cuda" else None

    def free(self) -> None:
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def describe(self) -> dict[str, Any]:
        from importlib.metadata import version  # not the imports: peft's alone takes seconds

        name = torch.cuda.get_device_name() if self.device == "cuda" else "cpu"
        return {"device": name, "dtype": self.dtype_name, "torch": torch.__version__,
                **{p: version(p) for p in ("transformers", "accelerate", "peft")}}  # fmt: skip


def bf16_runs(device: str) -> bool:
    """Whether bf16 matmuls run on `device` (recent CPUs and Ampere or later GPUs)."""
    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        x = torch.ones(2, 2, dtype=torch.bfloat16)
        return bool((x @ x).float().sum() == 8)
    except RuntimeError:
        return False


def write_report(out: Path, header: dict[str, Any], rows: Sequence[Row]) -> tuple[Path, Path]:
    """gpu_check.json (header and rows) and gpu_check.md (the table)."""
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "gpu_check.json", out / "gpu_check.md"
    js.write_text(json.dumps({**header, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    md.write_text(markdown(header, rows))
    return js, md


COLUMNS = ("model", "measure", "setting", "unit", "ours", "bare", "ours ÷ bare", "time (s)", "peak GiB", "status")


def markdown(header: dict[str, Any], rows: Sequence[Row]) -> str:
    """The table of docs/scaling.md ("The GPU check"), with the run's device and versions above it."""
    lines = [
        f"GPU check on {header['device']} ({header['dtype']}; torch {header['torch']}, transformers "
        f"{header['transformers']}, accelerate {header['accelerate']}, peft {header['peft']}), "
        f"{header['elapsed_s']:.0f} s of a {header['time_limit_s']:.0f} s limit"
        + (", dry run (toy shapes)" if header["dry_run"] else ""),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        status = r.status if not r.note else f"{r.status}: {r.note}"
        cells = (r.model, r.measure, r.setting, r.unit, _num(r.ours), _num(r.bare), _num(r.ratio, 2),
                 _num(r.time_s, 3), _num(r.peak_mem_gib, 1), status)  # fmt: skip
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _num(x: float | None, digits: int | None = None) -> str:
    if x is None:
        return "-"
    if digits is not None:
        return f"{x:.{digits}f}"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def _summary(row: Row) -> str:
    if row.status != "ok":
        return f"{row.status} ({row.note})" if row.note else row.status
    mem = f", peak {row.peak_mem_gib:.1f} GiB" if row.peak_mem_gib is not None else ""
    ratio = f" (bare {_num(row.bare)}, ours ÷ bare {_num(row.ratio, 2)})"
    return f"{_num(row.ours)} {row.unit}{ratio}, {_num(row.time_s, 3)} s{mem}" + (f"; {row.note}" if row.note else "")


def run_check(cfg: GPUCheckConfig) -> tuple[int, list[Row]]:
    """Run every row the time limit allows, writing both files after each; returns the exit
    status (1: no row was measured) and the rows."""
    budget = Budget(cfg.time_limit_s)
    sizes = DRY if cfg.dry_run else FULL
    shapes = {"toy": TOY} if cfg.dry_run else {m: QWEN25[m] for m in cfg.models}
    out = Path(cfg.out)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        ctx = RunContext(tmp)
        header = {**ctx.describe(), "dry_run": cfg.dry_run, "time_limit_s": cfg.time_limit_s, "elapsed_s": 0.0,
                  "config": asdict(cfg), "sizes": asdict(sizes)}  # fmt: skip
        benches = [ModelBench(name, shape, sizes, cfg, ctx) for name, shape in shapes.items()]
        plan = [(bench, row, fn) for bench in benches for row, fn in bench.rows()]
        rows = [row for _, row, _ in plan]

        def report() -> None:
            header["elapsed_s"] = budget.elapsed()
            write_report(out, header, rows)

        print(f"[gpu-check] {header['device']}, {ctx.dtype_name}, {len(rows)} rows, limit {cfg.time_limit_s:.0f} s; "
              f"writing {out / 'gpu_check.json'} and {out / 'gpu_check.md'}", flush=True)  # fmt: skip
        for bench in benches:
            run_rows([(row, fn) for b, row, fn in plan if b is bench], budget, report,
                     log=lambda line: print(line, flush=True))  # fmt: skip
            bench.close()
        report()
    print(markdown(header, rows), flush=True)
    return (0 if any(r.status == "ok" for r in rows) else 1), rows


_FLAGS = tuple(f.name for f in fields(GPUCheckConfig) if f.name != "dry_run")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m algorithms.gpu_check", description=__doc__.split("\n")[0],
                                epilog="docs/scaling.md, 'The GPU check': what each row measures")
    add_flags(p, GPUCheckConfig, _FLAGS, metavars={"models": "0.5B,1.5B"})
    p.add_argument("--dry-run", action="store_true", help=GPUCheckConfig.__dataclass_fields__["dry_run"].metadata["help"])
    args = p.parse_args(argv)
    given = flag_values(args, _FLAGS, GPUCheckConfig) | ({"dry_run": True} if args.dry_run else {})
    cfg = build_config(GPUCheckConfig, None, given=given)
    status, _ = run_check(cfg)
    return status


if __name__ == "__main__":
    sys.exit(main())
