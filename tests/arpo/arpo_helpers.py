"""Helpers for the ARPO/AEPO tests: a calculator tool, envs, a scripted engine.

The scripted engine stands in for a model only where a real one cannot do the job: the branch
statistics need segments whose entropies we choose exactly. Its segments are real tokenizer
output driven through the real runner and real `ToolEnv`s; every invariant test uses the real
tiny model through the HF or vLLM engine.
"""

from __future__ import annotations

import asyncio
import math
import re

from agent_envs.base.task import Task
from agent_envs.base.tool import Tool, ToolResult
from agent_envs.core.env import ToolEnv
from algorithms.rollout.engine import SamplingParams, Segment


class Calculator(Tool):
    """`python` tool for tests: evaluates `print(<int> <op> <int>)` in-process, nothing else."""

    name = "python"
    argument = "code"
    description = "runs Python code and returns what it prints"

    async def call(self, arg: str) -> ToolResult:
        m = re.fullmatch(r"\s*print\(\s*(-?\d+)\s*([-+*%])\s*(-?\d+)\s*\)\s*", arg)
        if not m:
            return ToolResult(text="SyntaxError: only print(a op b) is supported here", ok=True)
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        value = {"+": a + b, "-": a - b, "*": a * b, "%": a % b if b else 0}[op]
        return ToolResult(text=str(value))


def math_tasks(n: int = 8) -> list[Task]:
    pairs = [(12, 7, "+"), (305, 4, "*"), (9999, 17, "%"), (81, 64, "-"), (44, 3, "*"), (7, 8, "+")]
    tasks = []
    for i in range(n):
        a, b, op = pairs[i % len(pairs)]
        value = {"+": a + b, "-": a - b, "*": a * b, "%": a % b}[op]
        tasks.append(
            Task(id=f"calc-{i}", question=f"What is {a} {op} {b}?", answers=[str(value)], reward="math")
        )
    return tasks


def make_env_factory(tokenizer, tasks=None, max_tool_calls: int = 3):
    tasks = tasks or math_tasks()

    def make() -> ToolEnv:
        return ToolEnv(tasks, [Calculator()], tokenizer=tokenizer, max_tool_calls=max_tool_calls)

    return make


TOP_K = 10


def top_probability(h: float, k: int = TOP_K) -> float:
    """p ≥ 1/k such that one token with p and k − 1 tokens sharing 1 − p have entropy h (≤ ln k)."""
    if not 0 <= h <= math.log(k):
        raise ValueError(f"{k} entries give an entropy in [0, ln {k}], got {h}")

    def entropy(p: float) -> float:
        q = (1 - p) / (k - 1)
        return -p * math.log(p) - (k - 1) * (q * math.log(q) if q > 0 else 0.0)

    lo, hi = 1.0 / k, 1.0 - 1e-15  # entropy falls from ln k to 0 as p goes from 1/k to 1
    for _ in range(100):
        mid = (lo + hi) / 2
        if entropy(mid) > h:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class ScriptedEngine:
    """A `RolloutEngine` whose per-position entropies are chosen by the test.

    Each branch first calls the tool once (`<python> print(1 + 1) </python>`, stop), then answers
    (`<answer> \\boxed{2} </answer>` + EOS). Every position of a first segment has entropy
    `h_first`; every position after a tool result has entropy `h_react(n_results)`, where
    n_results is how many results the branch has seen. `calls_before_answer` tool calls are made
    before the answer.
    """

    def __init__(self, tokenizer, h_first: float, h_react, calls_before_answer: int = 1) -> None:
        self.tokenizer = tokenizer
        self.h_first = h_first
        self.h_react = h_react if callable(h_react) else (lambda _n: h_react)
        self.calls = calls_before_answer
        self.result_id = tokenizer.convert_tokens_to_ids("</result>")
        self.turn_id = tokenizer.convert_tokens_to_ids("<|im_start|>")
        enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        self.call_ids = enc("<python> print(1 + 1) </python>")
        self.answer_ids = [*enc("<answer> \\boxed{2} </answer>"), tokenizer.eos_token_id]
        self.requests = 0  # segments generated
        self.batches = 0  # engine calls

    def _rows(self, h: float, n: int) -> list[list[float]]:
        p = top_probability(h)
        rest = math.log((1 - p) / (TOP_K - 1)) if p < 1 else -math.inf
        return [[math.log(p)] + [rest] * (TOP_K - 1)] * n

    def generate(self, prompts, params):
        params = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        self.batches += 1
        out = []
        for ids, p in zip(prompts, params, strict=True):
            self.requests += 1
            ids = list(ids)
            start = len(ids) - ids[::-1].index(self.turn_id)  # the response starts after the last turn marker
            seen = sum(1 for t in ids[start:] if t == self.result_id)
            h = self.h_first if seen == 0 else self.h_react(seen)
            if seen < self.calls:
                toks, reason, stop, text = (
                    self.call_ids,
                    "stop",
                    "</python>",
                    "<python> print(1 + 1) </python>",
                )
            else:
                toks, reason, stop, text = self.answer_ids, "eos", None, "<answer> \\boxed{2} </answer>"
            toks = toks[: p.max_tokens]
            rows = self._rows(h, len(toks)) if p.logprobs else None
            out.append(
                Segment(list(toks), [rows[0][0] if rows else -0.1] * len(toks), rows, reason, stop, text)
            )
        return out

    async def agenerate(self, prompts, params):
        return self.generate(prompts, params)

    def sync_weights(self, model) -> None:
        pass


def run(coro):
    return asyncio.run(coro)
