"""The imperfect teacher: a configurable share of gold traces takes a shortcut and fails on
purpose, the arithmetic world mixes in easy tasks, and metadata says which trace is which.
Every trace is replayed through a real `ToolEnv` with the world's real tools."""

from __future__ import annotations

import asyncio

import pytest

from agent_envs import ToolEnv
from agent_envs.core.env import background_loop
from agent_envs.worlds import ArithmeticConfig, ArithmeticWorld, make_world

N = 240
IMPERFECT = {
    "arithmetic": {"difficulty": 1, "easy_fraction": 0.3, "teacher_shortcut": 0.5, "teacher_needless_tool": 0.5},
    "knowledge": {"difficulty": 3, "teacher_shortcut": 0.5},
    "web": {"difficulty": 4, "teacher_shortcut": 0.5},
}


def replay(world, tasks):
    """(reward, info) of each task's gold trace played through a real env."""
    env = ToolEnv(tasks, world.make_tools())
    out = []
    try:
        for i, task in enumerate(tasks):
            env.reset(options={"index": i})
            for action in task.gold_trace:
                _, reward, terminated, truncated, info = env.step(action)
            assert terminated and not truncated, f"{task.id}: the trace did not end the episode: {info}"
            out.append((reward, info))
    finally:
        asyncio.run_coroutine_threadsafe(env.aclose(), background_loop()).result()
    return out


@pytest.mark.parametrize("name", sorted(IMPERFECT))
def test_shortcut_traces_fail_and_all_others_solve_their_task(name):
    world = make_world(name, seed=0, **IMPERFECT[name])
    tasks = [world[i] for i in range(N)]
    teachers = {t.metadata["teacher"] for t in tasks}
    assert "shortcut" in teachers and "intended" in teachers
    for task, (reward, info) in zip(tasks, replay(world, tasks), strict=True):
        meta = task.metadata
        assert meta["trace_correct"] == (meta["teacher"] != "shortcut")
        assert info["tool_calls"] == meta["tool_calls"] == len(task.gold_trace) - 1, task.id
        if meta["trace_correct"]:
            assert reward == 1.0, f"{task.id}: reward {reward}, {info}"
        else:
            assert not info["correct"] and reward < 1.0, f"{task.id}: the shortcut was right: {info}"
            assert task.answers[0] not in task.gold_trace[-1]


@pytest.mark.parametrize("name", sorted(IMPERFECT))
def test_shortcut_share_follows_the_config(name):
    world = make_world(name, seed=1, **IMPERFECT[name])
    # tasks with a shortcut to take: arithmetic needing the tool, multi-hop / deeper than one page
    eligible = [
        t for t in (world[i] for i in range(600))
        if t.metadata.get("needs_tool", True) and t.metadata["hops"] > (0 if name == "arithmetic" else 1)
    ]
    share = sum(t.metadata["teacher"] == "shortcut" for t in eligible) / len(eligible)
    assert 0.4 < share < 0.6, f"{name}: {share:.2f} of {len(eligible)} traces take the shortcut"
    assert all(t.metadata["teacher"] != "shortcut" for t in (world[i] for i in range(600)) if t not in eligible)


def test_arithmetic_easy_tasks_are_one_digit_and_answered_without_the_tool_unless_needless():
    world = ArithmeticWorld(ArithmeticConfig(seed=2, **IMPERFECT["arithmetic"]))
    tasks = [world[i] for i in range(600)]
    easy = [t for t in tasks if not t.metadata["needs_tool"]]
    assert 0.25 < len(easy) / len(tasks) < 0.35
    for t in easy:
        assert all(len(n) == 1 for n in t.question.replace("?", " ").replace(".", " ").split() if n.isdigit())
        assert t.metadata["teacher"] in ("intended", "needless_tool")
        assert (t.metadata["tool_calls"] == 1) == (t.metadata["teacher"] == "needless_tool")
    needless = sum(t.metadata["teacher"] == "needless_tool" for t in easy) / len(easy)
    assert 0.35 < needless < 0.65
    # the shortcut on a hard task reads exactly like the intended answer to an easy one
    shortcut = next(t for t in tasks if t.metadata["teacher"] == "shortcut")
    mental = next(t for t in easy if t.metadata["teacher"] == "intended")
    assert shortcut.gold_trace[0].split("<answer>")[0] == mental.gold_trace[0].split("<answer>")[0]


def test_default_teacher_keeps_the_tasks_of_earlier_releases():
    """The teacher policy draws random numbers only when it is on: seeded tasks stay the same."""
    expected = {
        "arithmetic": ("What is the modular inverse of 34 mod 43?", "19"),
        "knowledge": ("In which city is the maker of Vetu Watch based?", "Bravodri"),
        "web": ("Who is the treasurer of the Kresonal Rowing Club?", "Brufai Zaifako"),
    }
    for name, (question, answer) in expected.items():
        task = make_world(name, seed=0, difficulty=3)[0]
        assert (task.question, task.answers[0]) == (question, answer)
        assert task.metadata["teacher"] == "intended" and task.metadata["trace_correct"]


@pytest.mark.parametrize("field", ["teacher_shortcut", "easy_fraction", "teacher_needless_tool"])
@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "0.5"])
def test_shares_outside_zero_one_name_the_field(field, bad):
    with pytest.raises(ValueError, match=f"'ArithmeticConfig.{field}' must be a share in"):
        ArithmeticConfig(**{field: bad}).validate()
