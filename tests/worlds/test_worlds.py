"""Every registered world: deterministic seeding, config validation, and gold traces that solve
their tasks when replayed through a real `ToolEnv` with the world's real tools (python sandbox,
BM25 search, in-memory browse) using only what the observations show.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict

import pytest

from agent_envs import ToolEnv
from agent_envs.core.env import background_loop
from agent_envs.rewards.qa import normalize_answer
from agent_envs.worlds import (
    WORLDS,
    ArithmeticConfig,
    KnowledgeConfig,
    WebConfig,
    make_world,
)

N_TASKS = 200
# The largest difficulty of each world, so the replay covers every family / hop count / depth.
HARDEST = {"arithmetic": 3, "knowledge": 4, "web": 4}
TOOL_CALL = re.compile(r"<(python|search|browse)>(.*?)</\1>\s*$", re.DOTALL)


def fingerprint(world, n: int) -> str:
    rows = [asdict(world[i]) for i in range(n)]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


# The worlds with difficulty levels and hops; the notebook world's own checks (seeding, gold traces
# with sessions and without) are in tests/tools/test_notebook_world.py.
@pytest.fixture(scope="module", params=sorted(HARDEST))
def name(request) -> str:
    return request.param


def test_registry_has_the_four_worlds():
    assert sorted(WORLDS) == ["arithmetic", "knowledge", "notebook", "web"]


def test_same_seed_same_tasks_and_other_seeds_differ(name):
    a, b = make_world(name, seed=3), make_world(name, seed=3)
    assert [a[i] for i in range(N_TASKS)] == [b[i] for i in range(N_TASKS)]
    # indexing order does not matter: task i depends on (seed, i) only
    assert [a[i] for i in reversed(range(50))] == [b[i] for i in range(50)][::-1]
    other = make_world(name, seed=4)
    same = sum(a[i].question == other[i].question for i in range(N_TASKS))
    assert same < N_TASKS // 10, f"seeds 3 and 4 of {name} share {same} of {N_TASKS} questions"
    questions = {a[i].question for i in range(N_TASKS)}
    assert len(questions) > N_TASKS * 0.7, f"{name}: only {len(questions)} distinct questions in {N_TASKS}"


def test_tasks_are_identical_in_a_fresh_interpreter(name):
    """No dependence on hash randomisation or process state: another process, another hash seed."""
    code = (
        "import sys, json, hashlib; from dataclasses import asdict; from agent_envs.worlds import make_world;"
        f"w = make_world({name!r}, seed=5, difficulty={HARDEST[name]});"
        "rows = [asdict(w[i]) for i in range(40)];"
        "print(hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == fingerprint(make_world(name, seed=5, difficulty=HARDEST[name]), 40)


def test_task_shape_and_metadata(name):
    w = make_world(name, seed=0, size=500, difficulty=HARDEST[name])
    assert len(w) == 500
    assert w[-1] == w[499]
    ids = set()
    for i in range(N_TASKS):
        t = w[i]
        ids.add(t.id)
        assert t.metadata["world"] == name and t.metadata["difficulty"] == HARDEST[name]
        assert t.metadata["index"] == i and t.metadata["seed"] == 0
        assert 1 <= t.metadata["hops"] <= HARDEST[name]
        assert t.metadata["tool_calls"] == len(t.gold_trace) - 1
        assert t.reward == ("math" if name == "arithmetic" else "qa")
        assert len(t.answers) == 1 and t.answers[0]
        assert f"\\boxed{{{t.answers[0]}}}" in t.gold_trace[-1]
        # the answer is found, not given: it never appears in the question
        if name != "arithmetic":
            assert f" {normalize_answer(t.answers[0])} " not in f" {normalize_answer(t.question)} ", t
    assert len(ids) == N_TASKS
    for bad in (500, -501):
        with pytest.raises(IndexError, match="out of range"):
            w[bad]
    with pytest.raises(TypeError, match="ints"):
        w["3"]


@pytest.mark.parametrize(
    "config, field",
    [
        (ArithmeticConfig(difficulty=4), "ArithmeticConfig.difficulty"),
        (ArithmeticConfig(difficulty=0), "ArithmeticConfig.difficulty"),
        (ArithmeticConfig(min_digits=0), "ArithmeticConfig.min_digits"),
        (ArithmeticConfig(min_digits=4, max_digits=3), "ArithmeticConfig.max_digits"),
        (ArithmeticConfig(seed=-1), "ArithmeticConfig.seed"),
        (ArithmeticConfig(size=0), "ArithmeticConfig.size"),
        (ArithmeticConfig(size=2_000_000), "ArithmeticConfig.size"),
        (ArithmeticConfig(difficulty="2"), "ArithmeticConfig.difficulty"),
        (ArithmeticConfig(seed=1.5), "ArithmeticConfig.seed"),
        (KnowledgeConfig(difficulty=5), "KnowledgeConfig.difficulty"),
        (KnowledgeConfig(difficulty=2, min_hops=3), "KnowledgeConfig.min_hops"),
        (KnowledgeConfig(n_people=3), "KnowledgeConfig.n_people"),
        (WebConfig(min_depth=0), "WebConfig.min_depth"),
        (WebConfig(n_sites=1), "WebConfig.n_sites"),
        (WebConfig(page_chars=50), "WebConfig.page_chars"),
    ],
)
def test_validate_names_the_bad_field(config, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        config.validate()
    world_cls = next(w for w in WORLDS.values() if w.config_class is type(config))
    with pytest.raises(ValueError, match=re.escape(field)):
        world_cls(config)


def test_make_world_rejects_unknown_names_and_fields():
    with pytest.raises(KeyError, match="unknown world 'chess'"):
        make_world("chess")
    with pytest.raises(ValueError, match=r"no field\(s\) \['hops'\]"):
        make_world("knowledge", hops=3)
    with pytest.raises(TypeError, match="KnowledgeConfig"):
        WORLDS["knowledge"](WebConfig())


# (difficulty, number of tasks) replayed per world: every arithmetic level, and the hardest
# knowledge/web setting, whose hop counts and depths include those of the easier ones.
REPLAY = {"arithmetic": [(1, N_TASKS), (2, 50), (3, 50)], "knowledge": [(4, N_TASKS)], "web": [(4, N_TASKS)]}


@pytest.fixture(scope="module")
def replay_env(name):
    tasks = []
    for difficulty, n in REPLAY[name]:
        world = make_world(name, seed=0, difficulty=difficulty)
        tasks += [world[i] for i in range(n)]
    tools = world.make_tools()  # the tools depend on the seed, not on the difficulty
    env = ToolEnv(tasks, tools)
    yield tasks, env
    # tools may hold workers bound to the loop that ran env.step(): close them there
    asyncio.run_coroutine_threadsafe(env.aclose(), background_loop()).result()


def test_gold_traces_replay_to_reward_one_using_only_observed_facts(replay_env, name):
    """200+ tasks per world: each gold trace ends terminated with reward 1.0, and every tool
    argument after the first and the final answer occur in the question or earlier observations."""
    tasks, env = replay_env
    for i, expected in enumerate(tasks):
        prompt, _ = env.reset(options={"index": i})
        task = env.unwrapped.task
        assert task == expected
        seen = task.question
        for k, action in enumerate(task.gold_trace):
            call = TOOL_CALL.search(action)
            if call is not None:
                arg = call.group(2).strip()
                if name != "arithmetic":  # python code restates the question's numbers; checked elsewhere
                    assert arg in seen, f"{task.id} step {k}: {arg!r} was not in any earlier observation"
            obs, reward, terminated, truncated, info = env.step(action)
            last = k == len(task.gold_trace) - 1
            assert (terminated, truncated) == (last, False), f"{task.id} step {k}: {info}"
            if not last:
                assert info["tool_result"]["ok"], f"{task.id} step {k}: tool failed: {obs}"
                seen += obs
        assert reward == 1.0, f"{task.id}: reward {reward}, info {info}"
        assert info["format_ok"] and info["tool_calls"] == task.metadata["tool_calls"]
        assert task.answers[0] in seen.split("</result>")[-2], (
            f"{task.id}: answer not in the last tool result"
        )
