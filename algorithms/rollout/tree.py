"""Tree rollouts (ARPO, AEPO and the other branch rules) as a strategy over the multi-turn runner.

Per prompt, with a global budget of M trajectories (docs/algorithms.md §6.4), under the default
branch rule `entropy` (ARPO's; `tree.branch_rule`, `branch_rules/`, docs/algorithms.md §6.10):

1. start N branches from the prompt (AEPO pre-monitoring may choose N per prompt, §7.2);
2. generate one segment for every active branch in one batched engine call, each with its own
   remaining token budget and `logprobs=K`;
3. a branch's first segment sets its initial entropy H_init; a later segment starts right after a
   tool result, and its entropy decides, retroactively, whether to branch *at that result*:
   each eligible source draws up to Z − 1 forks with P = clip((α + β·ΔH)·penalty, 0, 1), while
   the prompt has fewer than M branches. A fork copies the prefix up to and including the result
   (ids, mask, log-probs) and the env state saved there, inherits the root's H_init, and samples
   its own continuation in the next iteration;
4. the other segments go to their envs (tool calls run concurrently; results appended, mask 0);
5. a prompt whose branches have all ended with fewer than M gets the missing ones from the prompt.

A wave rule (`turn`, `entropy_value`, `mixed_outcome`) skips step 3; at step 5 it first names
anchors among the ended branches (a branch and a response offset), and each anchor becomes a fork
from the env saved at the tool result at or before it (`_fork_at`), which joins the loop at
step 2; top-ups take what is left. The loop is the same for every rule.

Exactly M trajectories per prompt come back (initial branches, then forks and top-ups in creation
order), each with its lineage: `traj_id`, `parent_id`, `branch_offset`, and `lineage` (root id,
depth, kind, H_init, and `segment_entropy`: H_seg of every generated segment, aligned with
`segment_starts`, so the entropy of the first k tokens after each tool result). Everything a call needs is
created in that call (no state carries over, docs/algorithms.md D1); with the same `seed`, two calls make the
same decisions. Evaluation never branches.

    >>> import gymnasium as gym, agent_envs
    >>> from algorithms.models.tiny import build_tiny_model
    >>> from algorithms.rollout import HFEngine, SamplingParams
    >>> from algorithms.rollout.tree_config import TreeConfig
    >>> engine = HFEngine(build_tiny_model())
    >>> make_env = lambda: gym.make("AgentMath-v0", tokenizer=engine.tokenizer).unwrapped
    >>> tree = TreeRollout(engine, TreeConfig(initial_rollouts=2), budget=4)
    >>> result = tree.rollout(make_env, SamplingParams(), n_prompts=2, max_response_tokens=24, seed=0)
    >>> len(result.trajectories)
    8
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from algorithms.base.seeds import TREE_ID_STRIDE, tree_traj_id
from algorithms.rollout.branch_rules import Anchor, BranchRule, BranchView, get_rule
from algorithms.rollout.branching import premonitor_global_samples
from algorithms.rollout.engine import RolloutEngine, SamplingParams, Segment
from algorithms.rollout.entropy import measure_segment, position_entropies
from algorithms.rollout.runner import (
    EpisodeBranch,
    generate_segments,
    run_branches,
    start_group,
    step_branches,
)
from algorithms.rollout.trajectory import Trajectory
from algorithms.rollout.tree_config import TreeConfig
from algorithms.rollout.tree_stats import BRANCH_TOKENS, PromptStats, TreeRolloutResult


@dataclass
class _Node:
    """Tree bookkeeping of one branch, beside the runner's `EpisodeBranch`."""

    branch: EpisodeBranch
    prompt: int
    kind: str  # initial | fork | topup | probe
    h_init: float | None = None
    consecutive: int = 0
    born_at: int | None = None  # response offset where this fork was created (not eligible there)
    seg_h: list[float | None] = field(default_factory=list)  # H_seg of each segment, by segment_starts
    # wave rules only: the env saved at each boundary the branch passed ({offset: (env, state)}),
    # per-position entropies of each segment, and a partial turn to resume (a fork inside a turn)
    snaps: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    pos_h: list[list[float]] = field(default_factory=list)
    pending: _Partial | None = None
    score: float | None = None  # the wave rule's score of this fork's anchor
    measured: bool = False  # a fork's entropy at its branch point is in PromptStats.branch_h


@dataclass
class _Partial:
    """The start of a turn a fork copies from its parent and continues (`entropy_value`)."""

    start: int  # the turn's first response offset (a boundary)
    ids: list[int]
    logprobs: list[float]
    entropy: list[float] | None
    pos_h: list[float]
    text: str


def _executed_calls(branch: EpisodeBranch) -> int:
    metrics = getattr(branch.env, "metrics", None)
    return sum(metrics.calls.values()) if metrics is not None else 0


class TreeRollout:
    """ARPO/AEPO tree rollouts over the runner's `EpisodeBranch` / `generate_segments` / `step_branches`.

    Args:
        engine: any `RolloutEngine`; it must return top-K log-probs (`logprobs=K`) or exact
            entropies, as the config's `entropy_source` requires.
        config: `TreeConfig`.
        budget: M, trajectories per prompt (the learner's `group_size`).
        vocab_size: |V| for the ln|V| normalisation; defaults to `len(tokenizer.get_vocab())`
            (the reference's choice).
    """

    def __init__(
        self, engine: RolloutEngine, config: TreeConfig, *, budget: int, vocab_size: int | None = None
    ) -> None:
        if budget < 1:
            raise ValueError(f"tree rollout: the budget M (group_size) must be >= 1, got {budget}")
        if budget >= TREE_ID_STRIDE - 1:
            raise ValueError(f"tree rollout: budget M={budget} is too large (max {TREE_ID_STRIDE - 2})")
        self.engine = engine
        self.config = config
        self.budget = budget
        self.vocab_size = vocab_size or len(engine.tokenizer.get_vocab())
        self.rule: BranchRule = get_rule(config.branch_rule)

    def rollout(self, *args: Any, **kwargs: Any) -> TreeRolloutResult:
        """Blocking `arollout` (outside a running event loop)."""
        return asyncio.run(self.arollout(*args, **kwargs))

    async def arollout(
        self,
        envs: Sequence[Any] | Callable[[], Any],
        params: SamplingParams,
        *,
        max_response_tokens: int,
        tasks: Sequence[Any] | None = None,
        n_prompts: int | None = None,
        group_ids: Sequence[int] | None = None,
        seed: int | None = 0,
        seeds: Sequence[int | None] | None = None,
        evaluate: bool = False,
        eval_group_size: int = 1,
    ) -> TreeRolloutResult:
        """Run one tree rollout call: exactly M trajectories per prompt (`eval_group_size`
        unbranched ones with `evaluate=True` or greedy sampling).

        `envs`, `tasks`, `n_prompts` as in `run_episodes`. `group_ids` overrides the group id of
        each prompt (default: its index). `seeds[i]` seeds prompt i's env reset and branch draws
        (default `seed + i`), and `seed` the engine requests unless `params.seed` is set; so a
        prompt's tree depends only on its own seed, not on the other prompts of the call.
        """
        # One function, long on purpose: it is the paper's tree-rollout algorithm (initial
        # samples, entropy probes, branching, top-ups to exactly M) read top to bottom.
        cfg = self.config
        rule = self.rule
        if max_response_tokens <= 0:
            raise ValueError(f"tree rollout: max_response_tokens={max_response_tokens} must be > 0")
        env_list = self._envs(envs, tasks, n_prompts)
        gids = list(group_ids) if group_ids is not None else list(range(len(env_list)))
        if len(gids) != len(env_list):
            raise ValueError(f"tree rollout: {len(gids)} group_ids for {len(env_list)} prompts")
        req = params.with_(
            logprobs=max(params.logprobs, cfg.entropy_topk if cfg.entropy_source != "exact" else 0)
        )
        if req.seed is None and seed is not None:
            req = req.with_(seed=seed)  # per-branch request seeds derive from it (runner.segment_params)
        if seeds is None:
            seeds = [None if seed is None else seed + i for i in range(len(env_list))]
        if len(seeds) != len(env_list):
            raise ValueError(f"tree rollout: {len(seeds)} seeds for {len(env_list)} prompts")
        rngs = [random.Random(s) for s in seeds]
        stats = [PromptStats() for _ in env_list]
        # pristine copies right after reset: top-ups and probes start from these
        roots: list[tuple[Any, list[int], str]] = []
        for i, env in enumerate(env_list):
            options = None
            if tasks is not None:
                t = tasks[i]
                options = {"index": t} if isinstance(t, int) else {"task": t}
            [seed_branch] = start_group(
                env,
                self.engine.tokenizer,
                gids[i],
                1,
                tree_traj_id(gids[i], 0),
                seed=seeds[i],
                options=options,
            )
            roots.append((env.fork(), seed_branch.prompt_ids, seed_branch.task_id))

        if evaluate or params.greedy:
            return await self._flat(roots, gids, req, max_response_tokens, eval_group_size, stats)

        initial = [min(max(cfg.initial_rollouts, 1), self.budget)] * len(roots)
        nodes: list[list[_Node]] = [[] for _ in roots]
        if cfg.enable_dynamic_rollouts:
            initial = await self._premonitor(roots, gids, req, max_response_tokens, stats, nodes)
        for i, k in enumerate(initial):
            for _ in range(k - len(nodes[i])):
                nodes[i].append(self._fresh(i, roots[i], gids[i], len(nodes[i]), "initial"))
            stats[i].initial = k

        used = [len(ns) for ns in nodes]
        prompt_streak = [0] * len(roots)  # the reference's per-prompt consecutive counter
        while True:
            active = [nd for ns in nodes for nd in ns if nd.branch.active]
            if not active:
                break
            resumed = [_resume(nd) for nd in active]
            segs = await generate_segments(self.engine, [nd.branch for nd in active], req, max_response_tokens)
            for nd, seg in zip(active, segs, strict=True):
                stats[nd.prompt].generated_tokens += len(seg.token_ids)
                stats[nd.prompt].engine_calls += 1
                if nd.kind == "fork" and not nd.measured:  # its first segment starts at the branch point
                    exact = seg.entropy if seg.entropy is not None else self._position_entropies(seg)
                    nd.measured, hs = True, list(exact)[:BRANCH_TOKENS]
                    stats[nd.prompt].branch_h += [sum(hs) / len(hs)] if hs else []
            grew = [False] * len(roots)
            # branch decisions, per prompt in ascending branch id (they are created in that order)
            for nd, seg in zip(active, segs, strict=True):
                h = measure_segment(seg.top_logprobs, seg.entropy, cfg, self.vocab_size)
                nd.seg_h.append(h)
                if rule.needs_token_entropy:
                    nd.pos_h.append(self._position_entropies(seg))
                start = nd.branch.segment_starts[-1]
                if start == 0:
                    if nd.h_init is None:  # a fork inside the first turn keeps its root's
                        nd.h_init = h
                    continue
                if not rule.online:
                    continue
                if h is None or nd.h_init is None or nd.born_at == start or used[nd.prompt] >= self.budget:
                    continue
                made = self._branch(nd, h - nd.h_init, nodes, used, prompt_streak, rngs[nd.prompt], stats)
                grew[nd.prompt] |= made > 0
            segs = [
                _merge(nd, seg, part) if part else seg for nd, seg, part in zip(active, segs, resumed, strict=True)
            ]
            await step_branches([nd.branch for nd in active], segs, self.engine.tokenizer, max_response_tokens)
            self._save_boundaries(active)
            for i, ns in enumerate(nodes):
                if used[i] < self.budget and not any(nd.branch.active for nd in ns):
                    k = self.budget - used[i] if cfg.topup_mode == "all" else 1
                    if not rule.online:  # the next wave: the rule's anchors, then top-ups
                        k = rule.wave_size(stats[i].initial, self.budget - used[i])
                        for a in self._anchors(rule, ns, k, rngs[i]):
                            ns.append(self._fork_at(ns, a, tree_traj_id(gids[i], used[i])))
                            used[i] += 1
                            stats[i].forks += 1
                            k -= 1
                    for _ in range(k):
                        ns.append(self._fresh(i, roots[i], gids[i], used[i], "topup"))
                        used[i] += 1
                        stats[i].topups += 1
                    grew[i] = True
            for i in range(len(roots)):
                prompt_streak[i] = prompt_streak[i] + 1 if grew[i] else 0

        out: list[Trajectory] = []
        kept_branches: list[EpisodeBranch] = []
        for i, ns in enumerate(nodes):
            kept = [nd for nd in ns if nd.kind != "probe"]
            if len(kept) != self.budget:  # never duplicate to fill a group (docs/algorithms.md D20)
                raise RuntimeError(
                    f"tree rollout: prompt {i} ended with {len(kept)} trajectories, expected {self.budget}"
                )
            for nd in kept:
                stats[i].tool_calls += _executed_calls(nd.branch)
                nd.branch.lineage.update(kind=nd.kind, h_init=nd.h_init, segment_entropy=list(nd.seg_h))
                if nd.score is not None:
                    nd.branch.lineage["branch_score"] = nd.score
                out.append(nd.branch.to_trajectory())
                kept_branches.append(nd.branch)
            for nd in ns:
                nd.snaps.clear()  # release the saved envs (and their sandbox sessions) now
        return TreeRolloutResult(out, stats, kept_branches)

    # -- pieces ---------------------------------------------------------------------------

    def _envs(
        self, envs: Sequence[Any] | Callable[[], Any], tasks: Sequence[Any] | None, n: int | None
    ) -> list:
        if callable(envs):
            count = len(tasks) if tasks is not None else n
            if count is None:
                raise ValueError("tree rollout: with an env factory, pass `tasks` or `n_prompts`")
            return [envs() for _ in range(count)]
        env_list = list(envs)
        if tasks is not None and len(tasks) != len(env_list):
            raise ValueError(
                f"tree rollout: {len(tasks)} tasks for {len(env_list)} envs; give one task per env"
            )
        return env_list

    def _save_boundaries(self, stepped: list[_Node]) -> None:
        """A wave rule forks at tool results passed long ago: save the env at each, as the branch
        passes it (a fork of the env then, so a python session is kept as it was there)."""
        if self.rule.online:
            return
        for nd in stepped:
            if nd.branch.active and nd.branch.boundary_offset not in nd.snaps:
                nd.snaps[nd.branch.boundary_offset] = (nd.branch.env.fork(), nd.branch.boundary_state)

    def _position_entropies(self, seg: Segment) -> list[float]:
        """h_t of every position of a segment (exact where the engine gives it and the config asks)."""
        cfg = self.config
        if seg.entropy is not None and cfg.entropy_source != "topk":
            return list(seg.entropy)
        return position_entropies(seg.top_logprobs or [], cfg.entropy_topk)

    def _anchors(self, rule: BranchRule, ns: list[_Node], k: int, rng: random.Random) -> list[Anchor]:
        """The wave rule's anchors among the prompt's ended branches (indices into `ns`)."""
        kept = [j for j, nd in enumerate(ns) if nd.kind != "probe"]
        index = {ns[j].branch.traj_id: v for v, j in enumerate(kept)}
        views = [self._view(ns[j], index, rule.needs_token_entropy) for j in kept]
        return [replace(a, branch=kept[a.branch]) for a in rule.anchors(views, k, rng, self.config)[:k]]

    def _view(self, nd: _Node, index: dict[int, int], per_token: bool) -> BranchView:
        p = nd.branch
        view = BranchView(
            traj_id=p.traj_id,
            parent=None if p.parent_id is None else index.get(p.parent_id),
            branch_offset=p.branch_offset,
            reward=p.reward,
            boundaries=sorted(nd.snaps),
            initial=nd.kind == "initial",
        )
        if per_token:
            n = len(p.response_ids)
            entropy: list[float | None] = [None] * n
            for start, hs in zip(p.segment_starts, nd.pos_h, strict=True):
                entropy[start : start + len(hs)] = hs
            generated = [m == 1 for m in p.loss_mask]
            decode = self.engine.tokenizer.decode
            view.logprobs, view.entropy, view.generated = list(p.logprobs), entropy, generated
            view.forkable = [
                generated[t] and t + 1 < n and generated[t + 1] and bool(decode([p.response_ids[t]]).strip())
                for t in range(n)
            ]
        return view

    def _fork_at(self, ns: list[_Node], a: Anchor, tid: int) -> _Node:
        """A fork of `ns[a.branch]` keeping response[:a.offset]: from the env saved at the boundary at
        or before the offset, and the rest of the turn up to the offset as a partial turn."""
        src = ns[a.branch]
        p = src.branch
        start = max(o for o in src.snaps if o <= a.offset)
        env, state = src.snaps[start]
        child = replace(p, env=env, boundary_offset=start, boundary_state=state).fork(tid, at_boundary=True)
        child.branch_offset = a.offset
        n_seg = len(child.segment_starts)
        node = _Node(
            child,
            src.prompt,
            "fork",
            h_init=src.h_init,
            born_at=start,
            seg_h=src.seg_h[:n_seg],
            snaps={o: v for o, v in src.snaps.items() if o <= start},
            pos_h=src.pos_h[:n_seg],
            score=a.score,
        )
        if a.offset > start:
            ids = p.response_ids[start : a.offset]
            node.pending = _Partial(
                start=start,
                ids=ids,
                logprobs=p.logprobs[start : a.offset],
                entropy=None if p.entropy is None else p.entropy[start : a.offset],
                pos_h=src.pos_h[n_seg][: a.offset - start] if len(src.pos_h) > n_seg else [],
                text=self.engine.tokenizer.decode(ids),
            )
        return node

    def _fresh(self, i: int, root: tuple[Any, list[int], str], gid: int, k: int, kind: str) -> _Node:
        env, prompt_ids, task_id = root
        twin = env.fork()
        tid = tree_traj_id(gid, k)
        branch = EpisodeBranch(
            env=twin,
            prompt_ids=list(prompt_ids),
            group_id=gid,
            task_id=task_id,
            traj_id=tid,
            boundary_state=twin.get_state(),
            lineage={"root_id": tid, "depth": 0},
        )
        return _Node(branch=branch, prompt=i, kind=kind, snaps={0: (env, branch.boundary_state)})

    def _branch(
        self,
        nd: _Node,
        delta_h: float,
        nodes: list[list[_Node]],
        used: list[int],
        prompt_streak: list[int],
        rng: random.Random,
        stats: list[PromptStats],
    ) -> int:
        """Up to Z − 1 candidate forks of `nd` at the start of its newest segment."""
        cfg = self.config
        i = nd.prompt
        branch = nd.branch
        if branch.boundary_offset != branch.segment_starts[-1]:
            raise RuntimeError(
                f"tree rollout: branch {branch.traj_id} has no env state saved at offset {branch.segment_starts[-1]}"
            )
        streak = prompt_streak[i] if cfg.entropy_formula == "reference" else nd.consecutive
        st = stats[i]
        st.branch_points += 1
        st.delta_h.append(delta_h)
        made = 0
        for _ in range(cfg.beam_size - 1):
            if used[i] >= self.budget:
                break
            st.decisions += 1
            if not self.rule.decide(rng, delta_h, cfg, streak):
                continue
            child = branch.fork(tree_traj_id(branch.group_id, len(nodes[i])), at_boundary=True)
            seg_h = nd.seg_h[: len(child.segment_starts)]  # the entropies of the shared segments
            nodes[i].append(
                _Node(child, i, "fork", h_init=nd.h_init, born_at=branch.boundary_offset, seg_h=seg_h)
            )
            used[i] += 1
            st.forks += 1
            made += 1
        nd.consecutive = nd.consecutive + 1 if made else 0
        for child in nodes[i][len(nodes[i]) - made :]:
            child.consecutive = nd.consecutive
        return made

    async def _flat(
        self,
        roots: list[tuple[Any, list[int], str]],
        gids: list[int],
        params: SamplingParams,
        budget: int,
        group_size: int,
        stats: list[PromptStats],
    ) -> TreeRolloutResult:
        """Evaluation: `group_size` independent branches per prompt, never forked."""
        nodes = [
            self._fresh(i, r, gids[i], k, "initial") for i, r in enumerate(roots) for k in range(group_size)
        ]
        await run_branches(self.engine, [nd.branch for nd in nodes], params, budget)
        for nd in nodes:
            st = stats[nd.prompt]
            st.initial += 1
            st.generated_tokens += sum(nd.branch.loss_mask)
            st.tool_calls += _executed_calls(nd.branch)
            nd.branch.lineage.update(kind="initial")
        return TreeRolloutResult([nd.branch.to_trajectory() for nd in nodes], stats, [nd.branch for nd in nodes])

    async def _premonitor(
        self,
        roots: list[tuple[Any, list[int], str]],
        gids: list[int],
        params: SamplingParams,
        budget: int,
        stats: list[PromptStats],
        nodes: list[list[_Node]],
    ) -> list[int]:
        """AEPO pre-monitoring: m global samples per prompt from H_root and a probe's mean H_tool."""
        cfg = self.config
        stops = [list(dict.fromkeys([*params.stop, *env.stop_sequences])) for env, _, _ in roots]
        reqs = [
            params.with_(
                max_tokens=min(cfg.initial_entropy_tokens, budget),
                stop=stops[i],
                n=1,
                seed=None if params.seed is None else params.seed + 7_919 * gids[i],
            )
            for i in range(len(roots))
        ]
        root_segs = await self.engine.agenerate([ids for _, ids, _ in roots], reqs)
        # a discarded probe gets the reserved last id, so its samples are not branch 0's
        k = 0 if cfg.reuse_probe else TREE_ID_STRIDE - 1
        probes = [self._fresh(i, r, gids[i], k, "probe") for i, r in enumerate(roots)]
        seg_h: list[list[float]] = [[] for _ in roots]
        live = list(probes)
        while live:
            segs = await generate_segments(self.engine, [nd.branch for nd in live], params, budget)
            for nd, seg in zip(live, segs, strict=True):
                h = measure_segment(seg.top_logprobs, seg.entropy, cfg, self.vocab_size)
                if h is not None:
                    seg_h[nd.prompt].append(h)
                if self.rule.needs_token_entropy:  # a reused probe is a wave rule's initial branch
                    nd.pos_h.append(self._position_entropies(seg))
            await step_branches([nd.branch for nd in live], segs, self.engine.tokenizer, budget)
            self._save_boundaries(live)
            live = [nd for nd in live if nd.branch.active]
        out = []
        for i, seg in enumerate(root_segs):
            st = stats[i]
            st.h_root = measure_segment(seg.top_logprobs, seg.entropy, cfg, self.vocab_size)
            st.h_tool = sum(seg_h[i]) / len(seg_h[i]) if seg_h[i] else st.h_root
            st.overhead_tokens += len(seg.token_ids)
            probe = probes[i]
            if st.h_root is None:  # nothing generated from the prompt: keep the configured N
                m = min(max(cfg.initial_rollouts, 1), self.budget)
            else:
                m = premonitor_global_samples(st.h_root, st.h_tool, self.budget, cfg.premonitor_beta)
            if cfg.reuse_probe:
                probe.kind = "initial"
                probe.h_init = seg_h[i][0] if seg_h[i] else None
                nodes[i].append(probe)
                st.generated_tokens += sum(probe.branch.loss_mask)
            else:
                st.overhead_tokens += sum(probe.branch.loss_mask)
                st.tool_calls += _executed_calls(probe.branch)
            out.append(m)
        return out


def _resume(nd: _Node) -> _Partial | None:
    """Put a fork's partial turn back into its branch, so the engine continues the turn."""
    part, nd.pending = nd.pending, None
    if part is not None:
        p = nd.branch
        p.response_ids += part.ids
        p.loss_mask += [1] * len(part.ids)
        p.logprobs += part.logprobs
        if p.entropy is not None:
            p.entropy = None if part.entropy is None else p.entropy + part.entropy
    return part


def _merge(nd: _Node, seg: Segment, part: _Partial) -> Segment:
    """The resumed turn as one segment: it starts where the turn started, and the env reads the
    whole turn's text."""
    p = nd.branch
    p.segment_starts[-1] = part.start
    p.texts[-1] = part.text + seg.text
    if nd.pos_h:
        nd.pos_h[-1] = part.pos_h + nd.pos_h[-1]
    return replace(seg, token_ids=part.ids + seg.token_ids, logprobs=part.logprobs + seg.logprobs,
                   top_logprobs=None, text=part.text + seg.text)  # fmt: skip


__all__ = ["TreeRollout"]
