"""Test helpers of the rollout tests: a small arithmetic tool and ToolEnvs of math tasks."""

from __future__ import annotations

import ast
import asyncio
import operator
import random

from agent_envs.base.task import Task
from agent_envs.base.tool import Tool, ToolResult
from agent_envs.core.env import ToolEnv
from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT

# SFT warm-up steps of the shared tiny model: enough for it to write <python> calls and answers
WARMUP_STEPS = 150

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: operator.mod}


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("only integer + - * % are supported")


class CalcTool(Tool):
    """A small test tool named `python`: evaluates `print(<integer arithmetic>)`, optionally slowly.

    Stands in for the sandboxed python tool (owned elsewhere) so these tests need no sandbox.
    """

    name = "python"
    argument = "code"
    description = "runs Python code and returns what it prints"

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0

    async def call(self, arg: str) -> ToolResult:
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            code = arg.strip()
            if code.startswith("print(") and code.endswith(")"):
                code = code[6:-1]
            try:
                return ToolResult(str(_eval(ast.parse(code, mode="eval").body)))
            except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as exc:
                return ToolResult(f"Error: {type(exc).__name__}: {exc}")
        finally:
            self.in_flight -= 1


def math_tasks(n: int, seed: int = 0) -> list[Task]:
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        a, b = rng.randint(10, 9999), rng.randint(2, 99)
        tasks.append(
            Task(id=f"calc-{i}", question=f"What is {a} * {b}?", answers=[str(a * b)], reward="math")
        )
    return tasks


def make_env(
    tokenizer, tool: Tool | None = None, n_tasks: int = 8, max_response_tokens: int = 256
) -> ToolEnv:
    return ToolEnv(
        math_tasks(n_tasks),
        [tool or CalcTool()],
        tokenizer=tokenizer,
        system_prompt=WARMUP_SYSTEM_PROMPT,
        max_response_tokens=max_response_tokens,
        max_tool_calls=3,
    )
