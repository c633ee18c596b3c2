"""ToolVectorEnv: episodes step concurrently, autoreset, partial steps.

The tool is an in-process test tool that counts how many of its calls are in flight at once;
that count proves concurrency without timing anything.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from agent_envs import Task, Tool, ToolEnv, ToolResult
from agent_envs.core.env import background_loop
from agent_envs.core.vector import ToolVectorEnv


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
    assert rew.tolist() == [1.0, 0.0] and term.tolist() == [True, False] and infos[1]["skipped"]
    obs, rew, term, trunc, infos = venv.step(["ignored", gold[1]])
    assert infos[0]["autoreset"] and obs[0].endswith("assistant\n") and rew.tolist() == [0.0, 1.0]


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
        assert rew.tolist() == [1.0] * 4 and term.all() and all(i["format_ok"] for i in infos)
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
    assert infos[1]["tool"] == "search" and infos[0]["pred"] is not None


def test_step_or_defer_waits_only_for_what_needs_waiting():
    """Answers come back at once; a tool call, and a math answer only the symbolic stage can
    decide, come back as coroutines that `astep` would have run; the result is the same."""
    env = ToolEnv([Task(id="m", question="sin 45?", answers=["\\frac{\\sqrt{2}}{2}"], reward="math")], [Gate(1)])
    env.reset(seed=0)
    now, later = env.step_or_defer("<think>x</think><answer>\\boxed{\\frac{\\sqrt{2}}{2}}</answer>")
    assert later is None and now[1] == 1.0 and now[4]["math_method"] == "cheap"
    env.reset(seed=0)
    now, later = env.step_or_defer("<think>x</think><answer>\\boxed{\\frac{1}{\\sqrt{2}}}</answer>")
    assert now is None
    obs, reward, terminated, truncated, info = asyncio.run(later)
    assert reward == 1.0 and terminated and info["math_method"] != "cheap"
    env.reset(seed=0)
    now, later = env.step_or_defer("<think>x</think><search>q</search>")
    assert now is None and asyncio.run(later)[0] == " <result>\nabout q\n</result>"
