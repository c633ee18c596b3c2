"""ToolVectorEnv: episodes step concurrently, autoreset, partial steps.

The tool is an in-process test tool that counts how many of its calls are in flight at once;
that count proves concurrency without timing anything.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from agent_envs import Task, Tool, ToolEnv, ToolResult
from agent_envs.core.env import background_loop
from agent_envs.core.vector import ToolVectorEnv, batch_infos


class Gate(Tool):
    """Every call waits until `n` calls are in flight together (or 5 s pass)."""

    name, argument = "search", "query"

    def __init__(self, n: int) -> None:
        self.n, self.in_flight, self.max_in_flight = n, 0, 0
        self.all_in = asyncio.Event()

    async def call(self, arg: str) -> ToolResult:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.in_flight >= self.n:
            self.all_in.set()
        try:
            await asyncio.wait_for(self.all_in.wait(), 5)
        except TimeoutError:
            return ToolResult(text="alone", ok=False)
        finally:
            self.in_flight -= 1
        return ToolResult(text=f"about {arg}")


TASKS = [Task(id=f"t{i}", question=f"Q{i}?", answers=[f"a{i}"]) for i in range(4)]


def make_vec(n: int, tool: Tool) -> ToolVectorEnv:
    return ToolVectorEnv([lambda: ToolEnv(TASKS, [tool]) for _ in range(n)])


def test_tool_calls_of_all_episodes_run_concurrently():
    gate = Gate(8)
    venv = make_vec(8, gate)
    venv.reset(seed=0)
    obs, rew, term, trunc, infos = venv.step([f"<think>x</think><search>q{i}</search>" for i in range(8)])
    assert gate.max_in_flight == 8
    assert all("about q" in o for o in obs) and not term.any() and not trunc.any()


def test_autoreset_next_step_and_skipped_envs():
    venv = make_vec(2, Gate(1))
    prompts, infos = venv.reset(seed=[5, 6])
    gold = [f"<think>x</think><answer>\\boxed{{{venv.tool_env(i).task.answers[0]}}}</answer>" for i in range(2)]
    obs, rew, term, trunc, infos = venv.step([gold[0], None])
    assert rew.tolist() == [1.0, 0.0] and term.tolist() == [True, False]
    assert infos["_skipped"].tolist() == [False, True] and infos["skipped"][1]
    assert infos["_pred"].tolist() == [True, False] and infos["pred"][0] == venv.tool_env(0).task.answers[0]
    obs, rew, term, trunc, infos = venv.step(["ignored", gold[1]])
    assert infos["_autoreset"].tolist() == [True, False] and obs[0].endswith("assistant\n") and rew.tolist() == [0.0, 1.0]
    assert infos["_messages"].tolist() == [True, False] and infos["task_id"][0] == venv.tool_env(0).task.id


def test_reset_seeds_make_episodes_reproducible():
    a, b = make_vec(3, Gate(1)), make_vec(3, Gate(1))
    assert a.reset(seed=11)[0] == b.reset(seed=11)[0]
    with pytest.raises(ValueError, match="seeds"):
        a.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="actions"):
        a.step(["x"])


def test_single_env_step_from_another_loop_thread_is_fine():
    """`step()` runs tool calls on the shared background loop, so envs built anywhere work."""
    env = ToolEnv(TASKS, [Gate(1)])
    env.reset(seed=0)
    assert env.step("<think>x</think><search>z</search>")[0] == " <result>\nabout z\n</result>"


def test_answers_are_graded_while_the_event_loop_is_busy():
    """A batch of answers never waits for the loop that runs tool calls: here the loop is held
    by a long call, and the answers come back before it is released."""
    loop = background_loop()
    release = threading.Event()

    async def hold_the_loop() -> None:
        release.wait(10)  # blocks the loop thread itself, as a stuck tool would

    held = asyncio.run_coroutine_threadsafe(hold_the_loop(), loop)
    try:
        venv = make_vec(4, Gate(1))
        venv.reset(seed=3)
        gold = [f"<think>x</think><answer>\\boxed{{{venv.tool_env(i).task.answers[0]}}}</answer>" for i in range(4)]
        obs, rew, term, trunc, infos = venv.step(gold)
        assert not release.is_set() and not held.done()
        assert rew.tolist() == [1.0] * 4 and term.all() and infos["format_ok"].all()
    finally:
        release.set()
        held.result(10)


def test_answers_and_tool_calls_in_one_batch():
    venv = make_vec(4, Gate(2))
    venv.reset(seed=0)
    gold = [f"<think>x</think><answer>\\boxed{{{venv.tool_env(i).task.answers[0]}}}</answer>" for i in range(4)]
    actions = [gold[0], "<think>x</think><search>a</search>", "<think>x</think><answer>\\boxed{no}</answer>",
               "<think>x</think><search>b</search>"]
    obs, rew, term, trunc, infos = venv.step(actions)
    assert term.tolist() == [True, False, True, False]
    assert rew[0] == 1.0 and rew[2] < 1.0 and obs[1:4:2] == [" <result>\nabout a\n</result>", " <result>\nabout b\n</result>"]
    assert infos["tool"].tolist() == [None, "search", None, "search"] and infos["pred"][0] is not None
    assert infos["_pred"].tolist() == [True, False, True, False]
    assert infos["calls_per_tool"]["search"].tolist() == [0, 1, 0, 1]
    assert infos["calls_per_tool"]["_search"].tolist() == [False, True, False, True]
    assert infos["tool_result"]["ok"].dtype == bool and infos["tool_result"]["latency_s"].dtype == float


def test_answers_graded_in_process_and_math_that_waits_in_one_batch():
    """An answer the cheap checks decide comes back at once; one only the symbolic stage can
    decide, and a tool call, wait on the loop; each gets what a single env's step gives."""
    task = Task(id="m", question="sin 45?", answers=["\\frac{\\sqrt{2}}{2}"], reward="math")
    venv = ToolVectorEnv([lambda: ToolEnv([task], [Gate(1)]) for _ in range(3)])
    venv.reset(seed=0)
    cheap = "<think>x</think><answer>\\boxed{\\frac{\\sqrt{2}}{2}}</answer>"
    symbolic = "<think>x</think><answer>\\boxed{\\frac{1}{\\sqrt{2}}}</answer>"
    obs, rew, term, trunc, infos = venv.step([cheap, symbolic, "<think>x</think><search>q</search>"])
    assert rew.tolist() == [1.0, 1.0, 0.0] and term.tolist() == [True, True, False]
    assert infos["math_method"][0] == "cheap" and infos["math_method"][1] not in ("cheap", None)
    assert obs[2] == " <result>\nabout q\n</result>"


def test_infos_follow_gymnasiums_vector_convention():
    """Each key an array over the envs with its `_key` mask; a nested dict batched inside; numbers
    of mixed kinds become floats (Gymnasium's own `_add_info` would take the first env's type)."""
    infos = batch_infos([{"f1": 0, "flags": [], "calls": {"search": 1}},
                         {"f1": 0.5, "flags": ["x"], "ok": True}])
    assert infos["f1"].tolist() == [0.0, 0.5] and infos["f1"].dtype == np.float64
    assert infos["flags"].dtype == object and infos["flags"].tolist() == [[], ["x"]]
    assert infos["ok"].tolist() == [False, True] and infos["_ok"].tolist() == [False, True]
    assert infos["calls"]["search"].tolist() == [1, 0] and infos["_calls"].tolist() == [True, False]
    assert infos["calls"]["_search"].tolist() == [True, False]
    swapped = batch_infos([{"a": 1, "b": "x"}, {"b": "y", "a": 2}])  # same keys, another order
    assert swapped["a"].tolist() == [1, 2] and swapped["b"].tolist() == ["x", "y"]


def test_infos_with_as_many_keys_but_other_ones_are_masked():
    """Envs whose infos have the same number of keys, but not the same keys, still get masks (the
    rows are cut by key, so a count alone must not pass for the same keys); one key works too."""
    infos = batch_infos([{"a": 1, "b": "x"}, {"a": 2, "c": 0.5}])
    assert infos["a"].tolist() == [1, 2] and infos["_a"].tolist() == [True, True]
    assert infos["b"].tolist() == ["x", None] and infos["_b"].tolist() == [True, False]
    assert infos["c"].tolist() == [0.0, 0.5] and infos["_c"].tolist() == [False, True]
    single = batch_infos([{"reward": 1.0}, {"reward": 0.0}])
    assert single["reward"].tolist() == [1.0, 0.0] and single["_reward"].tolist() == [True, True]
