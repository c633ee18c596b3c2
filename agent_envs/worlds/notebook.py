"""Notebook tasks: a computation spread over several python calls, each reusing what the earlier
ones defined, so only a stateful python tool (`PythonTool(session=True)`) carries it through.

Each task names its steps; the gold trace makes one python call per step and answers with what
the last call printed. Every call after the first uses a name an earlier call defined, so with a
stateless tool the later calls fail with a `NameError` and a policy that copies the last printed
value answers wrong:

    >>> from agent_envs.worlds.notebook import NotebookWorld, NotebookConfig
    >>> task = NotebookWorld(NotebookConfig(seed=0))[0]
    >>> task.reward, task.metadata["needs_session"], len(task.gold_trace) == task.metadata["tool_calls"] + 1
    ('math', True, True)

Families (each task draws one, uniformly):

| family | the calls | example |
|---|---|---|
| `chain` | set x, then one operation on x per call, then print x | x = 4821; x *= 37; x += 905; x %= 9973 |
| `function` | define f, then apply f to several inputs, then add the results | f(n) = steps of the Collatz map to 1 |
| `table` | build a list (a sieve of primes), then query it | the 57th prime below 20000, then a count |

`gym.make("AgentNotebook-v0")` plays it with the session tool it needs
(`NotebookWorld(...).make_tools()`).
"""

from __future__ import annotations

from dataclasses import dataclass
from random import Random

from agent_envs.base.config import option
from agent_envs.base.task import Task
from agent_envs.base.tool import Tool
from agent_envs.worlds.base import World, WorldConfig, register_world

TASK_KINDS = ("chain", "function", "table")  # a task's `family` in its metadata; one method each
PLAN = "<think> I will work it out step by step in python, reusing what I defined. </think> "
NEXT = "<think> Next step, reusing the earlier result. </think> "


@dataclass
class NotebookConfig(WorldConfig):
    """Notebook world settings: `steps` python calls per task (the first defines, the rest reuse)."""

    steps: int = option(3, "python calls in a gold trace (2-6): the first defines, the others reuse")

    def validate(self) -> None:
        super().validate()
        self._require("steps", 2 <= self.steps <= 6, "must be in [2, 6]")


@register_world
class NotebookWorld(World):
    """Multi-call python tasks (`reward="math"`) whose calls share variables."""

    name = "notebook"
    config_class = NotebookConfig
    config: NotebookConfig

    def make_tools(self, timeout_s: float = 10.0) -> list[Tool]:
        from agent_envs.tools.python import PythonTool

        return [PythonTool(timeout_s=timeout_s, session=True)]

    def _make_task(self, rng: Random, index: int) -> Task:
        family = rng.choice(TASK_KINDS)
        question, cells, value = getattr(self, f"_{family}")(rng, self.config.steps)
        trace = [f"{PLAN if i == 0 else NEXT}<python>{cell}</python>" for i, cell in enumerate(cells)]
        trace.append(f"<think> The last result is {value}. </think> <answer> \\boxed{{{value}}} </answer>")
        return Task(
            id=self.task_id(index),
            question=question + " Use one python call per step, reusing the names defined before.",
            answers=[str(value)],
            reward="math",
            metadata=self.metadata(index, family=family, hops=len(cells), tool_calls=len(cells), needs_tool=True,
                                   needs_session=True),
            gold_trace=trace,
        )

    # Each family returns (question, one cell per step, answer); a cell's last line prints.

    def _chain(self, rng: Random, steps: int) -> tuple[str, list[str], int]:
        x = rng.randint(1000, 99999)
        cells, words, value = [f"x = {x}\nprint(x)"], [f"Let x = {x}."], x
        for _ in range(steps - 1):
            op, k = rng.choice(("*", "+", "%", "-")), rng.randint(3, 9999)
            value = {"*": value * k, "+": value + k, "%": value % k, "-": value - k}[op]
            cells.append(f"x = x {op} {k}\nprint(x)")
            words.append({"*": f"multiply x by {k}", "+": f"add {k} to x", "%": f"replace x by x mod {k}",
                          "-": f"subtract {k} from x"}[op])
        return f"{words[0]} Then, in order: {'; '.join(words[1:])}. What is x at the end?", cells, value

    def _function(self, rng: Random, steps: int) -> tuple[str, list[str], int]:
        inputs = [rng.randint(10, 9999) for _ in range(steps - 1)]
        define = ("def f(n):\n    s = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
                  "        s += 1\n    return s\ntotal = 0\nprint(f(27))")
        cells = [define] + [f"total += f({n})\nprint(total)" for n in inputs]
        value = sum(_collatz_steps(n) for n in inputs)
        question = (f"Let f(n) be the number of steps the Collatz map takes from n to 1. Define f, then add "
                    f"f(n) for n = {', '.join(map(str, inputs))}, one call per n. What is the total?")
        return question, cells, value

    def _table(self, rng: Random, steps: int) -> tuple[str, list[str], int]:
        limit = rng.randint(5000, 30000)
        primes = _primes_below(limit)
        cells = [f"N = {limit}\nsieve = [True] * N\nsieve[0] = sieve[1] = False\n"
                 "for i in range(2, int(N ** 0.5) + 1):\n    if sieve[i]:\n"
                 "        sieve[i * i :: i] = [False] * len(range(i * i, N, i))\n"
                 "primes = [i for i, p in enumerate(sieve) if p]\nprint(len(primes))"]
        picks = [rng.randint(1, len(primes)) for _ in range(steps - 1)]
        cells += [f"acc = {'acc + ' if i else ''}primes[{k} - 1]\nprint(acc)" for i, k in enumerate(picks)]
        value = sum(primes[k - 1] for k in picks)
        ordinals = ", ".join(f"the {k}th" for k in picks)
        question = (f"List the primes below {limit} with a sieve. Then add up {ordinals} prime of that list "
                    "(counting from 1), one call per prime, keeping a running sum. What is the sum?")
        return question, cells, value


def _collatz_steps(n: int) -> int:
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def _primes_below(limit: int) -> list[int]:
    sieve = [True] * limit
    sieve[0] = sieve[1] = False
    for i in range(2, int(limit**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = [False] * len(range(i * i, limit, i))
    return [i for i, p in enumerate(sieve) if p]


__all__ = ["TASK_KINDS", "NotebookConfig", "NotebookWorld"]
