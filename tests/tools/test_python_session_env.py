"""Python sessions inside episodes: `gym.make(..., python={"session": True})`, one interpreter per
episode, forked by `env.fork()` (as the ARPO/AEPO tree rollout does at a tool result).

A scripted policy (a list of actions) drives real envs over real sandbox sessions.
"""

from __future__ import annotations

import asyncio
import time

import gymnasium as gym
import pytest
from sandbox_support import descendants

import agent_envs  # noqa: F401 (registers the env ids)
from agent_envs.base.task import Task
from agent_envs.core.env import ToolEnv
from agent_envs.tools import PythonTool

SETTINGS = {"session": True, "pool_size": 1, "timeout_s": 5.0}


def python(code: str) -> str:
    return f"<think> run it </think> <python>{code}</python>"


def observed(obs: str) -> str:
    return obs.split("<result>")[1].split("</result>")[0].strip()


@pytest.fixture(scope="module")
def tool():
    tool = PythonTool(**SETTINGS)
    yield tool
    tool.close()


def session_env(tool: PythonTool) -> ToolEnv:
    tasks = [Task(id="t0", question="What is x?", answers=["42"], reward="math")]
    return ToolEnv(tasks, [tool], max_tool_calls=8)


def leftovers(tool: PythonTool) -> list[int]:
    sandbox, _ = tool._ensure_started()
    deadline = time.monotonic() + 5
    while True:
        left = [p for w in sandbox.sessions.worker_pids() for p in descendants(w)[1:]]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_gym_make_turns_sessions_on():
    env = gym.make("AgentMath-v0", python=SETTINGS)
    try:
        env.reset(seed=0)
        obs, *_ = env.step(python("x = 40\nprint('set')"))
        assert observed(obs) == "set"
        obs, *_ = env.step(python("print(x + 2)"))
        assert observed(obs) == "42"
        env.reset(seed=1)  # a new episode: a new interpreter
        obs, *_ = env.step(python("print('x' in globals())"))
        assert observed(obs) == "False"
    finally:
        env.close()


def test_branches_after_a_python_result_see_only_their_own_state(tool):
    env = session_env(tool)
    env.reset(seed=0)
    obs, *_ = env.step(python("x = 'root'\nprint(x)"))
    assert observed(obs) == "root"
    left, right = env.fork(), env.fork()  # the branch point: right after the python result
    assert observed(left.step(python("x = 'left'\nprint(x)"))[0]) == "left"
    assert observed(right.step(python("x = 'right'\nprint(x)"))[0]) == "right"
    assert observed(left.step(python("print(x)"))[0]) == "left"
    assert observed(right.step(python("print(x)"))[0]) == "right"
    assert observed(env.step(python("print(x)"))[0]) == "root"  # the parent is unaffected
    for e in (env, left, right):
        *_, terminated, _, _ = e.step("<answer> \\boxed{42} </answer>")
        assert terminated
    assert leftovers(tool) == []  # each episode's end closed its interpreter


def test_forks_without_a_seed_each_draw_their_own_numbers(tool):
    # The tree rollout forks with no seed: each branch must still get a seed of its own, or every
    # branch of a sampling program computes the same "random" result.
    env = session_env(tool)
    env.reset(seed=0)
    env.step(python("import random\nrandom.seed(0)\nprint('seeded')"))
    forks = [env.fork() for _ in range(3)]
    draws = [observed(f.step(python("print(random.random())"))[0]) for f in forks]
    assert len(set(draws)) == 3, draws
    for e in (env, *forks):
        e.close()


def test_branches_run_concurrently_through_astep(tool):
    async def main() -> list[str]:
        env = session_env(tool)
        env.reset(seed=0)
        await env.astep(python("import random\nbase = [1, 2]"))
        branches = [env.fork() for _ in range(6)]
        await asyncio.gather(*(b.astep(python(f"base.append({i})")) for i, b in enumerate(branches)))
        results = await asyncio.gather(*(b.astep(python("print(base)")) for b in branches))
        parent = await env.astep(python("print(base)"))
        for e in (env, *branches):
            await e.astep("<answer> \\boxed{42} </answer>")
        return [observed(r[0]) for r in results] + [observed(parent[0])]

    out = asyncio.run(main())
    assert out == [f"[1, 2, {i}]" for i in range(6)] + ["[1, 2]"]
    assert leftovers(tool) == []


def test_close_and_truncation_end_the_session(tool):
    env = session_env(tool)
    env.reset(seed=0)
    env.step(python("import subprocess\np = subprocess.Popen(['sleep', '300'])"))
    twin = env.fork()
    env.truncate()  # ends the parent's interpreter and its sleeper (a fork copies no other process)
    assert observed(twin.step(python("print(type(p).__name__)"))[0]) == "Popen"  # the fork lives on
    twin.close()
    assert leftovers(tool) == []


def test_stateless_tools_are_untouched(tool):
    stateless = PythonTool(pool_size=1, timeout_s=5.0)
    try:
        env = ToolEnv([Task(id="t0", question="q", answers=["1"])], [stateless])
        env.reset(seed=0)
        env.step(python("x = 1"))
        assert "NameError" in observed(env.step(python("print(x)"))[0])
        assert env._sessions == {}
    finally:
        stateless.close()
