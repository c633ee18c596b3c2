"""Episodes from the synchronous learner: GRPO's flat group sampling (G independent episodes per
prompt draw), on the process-wide env loop.

    >>> from algorithms.core.group_sampling import run_coroutine
    >>> async def two(): return 2
    >>> run_coroutine(two())
    2

Trajectory ids are global (`seeds.flat_traj_id`) and the runner derives each request's seed from
(seed, trajectory id, turn), so samples depend neither on ranks nor on batching. The tree rollout
of ARPO and AEPO is the other strategy (`algorithms.rollout.tree`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from algorithms.base.seeds import flat_traj_id
from algorithms.core.batch import PromptDraw


def run_coroutine(coro: Any) -> Any:
    """Run a rollout coroutine from synchronous code, on the process-wide env loop (tools keep
    loop-bound resources, such as sandbox workers, across steps)."""
    from agent_envs.core.env import background_loop

    return asyncio.run_coroutine_threadsafe(coro, background_loop()).result()


def group_rollout(
    draws: Sequence[PromptDraw],
    *,
    engine: Any,
    env_factory: Callable[[], Any],
    tokenizer: Any,
    group_size: int,
    params: Any,
    max_response_tokens: int,
) -> list[Any]:
    """`group_size` trajectories per draw, grouped by draw in order, all turns run concurrently."""
    from algorithms.rollout.runner import run_branches, start_group

    async def run() -> list[Any]:
        branches = []
        for d in draws:
            first = flat_traj_id(d.group_id, 0, group_size)
            env = env_factory()
            branches += start_group(
                env, tokenizer, d.group_id, group_size, first, seed=d.seed, options={"index": d.index}
            )
        await run_branches(engine, branches, params, max_response_tokens)
        return [p.to_trajectory() for p in branches]

    return run_coroutine(run())


__all__ = ["group_rollout", "run_coroutine"]
