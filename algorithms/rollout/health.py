"""Rollout health checks: cheap tests, run on every batch, that the data a learner trains on is
what the rollout produced and what the docs promise (docs/diagnostics.md).

    >>> from algorithms.rollout.health import HealthChecker
    >>> from algorithms.rollout.trajectory import Trajectory
    >>> t = Trajectory(prompt_ids=[1], response_ids=[5, 6, 7, 8], loss_mask=[1, 1, 0, 0],
    ...                logprobs=[-0.1, -0.2, 0.0, 0.0], segment_starts=[0], traj_id=3, task_id="t")
    >>> checker = HealthChecker(max_response_tokens=16)
    >>> report = checker.check([t])
    >>> report.counts["loss_mask"], t.health
    (0, [])
    >>> t.loss_mask = [0, 1, 1, 0]   # shifted by one: the segment started at 0
    >>> report = checker.check([t])
    >>> report.counts["loss_mask"], t.health
    (1, ['loss_mask'])
    >>> print(report.first["loss_mask"])
    rollout health check 'loss_mask' failed: trajectory 3 (task 't') at response token 0: mask 0 where segment_starts=[0] says otherwise

Checks (each names the trajectory, task and response-token index of its first failure):

- `prefix`: every generated segment is exactly what the engine produced from exactly the
  context the trajectory holds before it (needs a `RecordedEngine`, which remembers each
  request's context and output);
- `loss_mask`: the mask is 1 on the engine's tokens and 0 on everything the env inserted;
- `truncation`: an episode cut by the token budget is flagged `truncated` with an `end_reason`,
  and scored as docs/rollout.md says: the env grades the partial response, which has no answer,
  so it gets the recipe's format-failure value;
- `reward`: the reward is finite and within the recipe's range;
- `logprob`: the trainer's recomputed log-probs agree with the engine's (learners only).

`render_drift` is counted but is not a fault: it says the ids differ from what decoding and
re-encoding the text gives (the engine sampled a non-canonical tokenization). The runner never
re-encodes, so training is unaffected; a text-based pipeline (SFT on rendered text) would train
on other ids from that index on.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from algorithms.rollout.engine import Segment, per_request

HealthMode = Literal["warn", "fatal", "off"]
FAULTS = ("prefix", "loss_mask", "truncation", "reward", "logprob")
NOTES = ("render_drift",)
CHECKS = FAULTS + NOTES


class RolloutHealthWarning(UserWarning):
    """A rollout health check failed (docs/diagnostics.md)."""


class RolloutHealthError(RuntimeError):
    """A rollout health check failed with `health_checks: fatal`."""


@dataclass(frozen=True)
class Finding:
    """The first failure of one check in a batch."""

    check: str
    traj_id: int
    task_id: str
    index: int  # response-token index (0 = the first token after the prompt)
    detail: str

    def __str__(self) -> str:
        return (f"rollout health check {self.check!r} failed: trajectory {self.traj_id} "
                f"(task {self.task_id!r}) at response token {self.index}: {self.detail}")


@dataclass
class HealthReport:
    """Counts of trajectories failing each check, the first failure of each, and the time taken."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHECKS, 0))
    first: dict[str, Finding] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, finding: Finding) -> None:
        self.counts[finding.check] += 1
        self.first.setdefault(finding.check, finding)

    @property
    def faults(self) -> list[Finding]:
        return [self.first[c] for c in FAULTS if c in self.first]

    def metrics(self, prefix: str = "health/") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in self.counts.items()}


class RecordedEngine:
    """A rollout engine that remembers, per request, the context it was given and the ids it
    produced; everything else is the wrapped engine's. `clear()` forgets (once per batch)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._outputs: dict[tuple[int, ...], list[tuple[int, ...]]] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "_engine":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._engine, name)

    @property
    def wrapped(self) -> Any:
        return self._engine

    def generate(self, prompts: Sequence[Sequence[int]], params: Any) -> list[Segment]:
        segs = self._engine.generate(prompts, params)
        self._record(prompts, params, segs)
        return segs

    async def agenerate(self, prompts: Sequence[Sequence[int]], params: Any) -> list[Segment]:
        segs = await self._engine.agenerate(prompts, params)
        self._record(prompts, params, segs)
        return segs

    def _record(self, prompts: Sequence[Sequence[int]], params: Any, segs: Sequence[Segment]) -> None:
        it = iter(segs)
        for prompt, p in zip(prompts, per_request(prompts, params), strict=True):
            outs = self._outputs.setdefault(tuple(prompt), [])
            outs += [tuple(next(it).token_ids) for _ in range(p.n)]

    def produced(self, context: Sequence[int]) -> list[tuple[int, ...]] | None:
        """What the engine generated from exactly this context, or None if it never saw it."""
        return self._outputs.get(tuple(context))

    @property
    def contexts(self) -> int:
        """How many distinct contexts were recorded since the last `clear()`."""
        return len(self._outputs)

    def clear(self) -> None:
        self._outputs.clear()

    def forget(self, trajectories: Sequence[Any]) -> None:
        """Forget the contexts these trajectories were generated from, and keep the rest: with
        asynchronous training the next batch is being recorded while this one is checked."""
        for t in trajectories:
            for start in t.segment_starts:
                self._outputs.pop(tuple(t.prompt_ids + t.response_ids[:start]), None)


@dataclass
class HealthChecker:
    """Runs the trajectory checks of a batch, fills `Trajectory.health`, and warns or raises.

    mode: `warn` (a `RolloutHealthWarning` naming the first offending trajectory of each failed
    check), `fatal` (a `RolloutHealthError` instead) or `off` (the caller skips the checks).
    max_response_tokens: the rollout's token budget (the truncation check needs it).
    reward_bounds: the recipe's (low, high), when known; format_failure_reward: the recipe's
    value for a response that fails the format check, when known.
    logprob_tol: the largest |engine − trainer| log-prob difference on a trained token (nats).
    """

    mode: HealthMode = "warn"
    engine: RecordedEngine | None = None
    tokenizer: Any = None
    max_response_tokens: int | None = None
    reward_bounds: tuple[float, float] | None = None
    format_failure_reward: float | None = None
    logprob_tol: float = 1.0

    @classmethod
    def for_env(cls, env: Any, **kwargs: Any) -> HealthChecker:
        """A checker that knows the env's reward recipe (its range and format-failure value)."""
        recipe = getattr(env, "reward_fn", None)
        if hasattr(recipe, "bounds"):
            kwargs.setdefault("reward_bounds", recipe.bounds(getattr(env, "max_tool_calls", None)))
            kwargs.setdefault("format_failure_reward", recipe.format_failure_score)
        return cls(**kwargs)

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    # ---- the batch ------------------------------------------------------------------------------

    def check(self, trajectories: Sequence[Any]) -> HealthReport:
        """Check every trajectory; failures go into its `health` list and the report."""
        t0 = time.perf_counter()
        report = HealthReport()
        # trajectories that never met this engine (replayed, scripted) cannot be compared with it
        record = self.engine if self.engine is not None and self.engine.contexts else None
        found = [(t, f) for t in trajectories for f in self.check_one(t, record)]
        if self.tokenizer is not None:
            found += self._render_drift(trajectories)
        for t, finding in found:
            if finding.check not in t.health:
                t.health.append(finding.check)
            report.add(finding)
        report.seconds = time.perf_counter() - t0
        return report

    def check_one(self, t: Any, record: RecordedEngine | None = None) -> list[Finding]:
        out = []
        lengths = None
        if record is not None:
            found, lengths = self._prefix(t, record)
            out += found
        out += self._loss_mask(t, lengths)
        out += self._truncation(t)
        out += self._reward(t)
        return out

    def _finding(self, t: Any, check: str, index: int, detail: str) -> Finding:
        return Finding(check, int(t.traj_id), str(t.task_id), int(index), detail)

    def _prefix(self, t: Any, record: RecordedEngine) -> tuple[list[Finding], list[int] | None]:
        """Each segment against the engine's record; returns the segments' lengths when all match."""
        lengths = []
        for k, start in enumerate(t.segment_starts):
            context = list(t.prompt_ids) + list(t.response_ids[:start])
            outs = record.produced(context)
            if not outs:
                return [self._finding(
                    t, "prefix", start,
                    f"the engine never generated from the context before segment {k}: an earlier "
                    "token was changed after generation, or the context was re-rendered",
                )], None
            here = list(t.response_ids[start:])
            match = next((o for o in outs if here[: len(o)] == list(o)), None)
            stitched = None if match is not None else _stitched(record, context, here, 0)
            if stitched is not None:
                lengths.append(stitched)
                continue
            if match is None:
                best = max(outs, key=lambda o: _common_prefix(here, o))
                at = start + _common_prefix(here, best)
                return [self._finding(
                    t, "prefix", at,
                    f"segment {k} differs from the ids the engine produced (id {_at(here, at - start)} "
                    f"where the engine gave {_at(best, at - start)}): the ids were re-tokenized or edited",
                )], None
            lengths.append(len(match))
        return [], lengths

    def _loss_mask(self, t: Any, lengths: list[int] | None) -> list[Finding]:
        mask = list(t.loss_mask)
        n = len(t.response_ids)
        if len(mask) != n or len(t.logprobs) != n:
            return [self._finding(t, "loss_mask", min(len(mask), len(t.logprobs), n),
                                  f"len(loss_mask)={len(mask)}, len(logprobs)={len(t.logprobs)}, "
                                  f"len(response_ids)={n}")]
        starts = list(t.segment_starts)
        if not starts:  # not from the runner: nothing says which tokens were generated
            return []
        if lengths is not None:  # the engine's record says exactly which tokens it generated
            want = [0] * n
            for s, m in zip(starts, lengths, strict=True):
                want[s : s + m] = [1] * min(m, n - s)
            bad = next((i for i in range(n) if mask[i] != want[i]), None)
            if bad is not None:
                what = "an env-inserted (tool/observation) token" if want[bad] == 0 else "a generated token"
                return [self._finding(t, "loss_mask", bad, f"{what} has mask {mask[bad]}")]
            return []
        # without the record: every run of 1s starts at a segment start and every segment starts with 1
        begin = set(starts)
        for i in range(n):
            run_start = mask[i] == 1 and (i == 0 or mask[i - 1] == 0)
            if (run_start and i not in begin) or (i in begin and mask[i] != 1):
                return [self._finding(t, "loss_mask", i,
                                      f"mask {mask[i]} where segment_starts={starts} says otherwise")]
        return []

    def _truncation(self, t: Any) -> list[Finding]:
        n = len(t.response_ids)
        budget = self.max_response_tokens
        comps = t.components or {}
        # an answer that ends exactly at the budget is an answer (docs/rollout.md)
        cut = budget is not None and n >= budget and t.finish_reason == "length"
        if cut and not t.truncated and comps.get("stop_reason") != "answer":
            return [self._finding(t, "truncation", n - 1,
                                  f"the episode used the whole budget of {budget} tokens and its last "
                                  f"segment stopped on length, but truncated=False (end_reason={t.end_reason!r})")]
        if not t.truncated:
            return []
        if not t.end_reason:
            return [self._finding(t, "truncation", n - 1, "truncated=True without an end_reason")]
        if budget is not None and n > budget:
            return [self._finding(t, "truncation", budget, f"{n} response tokens exceed the budget of {budget}")]
        if "reward" in comps and not _same(comps["reward"], t.reward):
            return [self._finding(t, "truncation", n - 1,
                                  f"reward {t.reward} is not the env's score of the partial response "
                                  f"({comps['reward']})")]
        if comps.get("format_ok") or comps.get("stop_reason") == "answer":
            why = "a truncated response has no answer, yet this one was graded as answered"
            if budget is not None and n <= budget:
                # the env counts its budget by re-encoding text; a non-canonical or byte-split
                # sampled tokenization re-encodes longer than the engine's ids
                why += (f" ({n} engine tokens fit the budget of {budget}: the env's count of the "
                        "re-encoded text did not; see render_drift)")
            return [self._finding(t, "truncation", n - 1, why)]
        if self.format_failure_reward is not None and not _same(t.reward, self.format_failure_reward):
            return [self._finding(t, "truncation", n - 1,
                                  f"reward {t.reward}: a truncated response fails the format check and "
                                  f"scores the recipe's {self.format_failure_reward}")]
        return []

    def _reward(self, t: Any) -> list[Finding]:
        r = float(t.reward)
        if not math.isfinite(r):
            return [self._finding(t, "reward", len(t.response_ids) - 1, f"reward {r} is not finite")]
        if self.reward_bounds is not None:
            low, high = self.reward_bounds
            if not low - 1e-9 <= r <= high + 1e-9:
                return [self._finding(t, "reward", len(t.response_ids) - 1,
                                      f"reward {r} is outside the recipe's range [{low}, {high}]")]
        return []

    def _render_drift(self, trajectories: Sequence[Any]) -> list[tuple[Any, Finding]]:
        """Decode and re-encode every trajectory (one batched tokenizer call each way)."""
        if not trajectories:
            return []
        ids = [list(t.prompt_ids) + list(t.response_ids) for t in trajectories]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=False)
        again = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        out = []
        for t, mine, other in zip(trajectories, ids, again, strict=True):
            at = _common_prefix(mine, other)
            if at == len(mine) == len(other):
                continue
            out.append((t, self._finding(t, "render_drift", at - len(t.prompt_ids),
                                         f"decoding and re-encoding gives id {_at(other, at)} where the "
                                         f"engine's id is {_at(mine, at)}")))
        return out

    # ---- trainer against engine ---------------------------------------------------------------

    def logprob_findings(self, trajectories: Sequence[Any], diffs: dict[int, tuple[float, int]]) -> list[Finding]:
        """`diffs[row] = (max |engine − trainer|, its response-token index)` per batch row."""
        out = []
        for row, (worst, index) in sorted(diffs.items()):
            if worst > self.logprob_tol:
                t = trajectories[row]
                if "logprob" not in t.health:
                    t.health.append("logprob")
                out.append(self._finding(t, "logprob", index,
                                         f"|engine − trainer| log-prob = {worst:.3g} nats > {self.logprob_tol}"))
        return out

    # ---- telling people -----------------------------------------------------------------------

    def raise_or_warn(self, findings: Sequence[Finding]) -> None:
        """One warning (or, when fatal, one error) for the given first failures."""
        findings = [f for f in findings if f.check in FAULTS]
        if not findings or not self.enabled:
            return
        text = "; ".join(str(f) for f in findings) + " (docs/diagnostics.md)"
        if self.mode == "fatal":
            raise RolloutHealthError(text)
        warnings.warn(text, RolloutHealthWarning, stacklevel=3)


def _stitched(record: RecordedEngine, context: list[int], here: list[int], done: int) -> int | None:
    """The length of a segment stitched from engine outputs, or None.

    A tree fork inside a turn (`tree.branch_rule: entropy_value`) keeps the start of its parent's
    output and continues it: a piece of one output is followed by what the engine produced from
    exactly the context that piece ends, and so on.
    """
    outs = record.produced(context + here[:done]) or []
    rest = here[done:]
    for o in outs:
        if rest[: len(o)] == list(o):
            return done + len(o)
    # the fork may have sampled what the output had next, so any shared length can be the cut
    for shared in range(max((_common_prefix(rest, o) for o in outs), default=0), 0, -1):
        if record.produced(context + here[: done + shared]) is not None:
            got = _stitched(record, context, here, done + shared)
            if got is not None:
                return got
    return None


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _at(seq: Sequence[int], i: int) -> str:
    return str(seq[i]) if 0 <= i < len(seq) else "(end)"


def _same(a: Any, b: Any) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)
    except (TypeError, ValueError):
        return False


__all__ = [
    "CHECKS",
    "FAULTS",
    "Finding",
    "HealthChecker",
    "HealthMode",
    "HealthReport",
    "RecordedEngine",
    "RolloutHealthError",
    "RolloutHealthWarning",
]
