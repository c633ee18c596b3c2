"""The rollout engine interface: token-id prompts in, generated segments out.

Every engine (`HFEngine`, `VLLMEngine`, `OpenAIEngine`) takes prompts as lists of token ids and
returns one `Segment` per sample: the generated ids exactly as produced, the log-probability of
each (from the distribution actually sampled: after temperature, top-k and top-p), optional
top-k log-probs per position (for entropy), and why generation stopped.

    >>> from algorithms.rollout import HFEngine, SamplingParams
    >>> from algorithms.models.tiny import build_tiny_model
    >>> engine = HFEngine(build_tiny_model())
    >>> ids = engine.tokenizer("<|im_start|>user\\nhi<|im_end|>\\n")["input_ids"]
    >>> [seg] = engine.generate([ids], SamplingParams(max_tokens=8))
    >>> len(seg.token_ids) == len(seg.logprobs) <= 8
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "eos"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request.

    temperature 0 means greedy. `top_k=-1` and `top_p=1.0` turn those filters off (do so
    explicitly for on-policy RL at T=1). `stop` strings end a segment; the returned text and ids
    include the stop string. `seed` makes one request reproducible. `n` samples per prompt.
    `logprobs=k > 0` also returns the top-k log-probs per position (k <= the engine's cap, 20
    by default); the sampled token's log-prob is always returned.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop: Sequence[str] = field(default_factory=list)
    seed: int | None = None
    n: int = 1
    logprobs: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p={self.top_p} must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k={self.top_k} must be -1 (off) or >= 1")
        if self.max_tokens < 0:
            raise ValueError(f"SamplingParams.max_tokens={self.max_tokens} must be >= 0")
        if self.n < 1:
            raise ValueError(f"SamplingParams.n={self.n} must be >= 1")
        if self.logprobs < 0:
            raise ValueError(
                f"SamplingParams.logprobs={self.logprobs} must be >= 0 (k of the top-k log-probs)"
            )
        if isinstance(self.stop, str):
            raise TypeError(f"SamplingParams.stop must be a list of strings, got the string {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def with_(self, **changes: Any) -> SamplingParams:
        """A copy with some fields changed (e.g. a branch's own `max_tokens`)."""
        return replace(self, **changes)


@dataclass
class Segment:
    """One generated continuation.

    `token_ids` are the ids the engine produced (including a sampled EOS and the token that
    completed a stop string); `logprobs[i]` is the log-prob of `token_ids[i]` under the sampled
    distribution. `top_logprobs[i]` holds the k largest log-probs at position i (descending),
    when requested. `entropy[i]` is the exact entropy of the sampled distribution at position i
    where the engine can compute it (HF), else None. `text` is the decoded text, cut right after
    the stop string when one matched (`stop_str`). `policy_version` is None unless the engine
    is wrapped by asynchronous training (`algorithms.core.async_rollout.VersionedEngine`).
    """

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[float]] | None = None
    finish_reason: FinishReason = "length"
    stop_str: str | None = None
    text: str = ""
    entropy: list[float] | None = None
    policy_version: int | None = None  # set by asynchronous training: the weights that produced it

    def __len__(self) -> int:
        return len(self.token_ids)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the runner and the learners need from an engine."""

    tokenizer: Any

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Segment]:
        """n segments per prompt, prompt-major order."""
        ...

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Segment]: ...

    def sync_weights(self, model: Any) -> None:
        """Load the learner's current weights into the engine: a torch module, or, from a sharded
        learner, a full state dict or a stream of (name, tensor) pairs (`VLLMEngine` takes all three)."""
        ...


def per_request(
    prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
) -> list[SamplingParams]:
    """One `SamplingParams` per prompt, checking that lists line up."""
    if isinstance(params, SamplingParams):
        return [params] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        raise ValueError(
            f"got {len(prompts)} prompts but {len(params)} SamplingParams; pass one or one per prompt"
        )
    return params


def hold_threads(count: int) -> None:
    """Run the calling thread's torch work on `count` threads.

    torch keeps its OpenMP thread count per thread, and the in-process engines decode on the env
    loop's executor threads, which outlive a run: one that ran torch work under an earlier count
    keeps it (other float rounding, or more threads than the run asked for). The builtin setter,
    because a started vLLM CPU engine turns `torch.set_num_threads` into a no-op.
    """
    import torch

    if torch.get_num_threads() != count:
        torch._C.set_num_threads(count)


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """The text up to and including the earliest stop string, and that stop string."""
    best, which = len(text) + 1, None
    for s in stops:
        i = text.find(s) if s else -1
        if i >= 0 and i + len(s) < best:
            best, which = i + len(s), s
    return (text[:best], which) if which is not None else (text, None)


def topk_entropy(top_logprobs: Sequence[float]) -> float:
    """Entropy restricted to the returned top-k entries: -sum p log p (ARPO's truncated entropy)."""
    return -sum(math.exp(lp) * lp for lp in top_logprobs if lp > -math.inf)


__all__ = [
    "FinishReason",
    "RolloutEngine",
    "SamplingParams",
    "Segment",
    "cut_at_stop",
    "hold_threads",
    "per_request",
    "topk_entropy",
]
