"""The response budget when it is the tool's result, not the action, that overflows it.

An action that itself overflows is ended before any tool runs (tests/core/test_env.py); here the
action fits, the tool runs, and its result would push the response past the budget. The episode
must then end as a truncation (not an answer), without the result appended, with the call counted.
The tool is a small in-process one whose output length the test chooses; the sandbox's own output
limits have their own tests.
"""

from __future__ import annotations

import asyncio

import pytest

from agent_envs import Task, Tool, ToolEnv, ToolResult

TASKS = [Task(id="m0", question="What is 6*7?", answers=["42"], reward="math")]
ACTION = "<think>compute</think><python>6*7</python>"
BUDGET = 200


class Verbose(Tool):
    """A python stand-in whose result has the length the test asks for."""

    name, argument, description = "python", "code", "prints a lot"

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls: list[str] = []

    async def call(self, arg: str) -> ToolResult:
        self.calls.append(arg)
        return ToolResult(text="4" * self.size)


def run_step(env: ToolEnv, how: str) -> tuple:
    if how == "step":
        return env.step(ACTION)
    return asyncio.run(env.astep(ACTION))


@pytest.mark.parametrize("how", ["step", "astep"])
def test_tool_result_over_the_budget_truncates(how):
    tool = Verbose(size=BUDGET)  # the action alone fits; with the result it cannot
    env = ToolEnv(TASKS, [tool], max_response_chars=BUDGET)
    env.reset(options={"index": 0})
    assert len(ACTION) < BUDGET
    obs, reward, terminated, truncated, info = run_step(env, how)
    assert (obs, terminated, truncated) == ("", False, True), info
    assert info["end_reason"] == "response_budget" and info["truncated"] is True
    assert tool.calls == ["6*7"] and info["calls_per_tool"] == {"python": 1}  # the call ran and counts
    assert env.state.done and env.state.response == ACTION  # the result was not appended
    assert reward == -1.0  # no answer: the format penalty of the standard recipe
    with pytest.raises(RuntimeError, match="episode of task 'm0' is over"):
        env.step(ACTION)


def test_tool_result_that_fits_continues():
    """The boundary: a result that leaves the response exactly at the budget is appended."""
    probe = ToolEnv(TASKS, [Verbose(size=1)], max_response_chars=1 << 20)
    probe.reset(options={"index": 0})
    wrapper = len(probe.step(ACTION)[0]) - 1  # the protocol's result block around one character
    tool = Verbose(size=BUDGET - len(ACTION) - wrapper)
    env = ToolEnv(TASKS, [tool], max_response_chars=BUDGET)
    env.reset(options={"index": 0})
    obs, reward, terminated, truncated, info = env.step(ACTION)
    assert (terminated, truncated) == (False, False) and obs.count("4") == tool.size
    assert len(env.state.response) == BUDGET
