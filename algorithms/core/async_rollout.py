"""Asynchronous off-policy training: the rollouts of step k+1 are generated while step k updates.

Off by default (`max_staleness: 0` is the synchronous loop). With `max_staleness: S > 0`
(docs/scaling.md):

* the policy version is the learner's step count: the weights trained on for step k are version
  k, and the update of step k makes version k+1;
* a producer thread generates the batch of step b (through the learner's own `collect` hook, so
  DAPO's dynamic sampling and the ARPO/AEPO tree rollouts run unchanged) as soon as the engine
  holds version >= b - S; the learner takes batch b when it reaches step b. Every token it trains
  on is therefore at most S versions old;
* the engine is wrapped in `VersionedEngine`: a weight sync waits for engine calls in flight and
  holds back new ones, so each call runs under one version, and every segment it returns is
  stamped with that version (`Trajectory.policy_version`, one entry per segment);
* partial rollouts: a sync lands between engine calls (it waits for the segments being generated:
  one engine call each, not token by token). `partial_rollouts: continue` lets episodes
  in flight go on under the new weights (their later segments carry the new version);
  `drop` discards every group with an episode that spans a sync (whole groups, so GRPO baselines
  stay within one version) and regenerates the batch if no group is left;
* tree rollouts (`Learner.one_version_per_group`: ARPO, AEPO) never mix versions in a tree: the
  sync waits for the batch in flight, so each batch of trees is generated under one version;
* the off-policy gap is corrected by the learner's truncated importance sampling with the
  behaviour log-probs (`rollout_is: tis`, required) and logged as `is_ratio/*`.

With the HF engine the learner's module cannot be decoded from while it is updated: async mode
gives the engine its own copy of the policy (one more set of weights in memory), loaded at each
sync; an engine passed in that decodes with the learner's module is refused. Single process only:
the producer thread would run the rollout's collectives (DAPO's group counts, ARPO's tree
metrics) concurrently with the update's, and ranks would pair them up wrongly.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from algorithms.core.batch import PromptSampler
from algorithms.rollout.engine import SamplingParams, Segment

# one step's trajectories and rollout metrics (`Learner.collect`)
Collect = Callable[[int], tuple[list[Any], dict[str, float]]]


class VersionedEngine:
    """Any rollout engine (HF, vLLM in-process, a server) with the policy version of its weights.

    Engine calls share the weights; a sync is exclusive: it waits until the calls in flight
    return, and calls arriving meanwhile wait for it. `batch()` lets a producer hold syncs back
    for a whole batch (tree rollouts).
    """

    def __init__(self, engine: Any, version: int = 0) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.version = version
        self._cond = threading.Condition()
        self._calls = 0
        self._syncing = False
        self._batches = 0  # producer batches that syncs must wait for
        self._sync_waiting = 0  # syncs waiting for a batch to end: no new batch starts meanwhile
        self.sync_s = 0.0  # the last sync's duration, its waits included (`async/sync_s`)

    # -- engine calls ---------------------------------------------------------------------------

    def _try_enter(self) -> int | None:
        with self._cond:
            if self._syncing:
                return None
            self._calls += 1
            return self.version

    def _exit(self) -> None:
        with self._cond:
            self._calls -= 1
            self._cond.notify_all()

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Segment]:
        with self._cond:
            self._cond.wait_for(lambda: not self._syncing)
            self._calls += 1
            version = self.version
        try:
            segs = self.engine.generate(prompts, params)
        finally:
            self._exit()
        return _stamp(segs, version)

    async def agenerate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Segment]:
        # polled rather than waited for in a thread: a cancelled wait must not leave a call counted
        while (version := self._try_enter()) is None:
            await asyncio.sleep(0.005)
        try:
            segs = await self.engine.agenerate(prompts, params)
        finally:
            self._exit()
        return _stamp(segs, version)

    # -- syncs ----------------------------------------------------------------------------------

    def sync_weights(self, model: Any, version: int | None = None) -> None:
        """Load `model` into the engine as `version` (default: the next one)."""
        t0 = time.perf_counter()
        with self._cond:
            self._sync_waiting += 1
            self._cond.wait_for(lambda: self._batches == 0 and not self._syncing)
            self._sync_waiting -= 1
            self._syncing = True
            self._cond.wait_for(lambda: self._calls == 0)
        try:
            self.engine.sync_weights(model)
        finally:
            with self._cond:
                self.version = self.version + 1 if version is None else version
                self._syncing = False
                self._cond.notify_all()
            self.sync_s = time.perf_counter() - t0

    def wait_version(self, at_least: int, stop: threading.Event) -> bool:
        """Block until the engine holds version >= `at_least`; False if `stop` was set first."""
        with self._cond:
            while self.version < at_least:
                if stop.is_set():
                    return False
                self._cond.wait(timeout=0.1)
        return not stop.is_set()

    def begin_batch(self) -> None:
        """Hold syncs back until `end_batch` (a sync already waiting goes first)."""
        with self._cond:
            self._cond.wait_for(lambda: self._sync_waiting == 0 and not self._syncing)
            self._batches += 1

    def end_batch(self) -> None:
        with self._cond:
            self._batches -= 1
            self._cond.notify_all()

    def __getattr__(self, name: str) -> Any:
        # stats(), max_model_len and the like of the wrapped engine
        if name == "engine":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.engine, name)


def _stamp(segs: list[Segment], version: int) -> list[Segment]:
    for seg in segs:
        seg.policy_version = version
    return segs


def async_engine(engine: Any, *, policy: Any, world: int, max_staleness: int, version: int) -> VersionedEngine:
    """`engine` checked and wrapped for asynchronous training; `policy` is the learner's (unwrapped)
    module, `version` its step."""
    if world > 1:
        raise ValueError(
            f"config field 'max_staleness'={max_staleness}: asynchronous training runs "
            f"in a single process, got {world}; launch without accelerate's multi-process "
            "mode or set max_staleness: 0"
        )
    inner = getattr(engine, "model", None)
    if inner is not None and inner is policy:
        raise ValueError(
            f"config field 'max_staleness'={max_staleness}: the engine passed in decodes "
            "with the learner's own module, which the update changes while it generates; pass an "
            "engine with its own copy of the weights (or none: the learner makes one)"
        )
    return VersionedEngine(engine, version=version)


class AsyncRollout:
    """The producer thread and the hand-over of batches to the learner.

        producer:  wait for version >= b - S, collect(b), [drop mixed groups], hand over batch b
        learner:   take(b), update, publish version b + 1
    """

    def __init__(self, engine: VersionedEngine, collect: Collect, sampler: PromptSampler, *, max_staleness: int,
                 drop: bool, whole_batches: bool) -> None:  # fmt: skip
        """`collect(b)`: batch b's trajectories and metrics (the learner's hook); `sampler`: the
        prompt sampler it draws from; `drop`: `partial_rollouts: drop`; `whole_batches`: the
        learner's `one_version_per_group`."""
        self.engine = engine
        self.collect = collect
        self.sampler = sampler
        self.max_staleness = max_staleness
        self.drop = drop
        self.whole_batches = whole_batches
        self.sampler_state = sampler.state_dict()  # as of the last batch taken
        self._first = 0  # the first batch produced: no sync of this producer came before it
        self._ready: dict[int, tuple[list[Any], dict[str, float], dict[str, int]]] = {}
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, first: int, end: int) -> None:
        self._first = first
        self._thread = threading.Thread(
            target=self._produce, args=(first, end), name="async-rollout", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop producing; waits for a batch in flight, so no rollout outlives the run."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    # -- producer -------------------------------------------------------------------------------

    def _produce(self, first: int, end: int) -> None:
        try:
            for b in range(first, end):
                if not self.engine.wait_version(b - self.max_staleness, self._stop):
                    return
                t0 = time.perf_counter()
                trajs, metrics, dropped = self._collect(b)
                metrics = {
                    **metrics,
                    "async/dropped": float(dropped),
                    "async/generate_s": time.perf_counter() - t0,
                }
                state = self.sampler.state_dict()
                with self._cond:
                    self._ready[b] = (trajs, metrics, state)
                    self._cond.notify_all()
        except BaseException as exc:  # handed to the learner thread, which raises it
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _collect(self, b: int) -> tuple[list[Any], dict[str, float], int]:
        dropped = 0
        while True:
            if self.whole_batches:
                self.engine.begin_batch()
                try:
                    trajs, metrics = self.collect(b)
                finally:
                    self.engine.end_batch()
            else:
                trajs, metrics = self.collect(b)
            if not self.drop:
                return trajs, metrics, dropped
            mixed = {t.group_id for t in trajs if len(set(t.policy_version)) > 1}
            kept = [t for t in trajs if t.group_id not in mixed]
            dropped += len(trajs) - len(kept)
            # the learner waits for this batch, so after at most S more syncs a regeneration
            # runs under one version throughout
            if kept:
                return kept, metrics, dropped

    # -- learner side ---------------------------------------------------------------------------

    def take(self, step: int) -> tuple[list[Any], dict[str, float]]:
        """Batch `step` (waiting for it) with its `async/*` metrics; checks the staleness bound."""
        t0 = time.perf_counter()
        with self._cond:
            self._cond.wait_for(lambda: step in self._ready or self._error is not None)
            if self._error is not None:
                error = self._error
                raise RuntimeError(f"asynchronous rollout of step {step} failed: {error!r}") from error
            trajs, metrics, self.sampler_state = self._ready.pop(step)
        wait = time.perf_counter() - t0
        # the last sync's duration: it waits for the engine calls in flight (this batch's)
        sync_s = self.engine.sync_s if step > self._first else 0.0
        ages = [step - min(t.policy_version) for t in trajs if t.policy_version]
        worst = max(ages, default=0)
        if worst > self.max_staleness:
            raise RuntimeError(
                f"asynchronous rollout: a trajectory of step {step} is {worst} policy versions old, "
                f"over max_staleness={self.max_staleness}"
            )
        return trajs, {
            **metrics,
            "async/staleness_mean": sum(ages) / len(ages) if ages else 0.0,
            "async/staleness_max": float(worst),
            "async/partial": float(sum(len(set(t.policy_version)) > 1 for t in trajs)),
            "async/wait_s": wait,
            "async/sync_s": sync_s,
            # generation the update hid: what the learner waited for neither in the sync before
            # this batch nor when taking it
            "async/overlap_s": max(0.0, metrics["async/generate_s"] - wait - sync_s),
        }


__all__ = ["AsyncRollout", "VersionedEngine", "async_engine"]
