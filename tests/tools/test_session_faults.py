"""Many live python sessions at once, with forks, timeouts and crashes among them: every session
keeps exactly its own state, and a failing one fails alone.

Real sandbox workers and session interpreters (local backend). The long run is `stress`.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from test_python_session import RESET, wait_until_only_workers

from agent_envs.tools import PythonTool


def cell(episode: int, turn: int) -> str:
    """Appends to the episode's own history, then prints it whole: a cross-wired session, or one
    that lost its state, prints something else."""
    return f"hist.append(({episode}, {turn}))\nprint(len(hist), hist[-1], sum(t for _, t in hist))"


def want(episode: int, turns: int) -> str:
    return f"{turns + 1} ({episode}, {turns}) {turns * (turns + 1) // 2}"


async def run_sessions(tool: PythonTool, episodes: int, turns: int, bad: dict) -> tuple[int, int, int, int]:
    """Each episode: a session, `turns` cells (pauses between, as generation would), a fork halfway
    that runs the rest on its own; cells in `bad` time out or crash and reset that session."""

    async def episode(e: int) -> tuple[int, int, int, int]:
        rng = random.Random(e)
        session = tool.open_session()
        good = wrong = reset = 0
        try:
            await session(f"hist = [({e}, 0)]")
            twin = None
            for t in range(1, turns + 1):
                await asyncio.sleep(rng.uniform(0, 0.02))
                if (e, t) in bad:
                    res = await session(bad[(e, t)])
                    reset += RESET in res.text
                    await session(f"hist = [({e}, i) for i in range({t + 1})]")  # rebuilt by the policy
                    continue
                res = await session(cell(e, t))
                ok = res.text == want(e, t)
                good, wrong = good + ok, wrong + (not ok)
                if t == turns // 2:
                    twin = session.fork()
            if twin is not None:  # the fork continues from the halfway point, untouched since
                res = await twin(cell(e, turns // 2 + 1))
                ok = res.text == want(e, turns // 2 + 1)
                good, wrong = good + ok, wrong + (not ok)
                twin.close()
            return good, wrong, reset, 1
        finally:
            session.close()

    rows = await asyncio.gather(*(episode(e) for e in range(episodes)))
    return tuple(sum(col) for col in zip(*rows, strict=True))


def test_64_live_sessions_each_keep_their_own_state():
    tool = PythonTool(timeout_s=10.0, pool_size=2, session=True)  # nproc: the session default
    try:
        good, wrong, reset, done = asyncio.run(run_sessions(tool, episodes=64, turns=4, bad={}))
        assert (good, wrong, reset, done) == (64 * 5, 0, 0, 64)
        assert wait_until_only_workers(tool) == []
    finally:
        tool.close()


@pytest.mark.stress
def test_64_sessions_long_with_timeouts_and_crashes():
    tool = PythonTool(timeout_s=1.0, pool_size=4, session=True)
    bad = {(e, 7): "while True: pass" for e in range(0, 64, 9)}
    bad |= {(e, 13): "import ctypes\nctypes.string_at(0)" for e in range(3, 64, 11)}  # SIGSEGV
    try:
        good, wrong, reset, done = asyncio.run(run_sessions(tool, episodes=64, turns=20, bad=bad))
        print(f"\n[session stress] {good} right, {wrong} wrong, {reset}/{len(bad)} bad cells reset their session")
        assert wrong == 0 and reset == len(bad) and good == 64 * 21 - len(bad) and done == 64
        assert wait_until_only_workers(tool) == []
    finally:
        tool.close()
