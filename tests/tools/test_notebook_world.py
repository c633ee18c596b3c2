"""The notebook world: tasks whose python calls reuse earlier variables, solved with sessions only.

Real envs and real sandboxes: each gold trace is replayed through `ToolEnv` with the world's
session tool; a copy-the-last-result policy (the gold trace's calls, then an answer copied from
the last observation, as a model does) scores with sessions and fails with the stateless tool.
"""

from __future__ import annotations

import re

import pytest

from agent_envs.core.env import ToolEnv
from agent_envs.tools import PythonTool
from agent_envs.worlds.notebook import TASK_KINDS, NotebookConfig, NotebookWorld

N = 9


@pytest.fixture(scope="module")
def world():
    return NotebookWorld(NotebookConfig(seed=0, steps=3))


@pytest.fixture(scope="module")
def session_tool(world):
    [tool] = world.make_tools()
    yield tool
    tool.close()


@pytest.fixture(scope="module")
def stateless_tool():
    tool = PythonTool(timeout_s=10.0)
    yield tool
    tool.close()


def play(world, tool, index: int, copy_last: bool) -> tuple[float, list[str]]:
    """Replay task `index`'s python calls; answer with the gold answer or the last printed value."""
    env = ToolEnv(world, [tool], max_tool_calls=8)
    env.reset(options={"index": index})
    task = env.task
    results = []
    for action in task.gold_trace[:-1]:
        obs, *_ = env.step(action)
        results.append(obs.split("<result>")[1].split("</result>")[0].strip())
    answer = task.gold_trace[-1]
    if copy_last:
        answer = f"<answer> \\boxed{{{results[-1].splitlines()[-1]}}} </answer>"
    _, reward, terminated, _, _ = env.step(answer)
    assert terminated
    return reward, results


def test_config_is_checked_and_tasks_are_seeded(world):
    with pytest.raises(ValueError, match="NotebookConfig.steps"):
        NotebookWorld(NotebookConfig(steps=7))
    again = NotebookWorld(NotebookConfig(seed=0, steps=3))
    assert [again[i] for i in range(N)] == [world[i] for i in range(N)]
    assert {world[i].metadata["family"] for i in range(N)} == set(TASK_KINDS)
    assert all(world[i].metadata["needs_session"] and world[i].metadata["tool_calls"] == 3 for i in range(N))


def test_gold_traces_solve_every_task_with_sessions(world, session_tool):
    for i in range(N):
        reward, results = play(world, session_tool, i, copy_last=False)
        assert reward == 1.0, (i, results)
        assert not any("Error" in r for r in results), (i, results)
        assert results[-1].splitlines()[-1] == world[i].answers[0]  # the last call printed the answer


def test_copying_the_last_result_scores_with_sessions_only(world, session_tool, stateless_tool):
    with_sessions = [play(world, session_tool, i, copy_last=True)[0] for i in range(N)]
    without = [play(world, stateless_tool, i, copy_last=True) for i in range(N)]
    assert with_sessions == [1.0] * N
    assert [reward for reward, _ in without] == [0.0] * N
    assert all(re.search(r"NameError: name '\w+' is not defined", results[-1]) for _, results in without)


def test_the_env_id_plays_it_with_sessions_and_python_false_measures_the_stateless_tool():
    import gymnasium as gym

    rewards = {}
    for session in (True, False):
        env = gym.make("AgentNotebook-v0", world={"seed": 0, "steps": 3},
                       **({} if session else {"python": {"session": False}}))
        env.reset(options={"index": 0})
        task = env.unwrapped.task
        assert task == NotebookWorld(NotebookConfig(seed=0, steps=3))[0]
        for action in task.gold_trace[:-1]:
            obs, *_ = env.step(action)
        last = obs.split("<result>")[1].split("</result>")[0].strip().splitlines()[-1]
        _, rewards[session], terminated, _, info = env.step(f"<answer> \\boxed{{{last}}} </answer>")
        assert terminated and info["tool_calls"] == 3
        env.close()
    assert rewards == {True: 1.0, False: 0.0}
    with pytest.raises(ValueError, match=r"NotebookConfig\.steps"):
        gym.make("AgentNotebook-v0", world={"steps": 9})
    with pytest.raises(ValueError, match=r"AgentNotebook-v0: unknown config key 'env_kwargs\.world\.step' \(did you mean 'steps'"):
        gym.make("AgentNotebook-v0", world={"step": 3})
