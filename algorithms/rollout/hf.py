"""`HFEngine`: a transformers model as a rollout engine (CPU runs, tests, the reference for vLLM).

A hand-written decode loop over the model's KV cache rather than `model.generate`, so that each
request keeps its own `max_tokens`, stop strings and seed, and the returned log-probs, top-k
log-probs and entropies come from the distribution actually sampled (after temperature, top-k
and top-p, like vLLM's `processed_logprobs`).

Multi-turn episodes come back as prompt + everything so far + a tool result. When a segment ends
at a stop string (a tool call), the engine keeps that request's KV cache, keyed by its tokens;
a later request that extends those tokens starts from the kept cache and feeds only the new
ones (the tool result), like vLLM's prefix caching. Kept caches are dropped as soon as the
weights change (an optimizer step or `sync_weights`), so reuse never mixes policies.

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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from algorithms.rollout.engine import SamplingParams, Segment, cut_at_stop, hold_threads, per_request


class HFEngine:
    """Rollouts with a transformers causal LM.

    Args:
        model: a checkpoint directory / hub id, or an already loaded model (shared, not copied:
            then `sync_weights` with that same model is a no-op).
        tokenizer: defaults to the checkpoint's tokenizer.
        dtype: weights dtype when loading from a path.
        max_batch_size: requests decoded together (sorted by prompt length to limit padding).
        seed: seed of the engine's generator for requests without their own seed.
        prefix_cache_tokens: at most this many tokens of kept KV caches (oldest dropped first);
            0 turns the reuse off (every request is prefilled in full).
        threads: torch threads to decode with; defaults to the constructing thread's count.
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
        prefix_cache_tokens: int = 65536,
        threads: int | None = None,
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
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        # set again in whichever thread runs generate(): see `hold_threads`
        self.threads = int(threads or torch.get_num_threads())

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
            hold_threads(self.threads)
            # a shared learner model may be in train mode: decode in eval mode, then restore
            was_training = self.model.training
            self.model.eval()
            self.prefix_cache.check_weights(self.model)
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

    def sync_weights(self, model: torch.nn.Module | Mapping[str, torch.Tensor] | Iterable[tuple[str, Any]]) -> None:
        """Load the learner's weights: a module (LoRA adapters merged, `algorithms.models.lora`),
        a full state dict, or (name, tensor) pairs, under the base model's names."""
        if model is self.model:
            return
        if isinstance(model, torch.nn.Module):
            from algorithms.models.lora import merged_state_dict

            state = merged_state_dict(model)  # a plain model's own state dict; a copy under LoRA
        else:
            state = model if isinstance(model, Mapping) else dict(model)
        with self._lock, torch.no_grad():
            self.model.load_state_dict(state)
            self.prefix_cache.clear()

    def stats(self) -> dict[str, float]:
        return {
            "generated_tokens": float(self.generated_tokens),
            "prefix_cache_hit_tokens": float(self.prefix_cache.hit_tokens),
            "prefill_tokens": float(self.prefix_cache.prefill_tokens),
        }

    # -- decoding ---------------------------------------------------------------------------

    @torch.no_grad()
    def _decode(self, reqs: list[tuple[list[int], SamplingParams]]) -> list[Segment]:
        # One function, long on purpose: the per-token loop is the engine's hot path, and its
        # state (cache, masks, stops, per-row limits) lives in locals rather than attributes.
        b = len(reqs)
        dev = self.device
        limits = [max(0, min(p.max_tokens, self.max_model_len - len(ids))) for ids, p in reqs]
        temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for _, p in reqs]).unsqueeze(1)
        greedy = torch.tensor([p.greedy for _, p in reqs])
        greedy_rows = [p.greedy for _, p in reqs]
        top_ks = [p.top_k for _, p in reqs]
        top_ps = torch.tensor([p.top_p for _, p in reqs]).unsqueeze(1)
        gens = [torch.Generator().manual_seed(p.seed) if p.seed is not None else None for _, p in reqs]
        want_entropy = True
        segs = [
            Segment([], [], [] if p.logprobs else None, entropy=[] if want_entropy else None) for _, p in reqs
        ]
        live = [row for row in range(b) if limits[row] > 0]
        window = max((len(s) for _, p in reqs for s in p.stop), default=0) + 4

        cache, logits, mask, next_pos = self._prefill([ids for ids, _ in reqs])
        rows = list(range(b))  # batch row -> request index, shrinks as requests finish
        while live:
            idx = torch.tensor([rows.index(r) for r in live]) if len(live) != len(rows) else None
            if idx is not None:
                cache.batch_select_indices(idx.to(dev))
                logits, mask, next_pos = logits[idx], mask[idx], next_pos[idx]
                rows = list(live)
            sel = torch.tensor(rows)
            logp = _process(logits, temps[sel], top_ks_of(top_ks, rows), top_ps[sel], greedy[sel])
            probs = logp.exp()
            tokens = self._sample(logp, probs, [greedy_rows[r] for r in rows], [gens[r] for r in rows])
            ent = -(probs * logp.nan_to_num(neginf=0.0)).sum(-1)
            # one conversion per step rather than a tensor lookup per row
            tok_list = tokens.tolist()
            lp_list = logp.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
            ent_list = ent.tolist()
            still = []
            for j, r in enumerate(rows):
                tok = tok_list[j]
                seg, p = segs[r], reqs[r][1]
                seg.token_ids.append(tok)
                seg.logprobs.append(lp_list[j])
                seg.entropy.append(ent_list[j])
                if p.logprobs:
                    seg.top_logprobs.append(logp[j].topk(p.logprobs).values.tolist())
                if tok in self.eos_ids:
                    seg.finish_reason = "eos"
                elif p.stop and _stop_hit(self.tokenizer, seg.token_ids[-window:], p.stop):
                    seg.finish_reason = "stop"
                    # a tool call: the episode will most likely continue from here
                    self.prefix_cache.keep(reqs[r][0] + seg.token_ids[:-1], cache, j, mask[j])
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

    def _prefill(self, prompts: list[list[int]]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the prompts through the model, starting each from its longest kept prefix.

        Rows are laid out as [pad | kept prefix | pad | new tokens], each block left-padded to
        the batch's widest; the attention mask hides the pads and position ids count only real
        tokens, so every row computes what a full prefill of its prompt would.
        Returns the cache, the last position's logits [b, vocab], the attention mask over the
        cache [b, len] and each row's next position id [b].
        """
        dev = self.device
        b = len(prompts)
        hits = [self.prefix_cache.find(ids) for ids in prompts]
        kept = [0 if h is None else h.length for h in hits]
        news = [ids[k:] for ids, k in zip(prompts, kept, strict=True)]
        width_kept, width_new = max(kept), max(len(x) for x in news)
        input_ids = torch.full((b, width_new), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, width_kept + width_new), dtype=torch.long)
        positions = torch.zeros((b, width_new), dtype=torch.long)
        for row, (new, k) in enumerate(zip(news, kept, strict=True)):
            n = len(new)
            input_ids[row, width_new - n :] = torch.tensor(new)
            mask[row, width_kept - k : width_kept] = 1
            mask[row, width_kept + width_new - n :] = 1
            positions[row, width_new - n :] = torch.arange(k, k + n)
        self.prefix_cache.hit_tokens += sum(kept)
        self.prefix_cache.prefill_tokens += sum(len(x) for x in news)
        past = self.prefix_cache.batch(hits, width_kept, self.model.config, dev) if width_kept else None
        out = self.model(
            input_ids=input_ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=positions.to(dev),
            past_key_values=past,
            use_cache=True,
            logits_to_keep=1,  # only the last position's logits are sampled from
        )
        next_pos = torch.tensor([len(ids) for ids in prompts])
        return out.past_key_values, out.logits[:, -1, :].float().cpu(), mask, next_pos

    def _sample(
        self, logp: torch.Tensor, probs: torch.Tensor, greedy: list[bool], gens: list[torch.Generator | None]
    ) -> torch.Tensor:
        tokens = logp.argmax(-1)
        free = [j for j, g in enumerate(gens) if g is None and not greedy[j]]
        if free:
            tokens[free] = torch.multinomial(probs[free], 1, generator=self.generator).squeeze(1)
        seeded = [j for j, g in enumerate(gens) if g is not None and not greedy[j]]
        if seeded:
            # exponential race: argmax p / E with E ~ Exp(1) is an exact draw from p (what
            # torch.multinomial does for one sample); each row's noise comes from its own
            # generator, and one argmax serves all rows instead of a multinomial call per row
            noise = torch.empty((len(seeded), probs.shape[1]))
            for i, j in enumerate(seeded):
                noise[i].exponential_(1, generator=gens[j])
            tokens[seeded] = (probs[seeded] / noise).argmax(-1)
        return tokens


class _Kept:
    """One kept KV cache: per layer (keys, values) of a single row, [1, kv_heads, length, dim]."""

    __slots__ = ("layers", "length")

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
        self.layers, self.length = layers, length


class PrefixCache:
    """KV caches of finished segments, keyed by the token ids they cover, for reuse by requests
    that extend them; bounded by a token count, oldest dropped first."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: dict[tuple[int, ...], _Kept] = {}
        self._lengths: dict[int, int] = {}  # length -> number of entries of that length
        self._tokens = 0
        self._weights: tuple[int, ...] | None = None
        self.hit_tokens = 0  # prompt tokens served from kept caches
        self.prefill_tokens = 0  # prompt tokens fed through the model

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self._tokens = 0

    def check_weights(self, model: torch.nn.Module) -> None:
        """Drop everything if any parameter changed in place since the last call (optimizer
        steps and `load_state_dict` bump a tensor's version counter)."""
        version = tuple(p._version for p in model.parameters())
        if version != self._weights:
            self.clear()
            self._weights = version

    def keep(self, ids: list[int], cache: Any, row: int, mask: torch.Tensor) -> None:
        if self.max_tokens <= 0 or len(ids) > self.max_tokens:
            return
        real = mask.to(torch.bool)
        if int(real.sum()) != len(ids):  # the cache does not cover exactly these tokens
            return
        real = real.to(cache.layers[0].keys.device)
        layers = [
            (layer.keys[row : row + 1, :, real].clone(), layer.values[row : row + 1, :, real].clone())
            for layer in cache.layers
        ]
        key = tuple(ids)
        if key in self._entries:
            return
        self._entries[key] = _Kept(layers, len(ids))
        self._lengths[len(ids)] = self._lengths.get(len(ids), 0) + 1
        self._tokens += len(ids)
        while self._tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[int, ...]) -> None:
        self._entries.pop(key)
        n = len(key)
        self._tokens -= n
        self._lengths[n] -= 1
        if not self._lengths[n]:
            del self._lengths[n]

    def find(self, ids: list[int]) -> _Kept | None:
        """The longest kept prefix of `ids` that leaves at least one token to feed."""
        for n in sorted(self._lengths, reverse=True):
            if n < len(ids):
                hit = self._entries.get(tuple(ids[:n]))
                if hit is not None:
                    return hit
        return None

    def batch(self, hits: list[_Kept | None], width: int, config: Any, device: torch.device) -> Any:
        """A batched cache of the kept rows, each left-padded with zeros to `width`; rows without
        a hit are all padding (the attention mask hides it)."""
        from transformers import DynamicCache

        ref = next(h for h in hits if h is not None).layers
        past = DynamicCache(config=config)
        for i, (k0, v0) in enumerate(ref):
            keys = k0.new_zeros((len(hits), k0.shape[1], width, k0.shape[3]))
            values = v0.new_zeros((len(hits), v0.shape[1], width, v0.shape[3]))
            for row, h in enumerate(hits):
                if h is not None:
                    keys[row, :, width - h.length :] = h.layers[i][0][0]
                    values[row, :, width - h.length :] = h.layers[i][1][0]
            past.update(keys.to(device), values.to(device), i)
        return past


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


__all__ = ["HFEngine", "PrefixCache"]
