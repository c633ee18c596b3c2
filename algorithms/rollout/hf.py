"""`HFEngine`: a transformers model as a rollout engine (CPU runs, tests, the reference for vLLM).

A hand-written decode loop over the model's KV cache rather than `model.generate`, so that each
request keeps its own `max_tokens`, stop strings and seed, and the returned log-probs, top-k
log-probs and entropies come from the distribution actually sampled (after temperature, top-k
and top-p, like vLLM's `processed_logprobs`).

    >>> from algorithms.rollout import HFEngine, SamplingParams
    >>> from algorithms.models.tiny import build_tiny_model
    >>> engine = HFEngine(build_tiny_model())
    >>> segs = engine.generate([[1, 5, 7]], SamplingParams(temperature=0, max_tokens=4))
    >>> segs[0].finish_reason in ("length", "eos", "stop")
    True
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from algorithms.rollout.engine import SamplingParams, Segment, cut_at_stop, per_request


class HFEngine:
    """Rollouts with a transformers causal LM.

    Args:
        model: a checkpoint directory / hub id, or an already loaded model (shared, not copied:
            then `sync_weights` with that same model is a no-op).
        tokenizer: defaults to the checkpoint's tokenizer.
        dtype: weights dtype when loading from a path.
        max_batch_size: requests decoded together (sorted by prompt length to limit padding).
        seed: seed of the engine's generator for requests without their own seed.
    """

    def __init__(
        self,
        model: str | Path | torch.nn.Module,
        tokenizer: Any = None,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        max_batch_size: int = 64,
        seed: int = 0,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, torch.nn.Module):
            self.model = model
            source = getattr(model.config, "_name_or_path", None)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).to(device)
            source = model
        if tokenizer is None:
            if not source:
                raise ValueError("HFEngine: pass `tokenizer=` when the model has no checkpoint path")
            tokenizer = AutoTokenizer.from_pretrained(source)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.generator = torch.Generator().manual_seed(seed)
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if tokenizer.eos_token_id is not None:
            eos.append(tokenizer.eos_token_id)
        self.eos_ids = set(eos)
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids, default=0)
        )
        self.max_model_len = getattr(self.model.config, "max_position_embeddings", 1 << 30)
        self._lock = threading.Lock()
        self.generated_tokens = 0

    # -- public API -------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Segment]:
        reqs: list[tuple[list[int], SamplingParams]] = []
        for prompt, p in zip(prompts, per_request(prompts, params), strict=True):
            if not prompt:
                raise ValueError(
                    "HFEngine.generate: a prompt is empty; prompts must hold at least one token id"
                )
            # n samples of a seeded request must differ, like vLLM's: seed, seed+1, ...
            reqs += [(list(prompt), p if p.seed is None else p.with_(seed=p.seed + j)) for j in range(p.n)]
        out: list[Segment | None] = [None] * len(reqs)
        order = sorted(range(len(reqs)), key=lambda i: len(reqs[i][0]))
        with self._lock:
            # a shared learner model may be in train mode: decode in eval mode, then restore
            was_training = self.model.training
            self.model.eval()
            try:
                for start in range(0, len(order), self.max_batch_size):
                    chunk = order[start : start + self.max_batch_size]
                    for i, seg in zip(chunk, self._decode([reqs[i] for i in chunk]), strict=True):
                        out[i] = seg
            finally:
                self.model.train(was_training)
        return out  # type: ignore[return-value]

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Segment]:
        # in a worker thread, so env tool calls keep running on the event loop meanwhile
        return await asyncio.to_thread(self.generate, prompts, params)

    def sync_weights(self, model: torch.nn.Module) -> None:
        if model is self.model:
            return
        with self._lock, torch.no_grad():
            self.model.load_state_dict(model.state_dict())

    def stats(self) -> dict[str, float]:
        return {"generated_tokens": float(self.generated_tokens)}

    # -- decoding ---------------------------------------------------------------------------

    @torch.no_grad()
    def _decode(self, reqs: list[tuple[list[int], SamplingParams]]) -> list[Segment]:
        b = len(reqs)
        dev = self.device
        limits = [max(0, min(p.max_tokens, self.max_model_len - len(ids))) for ids, p in reqs]
        width = max(len(ids) for ids, _ in reqs)
        input_ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for row, (ids, _) in enumerate(reqs):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            mask[row, width - len(ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for _, p in reqs]).unsqueeze(1)
        greedy = torch.tensor([p.greedy for _, p in reqs])
        top_ks = [p.top_k for _, p in reqs]
        top_ps = torch.tensor([p.top_p for _, p in reqs]).unsqueeze(1)
        gens = [torch.Generator().manual_seed(p.seed) if p.seed is not None else None for _, p in reqs]
        want_entropy = True
        segs = [
            Segment([], [], [] if p.logprobs else None, entropy=[] if want_entropy else None) for _, p in reqs
        ]
        live = [row for row in range(b) if limits[row] > 0]
        window = max((len(s) for _, p in reqs for s in p.stop), default=0) + 4

        out = self.model(
            input_ids=input_ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=positions.to(dev),
            use_cache=True,
        )
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float().cpu()
        next_pos = positions[:, -1] + 1
        rows = list(range(b))  # batch row -> request index, shrinks as requests finish
        while live:
            idx = torch.tensor([rows.index(r) for r in live]) if len(live) != len(rows) else None
            if idx is not None:
                cache.batch_select_indices(idx.to(dev))
                logits, mask, next_pos = logits[idx], mask[idx], next_pos[idx]
                rows = list(live)
            sel = torch.tensor(rows)
            logp = _process(logits, temps[sel], top_ks_of(top_ks, rows), top_ps[sel], greedy[sel])
            tokens = self._sample(logp, greedy[sel], [gens[r] for r in rows])
            probs = logp.exp()
            ent = -(probs * logp.nan_to_num(neginf=0.0)).sum(-1)
            still = []
            for j, r in enumerate(rows):
                tok = int(tokens[j])
                seg, p = segs[r], reqs[r][1]
                seg.token_ids.append(tok)
                seg.logprobs.append(float(logp[j, tok]))
                seg.entropy.append(float(ent[j]))
                if p.logprobs:
                    seg.top_logprobs.append(logp[j].topk(p.logprobs).values.tolist())
                if tok in self.eos_ids:
                    seg.finish_reason = "eos"
                elif p.stop and _stop_hit(self.tokenizer, seg.token_ids[-window:], p.stop):
                    seg.finish_reason = "stop"
                elif len(seg.token_ids) >= limits[r]:
                    seg.finish_reason = "length"
                else:
                    still.append(r)
            self.generated_tokens += len(rows)
            live = still
            if not live:
                break
            keep = torch.tensor([rows.index(r) for r in live])
            step_ids = tokens.unsqueeze(1)
            mask = torch.cat([mask, torch.ones((mask.shape[0], 1), dtype=torch.long)], dim=1)
            # finished rows are dropped from the cache before the next forward
            if len(live) != len(rows):
                cache.batch_select_indices(keep.to(dev))
                step_ids, mask, next_pos = step_ids[keep], mask[keep], next_pos[keep]
                rows = list(live)
            out = self.model(
                input_ids=step_ids.to(dev),
                attention_mask=mask.to(dev),
                position_ids=next_pos.unsqueeze(1).to(dev),
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float().cpu()
            next_pos = next_pos + 1

        for (_, p), seg in zip(reqs, segs, strict=True):
            text = self.tokenizer.decode(seg.token_ids, skip_special_tokens=True)
            seg.text, seg.stop_str = (
                cut_at_stop(text, p.stop) if seg.finish_reason == "stop" else (text, None)
            )
        return segs

    def _sample(
        self, logp: torch.Tensor, greedy: torch.Tensor, gens: list[torch.Generator | None]
    ) -> torch.Tensor:
        tokens = logp.argmax(-1)
        probs = logp.exp()
        free = [j for j, g in enumerate(gens) if g is None and not greedy[j]]
        if free:
            tokens[free] = torch.multinomial(probs[free], 1, generator=self.generator).squeeze(1)
        for j, g in enumerate(gens):
            if g is not None and not greedy[j]:
                tokens[j] = torch.multinomial(probs[j], 1, generator=g).squeeze(0)
        return tokens


def top_ks_of(top_ks: list[int], rows: list[int]) -> list[int]:
    return [top_ks[r] for r in rows]


def _process(
    logits: torch.Tensor, temps: torch.Tensor, top_ks: list[int], top_ps: torch.Tensor, greedy: torch.Tensor
) -> torch.Tensor:
    """Log-probs of the distribution sampled from: temperature, then top-k, then top-p.

    Greedy rows get the plain log-softmax of the logits (what vLLM reports for greedy requests).
    """
    x = logits / temps
    vocab = x.shape[-1]
    if any(0 < k < vocab for k in top_ks):
        ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks])
        kth = x.sort(-1, descending=True).values.gather(1, (ks - 1).unsqueeze(1))
        x = x.masked_fill((x < kth) & ~greedy.unsqueeze(1), float("-inf"))
    if bool((top_ps < 1).any()):
        sorted_x, order = x.sort(-1, descending=True)
        p = sorted_x.softmax(-1)
        drop = (p.cumsum(-1) - p) > top_ps  # keep the smallest prefix whose mass reaches top_p
        drop &= ~greedy.unsqueeze(1)
        x = x.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    return torch.log_softmax(x, dim=-1)


def _stop_hit(tokenizer: Any, tail: list[int], stops: Sequence[str]) -> bool:
    # the stop string can only have been completed by the newest token, so decoding a short
    # tail (stop length + slack in tokens) is enough
    text = tokenizer.decode(tail, skip_special_tokens=True)
    return any(s and s in text for s in stops)


__all__ = ["HFEngine"]
