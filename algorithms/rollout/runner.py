"""The multi-turn runner: many episodes of tool-using envs driven by one rollout engine.

Per episode: generate until a stop string (a tool's closing tag) or EOS → `await env.astep(text)`
→ encode only the observation (`add_special_tokens=False`) and append it with loss mask 0 →
generate again from the stored ids, until the env ends the episode or the response token budget
is spent. Generated ids are kept exactly as the engine produced them (token-in / token-out);
decoded text is only what the env parses.

Episodes do not wait for each other: a generation loop batches every branch that is ready to
generate into one engine call (run in a worker thread), while the env steps (tool calls) of the
other branches run as asyncio tasks; so tool latency hides behind generation.

    >>> import asyncio, gymnasium as gym, agent_envs
    >>> from algorithms.rollout import HFEngine, SamplingParams, run_episodes
    >>> from algorithms.models.tiny import build_tiny_model
    >>> engine = HFEngine(build_tiny_model())
    >>> make_env = lambda: gym.make("AgentMath-v0", tokenizer=engine.tokenizer).unwrapped
    >>> trajs = asyncio.run(run_episodes(engine, make_env, SamplingParams(top_k=-1),
    ...                                  n_prompts=2, group_size=2, max_response_tokens=24))
    >>> len(trajs), all(len(t.response_ids) <= 24 for t in trajs)
    (4, True)

Building blocks for other strategies (the ARPO/AEPO tree rollout forks branches between
iterations): `EpisodeBranch` (one episode in flight), `start_group`, `generate_segments` (one segment for
a batch of branches), `apply_segment` / `step_branches` (hand segments to the envs and append results).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from algorithms.base.progress import Progress
from algorithms.base.seeds import request_seed
from algorithms.rollout.engine import RolloutEngine, SamplingParams, Segment
from algorithms.rollout.trajectory import Trajectory

Status = Literal["active", "finished", "truncated"]


@dataclass
class EpisodeBranch:
    """One episode in flight: its env, its tokens so far and where it came from."""

    env: Any  # a ToolEnv (anything with astep / fork / get_state / set_state / stop_sequences)
    prompt_ids: list[int]
    group_id: int = 0
    task_id: str = ""
    traj_id: int = 0
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropy: list[float] | None = field(default_factory=list)
    segment_starts: list[int] = field(default_factory=list)
    policy_version: list[int] = field(default_factory=list)  # per segment, when the engine tags it
    texts: list[str] = field(default_factory=list)  # decoded pieces, for response_text
    turns: int = 0
    status: Status = "active"
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    finish_reason: str = ""
    end_reason: str = ""
    last_segment: Segment | None = None
    # the env state and response length right after the last appended tool result: where a
    # tree rollout may branch from
    boundary_state: Any = None
    boundary_offset: int = 0
    parent_id: int | None = None
    branch_offset: int | None = None
    lineage: dict[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.status == "active"

    def remaining(self, max_response_tokens: int) -> int:
        return max_response_tokens - len(self.response_ids)

    def append_generated(self, seg: Segment) -> None:
        self.segment_starts.append(len(self.response_ids))
        if seg.policy_version is not None:
            self.policy_version.append(seg.policy_version)
        self.response_ids += seg.token_ids
        self.loss_mask += [1] * len(seg.token_ids)
        self.logprobs += seg.logprobs
        if self.entropy is not None:
            self.entropy = self.entropy + seg.entropy if seg.entropy is not None else None
        self.texts.append(seg.text)
        self.last_segment = seg
        self.finish_reason = seg.finish_reason

    def append_observation(self, ids: list[int], text: str) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        if self.entropy is not None:
            self.entropy += [0.0] * len(ids)
        self.texts.append(text)

    def fork(self, traj_id: int, at_boundary: bool = False) -> EpisodeBranch:
        """An independent copy that continues from here (or from the last tool-result boundary).

        The env is forked too; with `at_boundary=True` the copy is cut back to right after the last
        tool result and its env is set to the state saved there.
        """
        cut = self.boundary_offset if at_boundary else len(self.response_ids)
        env = self.env.fork()
        if at_boundary and self.boundary_state is not None:
            env.set_state(self.boundary_state)
        n_segments = sum(1 for s in self.segment_starts if s < cut)
        twin = EpisodeBranch(
            env=env,
            prompt_ids=self.prompt_ids,
            group_id=self.group_id,
            task_id=self.task_id,
            traj_id=traj_id,
            response_ids=self.response_ids[:cut],
            loss_mask=self.loss_mask[:cut],
            logprobs=self.logprobs[:cut],
            entropy=None if self.entropy is None else self.entropy[:cut],
            segment_starts=self.segment_starts[:n_segments],
            policy_version=self.policy_version[:n_segments],
            texts=list(self.texts[: 2 * n_segments]) if at_boundary else list(self.texts),
            turns=n_segments,
            boundary_state=self.boundary_state,
            boundary_offset=self.boundary_offset,
            parent_id=self.traj_id,
            branch_offset=cut,
            lineage={
                **self.lineage,
                "root_id": self.lineage.get("root_id", self.traj_id),
                "depth": self.lineage.get("depth", 0) + 1,
            },
        )
        return twin

    def end(self, reward: float, info: dict[str, Any], terminated: bool, truncated: bool, why: str) -> None:
        self.status = "truncated" if truncated else "finished"
        self.reward, self.info = float(reward), dict(info)
        self.terminated, self.truncated = terminated, truncated
        self.end_reason = why

    def to_trajectory(self) -> Trajectory:
        return Trajectory(
            prompt_ids=list(self.prompt_ids),
            response_ids=list(self.response_ids),
            loss_mask=list(self.loss_mask),
            logprobs=list(self.logprobs),
            entropy=None if self.entropy is None else list(self.entropy),
            reward=self.reward,
            components=self.info,
            group_id=self.group_id,
            task_id=self.task_id,
            tool_calls=int(self.info.get("tool_calls", 0)),
            terminated=self.terminated,
            truncated=self.truncated,
            finish_reason=self.finish_reason,
            end_reason=self.end_reason,
            segment_starts=list(self.segment_starts),
            policy_version=list(self.policy_version),
            response_text="".join(self.texts),
            traj_id=self.traj_id,
            parent_id=self.parent_id,
            branch_offset=self.branch_offset,
            lineage=dict(self.lineage),
        )


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of env-inserted text, encoded on its own (TITO rule 3)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def start_group(
    env: Any,
    tokenizer: Any,
    group_id: int,
    group_size: int,
    first_traj_id: int,
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> list[EpisodeBranch]:
    """Reset `env` once and return `group_size` branches on the same prompt (the others are forks)."""
    # The runner holds each branch to the budget in the ids the engine produced. The env's own count
    # re-encodes the text, which can differ, and would end answered episodes as over budget.
    env.unwrapped.max_response_tokens = None
    prompt, info = env.reset(seed=seed, options=options)
    prompt_ids = info.get("prompt_token_ids") or encode(tokenizer, prompt)
    envs = [env] + [env.fork() for _ in range(group_size - 1)]
    task_id = str(info.get("task_id", ""))
    state = env.get_state()
    return [
        EpisodeBranch(
            env=e,
            prompt_ids=list(prompt_ids),
            group_id=group_id,
            task_id=task_id,
            traj_id=first_traj_id + k,
            boundary_state=state,
            lineage={"root_id": first_traj_id + k, "depth": 0},
        )
        for k, e in enumerate(envs)
    ]


def segment_params(branch: EpisodeBranch, params: SamplingParams, max_response_tokens: int) -> SamplingParams:
    """This branch's request: its remaining budget as max_tokens, the env's stop strings added."""
    stops = list(dict.fromkeys([*params.stop, *branch.env.stop_sequences]))
    seed = request_seed(params.seed, branch.traj_id, branch.turns)
    return params.with_(
        max_tokens=min(params.max_tokens, branch.remaining(max_response_tokens)), stop=stops, n=1, seed=seed
    )


async def generate_segments(
    engine: RolloutEngine, branches: Sequence[EpisodeBranch], params: SamplingParams, max_response_tokens: int
) -> list[Segment]:
    """Generate one segment for every branch in one batched engine call and append it (mask 1)."""
    if not branches:
        return []
    reqs = [segment_params(p, params, max_response_tokens) for p in branches]
    segs = await engine.agenerate([p.prompt_ids + p.response_ids for p in branches], reqs)
    for branch, seg in zip(branches, segs, strict=True):
        branch.append_generated(seg)
        branch.turns += 1
    return segs


async def apply_segment(branch: EpisodeBranch, seg: Segment, tokenizer: Any, max_response_tokens: int) -> EpisodeBranch:
    """Hand the branch's newest segment to its env; append the observation or end the branch."""
    obs, reward, terminated, truncated, info = await branch.env.astep(seg.text)
    budget_spent = branch.remaining(max_response_tokens) <= 0
    if terminated or truncated:
        why = info.get("end_reason", "")
        if seg.finish_reason == "length" and budget_spent and info.get("stop_reason") != "answer":
            # cut off by the token budget, not a chosen end: report it as truncation (DAPO's
            # overlong filter and shaping read this)
            terminated, truncated, why = False, True, "length"
        branch.end(reward, info, terminated, truncated, why)
        return branch
    obs_ids = encode(tokenizer, obs)
    if budget_spent or len(obs_ids) >= branch.remaining(max_response_tokens):
        # the result would not fit with room left to react to it: the runner never exceeds its
        # budget, so the episode ends here and the env scores the partial response
        reward, end_info = await truncate_env(branch.env, "response_budget")
        branch.end(reward, {**info, **end_info}, terminated=False, truncated=True, why="response_budget")
        return branch
    branch.append_observation(obs_ids, obs)
    branch.boundary_state = branch.env.get_state()
    branch.boundary_offset = len(branch.response_ids)
    branch.info = info
    return branch


async def truncate_env(env: Any, why: str) -> tuple[float, dict[str, Any]]:
    """End an episode from outside; the env scores the partial response when it can (a judge's
    grade is awaited here, on the runner's loop, as `astep` awaits it)."""
    if hasattr(env, "atruncate"):
        return await env.atruncate(why)
    return 0.0, {"end_reason": why, "truncated": True}


async def step_branches(
    branches: Sequence[EpisodeBranch], segs: Sequence[Segment], tokenizer: Any, max_response_tokens: int
) -> list[EpisodeBranch]:
    """`apply_segment` for many branches at once (their tool calls run concurrently)."""
    return list(
        await asyncio.gather(
            *(apply_segment(p, s, tokenizer, max_response_tokens) for p, s in zip(branches, segs, strict=True))
        )
    )


async def run_branches(
    engine: RolloutEngine,
    branches: Sequence[EpisodeBranch],
    params: SamplingParams,
    max_response_tokens: int,
    *,
    batch_wait_s: float = 0.02,
    batch_max_wait_s: float = 0.25,
    on_finish: Callable[[EpisodeBranch], None] | None = None,
) -> list[EpisodeBranch]:
    """Drive branches to their end, overlapping generation of some with env steps of others.

    Env steps that finish in a stream (tool calls queued on a few sandbox workers land a few
    milliseconds apart) are gathered into one engine call: after the first lands, the runner
    keeps waiting while the next arrives within `batch_wait_s`, for at most `batch_max_wait_s`.
    A call started for the first one or two alone would decode as long as a full batch does, and
    the others would wait for it.
    """
    tokenizer = engine.tokenizer
    loop = asyncio.get_running_loop()
    ready = [p for p in branches if p.active]
    pending: set[asyncio.Task] = set()
    try:
        while ready or pending:
            if ready:
                batch, ready = ready, []
                segs = await generate_segments(engine, batch, params, max_response_tokens)
                for branch, seg in zip(batch, segs, strict=True):
                    pending.add(asyncio.create_task(apply_segment(branch, seg, tokenizer, max_response_tokens)))
            if not pending:
                continue
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            deadline = loop.time() + batch_max_wait_s
            while pending and batch_wait_s > 0:
                timeout = min(batch_wait_s, deadline - loop.time())
                if timeout <= 0:
                    break
                more, pending = await asyncio.wait(
                    pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not more:
                    break
                done |= more
            for task in done:
                branch = task.result()
                if branch.active:
                    ready.append(branch)
                elif on_finish is not None:
                    on_finish(branch)
            ready.sort(key=lambda p: p.traj_id)
    finally:
        # an engine or env error must not leave env steps running behind the caller's back
        for task in pending:
            task.cancel()
    return list(branches)


async def run_episodes(
    engine: RolloutEngine,
    envs: Sequence[Any] | Callable[[], Any],
    params: SamplingParams,
    *,
    tasks: Sequence[Any] | None = None,
    n_prompts: int | None = None,
    group_size: int = 1,
    max_response_tokens: int | None = None,
    seed: int | None = 0,
    progress: bool = False,
    batch_wait_s: float = 0.02,
    batch_max_wait_s: float = 0.25,
) -> list[Trajectory]:
    """Run `group_size` episodes per prompt and return their trajectories (prompt-major order).

    Args:
        envs: a list of envs (one prompt each) or a factory making a fresh env per prompt.
        tasks: optional per-prompt choice: `Task` objects (reset with `options={"task": t}`) or
            indices into the env's task source. Without it each env picks by its reset seed.
        n_prompts: number of prompts when `envs` is a factory and `tasks` is not given.
        group_size: episodes per prompt (GRPO's G); they share the prompt and the `group_id`.
        max_response_tokens: the per-episode budget of response tokens (generated + tool
            results); defaults to `params.max_tokens`.
        seed: prompt i resets with `seed + i` (None: unseeded).
        batch_wait_s, batch_max_wait_s: how env steps landing in a stream are gathered into one
            engine call (see `run_branches`).
    """
    if group_size < 1:
        raise ValueError(f"run_episodes: group_size={group_size} must be >= 1")
    budget = max_response_tokens if max_response_tokens is not None else params.max_tokens
    if budget <= 0:
        raise ValueError(f"run_episodes: max_response_tokens={budget} must be > 0")
    if callable(envs):
        count = len(tasks) if tasks is not None else n_prompts
        if count is None:
            raise ValueError("run_episodes: with an env factory, pass `tasks` or `n_prompts`")
        env_list = [envs() for _ in range(count)]
    else:
        env_list = list(envs)
        if tasks is not None and len(tasks) != len(env_list):
            raise ValueError(
                f"run_episodes: {len(tasks)} tasks for {len(env_list)} envs; give one task per env"
            )
    branches: list[EpisodeBranch] = []
    for i, env in enumerate(env_list):
        options = None
        if tasks is not None:
            t = tasks[i]
            options = {"index": t} if isinstance(t, int) else {"task": t}
        branches += start_group(
            env,
            engine.tokenizer,
            i,
            group_size,
            len(branches),
            seed=None if seed is None else seed + i,
            options=options,
        )

    finish = None
    bar = None
    if progress:
        bar = Progress("episodes", total=len(branches), transient=True)

        def finish(_: EpisodeBranch) -> None:
            bar.advance()

    try:
        await run_branches(engine, branches, params, budget, batch_wait_s=batch_wait_s,
                        batch_max_wait_s=batch_max_wait_s, on_finish=finish)
    finally:
        if bar is not None:
            bar.close()
    return [p.to_trajectory() for p in branches]


__all__ = [
    "EpisodeBranch",
    "apply_segment",
    "encode",
    "generate_segments",
    "run_episodes",
    "run_branches",
    "segment_params",
    "start_group",
    "step_branches",
    "truncate_env",
]
