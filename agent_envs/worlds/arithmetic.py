"""Arithmetic and algebra tasks whose reliable solution needs the python tool.

Numbers are large enough that mental arithmetic is unreliable for a small model, and the gold
trace is one python call followed by an answer copied from its output:

    >>> from agent_envs.worlds import ArithmeticWorld, ArithmeticConfig
    >>> w = ArithmeticWorld(ArithmeticConfig(seed=0, difficulty=1))
    >>> task = w[0]
    >>> task.reward, len(task.gold_trace), task.metadata["family"] in PROBLEM_FAMILIES[1]
    ('math', 2, True)

Difficulty levels (each task draws one family of its level, uniformly):

| level | families | example |
|---|---|---|
| 1 (default) | `mul`, `add`, `sub`, `mod` | What is 48213 * 917? |
| 2 | `mul_add`, `mul_mod`, `pow_mod` | What is 5821^317 mod 9973? |
| 3 | `linear_system`, `mod_inverse` | Solve 3x + 5y = 31 and 2x - y = 3. What is x? |

A difficulty mix and an imperfect teacher (all off by default) give RL a strategy to learn:

* `easy_fraction`: this share of tasks adds, subtracts or multiplies two one-digit numbers
  (metadata `needs_tool` False); their intended trace answers at once, without the tool.
* `teacher_shortcut`: this share of the tasks that need the tool get a trace that skips it and
  guesses a wrong answer of the right size (metadata `teacher` "shortcut", `trace_correct` False).
* `teacher_needless_tool`: this share of easy tasks get a trace that calls python anyway
  (`teacher` "needless_tool": correct, but a wasted call).

    >>> w = ArithmeticWorld(ArithmeticConfig(seed=0, easy_fraction=0.5, teacher_shortcut=1.0))
    >>> hard = next(t for t in (w[i] for i in range(20)) if t.metadata["needs_tool"])
    >>> hard.metadata["teacher"], hard.metadata["trace_correct"], hard.metadata["tool_calls"]
    ('shortcut', False, 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from random import Random
from typing import ClassVar

from agent_envs.base.config import option
from agent_envs.base.task import Task
from agent_envs.base.tool import Tool
from agent_envs.worlds.base import World, WorldConfig, register_world

# difficulty level -> the problem families a task of that level draws from (the module table)
PROBLEM_FAMILIES: dict[int, tuple[str, ...]] = {
    1: ("mul", "add", "sub", "mod"),
    2: ("mul_add", "mul_mod", "pow_mod"),
    3: ("linear_system", "mod_inverse"),
}

# Three wordings per family, so a model learns the operation, not one sentence.
TEMPLATES: dict[str, tuple[str, ...]] = {
    "mul": ("What is {a} * {b}?", "Compute the product of {a} and {b}.", "Multiply {a} by {b}."),
    "add": ("What is {a} + {b}?", "Compute the sum of {a} and {b}.", "Add {a} and {b}."),
    "sub": ("What is {a} - {b}?", "Compute {a} minus {b}.", "Subtract {b} from {a}."),
    "mod": (
        "What is {a} mod {b}?",
        "Find the remainder when {a} is divided by {b}.",
        "Compute {a} modulo {b}.",
    ),
    "mul_add": (
        "What is {a} * {b} {s} {c}?",
        "Multiply {a} by {b}, then {verb} {c}.",
        "Compute {a} times {b} {s} {c}.",
    ),
    "mul_mod": (
        "What is ({a} * {b}) mod {m}?",
        "Find the remainder when {a} * {b} is divided by {m}.",
        "Compute the product of {a} and {b} modulo {m}.",
    ),
    "pow_mod": (
        "What is {a}^{e} mod {m}?",
        "Find the remainder when {a} to the power {e} is divided by {m}.",
        "Compute {a} ** {e} modulo {m}.",
    ),
    "linear_system": (
        "Solve {eq1} and {eq2}. What is {var}?",
        "Find {var} if {eq1} and {eq2}.",
        "Given {eq1} and {eq2}, what is {var}?",
    ),
    "mod_inverse": (
        "Find the inverse of {a} modulo {m}.",
        "What is the modular inverse of {a} mod {m}?",
        "Find x between 1 and {m} with {a} * x mod {m} = 1.",
    ),
}

PLAN = "<think> I will compute it with python. </think> "
# The teacher says the same when it answers from the question, right (easy task) or not (shortcut).
MENTAL = "<think> I can do this in my head. </think> "
EASY_FAMILIES = ("add", "sub", "mul")


@dataclass
class ArithmeticConfig(WorldConfig):
    """Arithmetic world settings. `difficulty` picks the family level (1-3, see the module table)."""

    difficulty: int = option(1, "1: one operation; 2: two operations, modular powers; 3: linear systems, inverses")
    min_digits: int = option(2, "operands have between min_digits and max_digits digits")
    max_digits: int = option(5, "the most digits of an operand")
    easy_fraction: float = option(0.0, "share of one-digit add/sub/mul tasks, answerable without the tool")
    teacher_needless_tool: float = option(0.0, "share of easy tasks whose gold trace calls python anyway")

    max_difficulty: ClassVar[int] = 3

    def validate(self) -> None:
        super().validate()
        self._require("min_digits", 1 <= self.min_digits <= 12, "must be in [1, 12]")
        self._require("max_digits", self.min_digits <= self.max_digits <= 12, "must be in [min_digits, 12]")


@register_world
class ArithmeticWorld(World):
    """Procedural arithmetic/algebra tasks (`reward="math"`), solved with `PythonTool`."""

    name = "arithmetic"
    config_class = ArithmeticConfig
    config: ArithmeticConfig

    def make_tools(self, timeout_s: float = 10.0) -> list[Tool]:
        from agent_envs.tools.python import PythonTool

        return [PythonTool(timeout_s=timeout_s)]

    def _number(self, rng: Random, max_digits: int | None = None) -> int:
        hi = self.config.max_digits if max_digits is None else max(self.config.min_digits, max_digits)
        digits = rng.randint(self.config.min_digits, hi)
        return rng.randint(max(2, 10 ** (digits - 1)), 10**digits - 1)

    def _make_task(self, rng: Random, index: int) -> Task:
        # draws only when the mix is on, so the default world's tasks stay as they were
        easy = self.config.easy_fraction > 0 and rng.random() < self.config.easy_fraction
        family = rng.choice(EASY_FAMILIES if easy else PROBLEM_FAMILIES[self.config.difficulty])
        template = rng.randrange(3)
        fields, code, value = self._easy(rng, family) if easy else getattr(self, f"_{family}")(rng)
        question = TEMPLATES[family][template].format(**fields)
        answer = f"<think> The result is {value}. </think> <answer> \\boxed{{{value}}} </answer>"
        tool_trace = [f"{PLAN}<python>{code}</python>", answer]
        if easy:
            needless = self.config.teacher_needless_tool > 0 and rng.random() < self.config.teacher_needless_tool
            teacher = "needless_tool" if needless else "intended"
            trace = tool_trace if needless else [f"{MENTAL}<answer> \\boxed{{{value}}} </answer>"]
        elif self.takes_shortcut(rng):
            teacher, trace = "shortcut", [f"{MENTAL}<answer> \\boxed{{{_guess(rng, value)}}} </answer>"]
        else:
            teacher, trace = "intended", tool_trace
        return Task(
            id=self.task_id(index),
            question=question,
            answers=[str(value)],
            reward="math",
            metadata=self.metadata(
                index, teacher, family=family, template=template, hops=1, tool_calls=len(trace) - 1,
                needs_tool=not easy,
            ),
            gold_trace=trace,
        )

    def _easy(self, rng: Random, family: str) -> tuple[dict, str, int]:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        if family == "sub":
            a, b = max(a, b), min(a, b)
        symbol, value = {"add": ("+", a + b), "sub": ("-", a - b), "mul": ("*", a * b)}[family]
        return {"a": a, "b": b}, f"print({a} {symbol} {b})", value

    # Each family returns (template fields, python code, answer).

    def _mul(self, rng: Random) -> tuple[dict, str, int]:
        a, b = self._number(rng), self._number(rng)
        return {"a": a, "b": b}, f"print({a} * {b})", a * b

    def _add(self, rng: Random) -> tuple[dict, str, int]:
        a, b = self._number(rng), self._number(rng)
        return {"a": a, "b": b}, f"print({a} + {b})", a + b

    def _sub(self, rng: Random) -> tuple[dict, str, int]:
        a, b = self._number(rng), self._number(rng)
        return {"a": a, "b": b}, f"print({a} - {b})", a - b

    def _mod(self, rng: Random) -> tuple[dict, str, int]:
        a = self._number(rng)
        b = self._number(rng, max_digits=len(str(a)))
        a, b = max(a, b), min(a, b)  # a modulus above the number would make the task trivial
        return {"a": a, "b": b}, f"print({a} % {b})", a % b

    def _mul_add(self, rng: Random) -> tuple[dict, str, int]:
        a, b, c = self._number(rng), self._number(rng), self._number(rng)
        sign, verb = rng.choice((("+", "add"), ("-", "subtract")))
        value = a * b + c if sign == "+" else a * b - c
        return {"a": a, "b": b, "c": c, "s": sign, "verb": verb}, f"print({a} * {b} {sign} {c})", value

    def _mul_mod(self, rng: Random) -> tuple[dict, str, int]:
        a, b, m = self._number(rng), self._number(rng), self._number(rng)
        return {"a": a, "b": b, "m": m}, f"print({a} * {b} % {m})", a * b % m

    def _pow_mod(self, rng: Random) -> tuple[dict, str, int]:
        a, m = self._number(rng), self._number(rng)
        e = rng.randint(10, 999)
        return {"a": a, "e": e, "m": m}, f"print(pow({a}, {e}, {m}))", pow(a, e, m)

    def _linear_system(self, rng: Random) -> tuple[dict, str, int]:
        while True:
            a, b, d, e = (rng.choice((-1, 1)) * rng.randint(1, 20) for _ in range(4))
            if a * e - b * d != 0:
                break
        x, y = (
            rng.choice((-1, 1)) * rng.randint(1, 10 ** min(self.config.max_digits, 3) - 1) for _ in range(2)
        )
        c, f = a * x + b * y, d * x + e * y
        var = rng.choice("xy")
        # Cramer's rule; the solution is an integer by construction, so // is exact.
        num = "c*e-b*f" if var == "x" else "a*f-c*d"
        code = f"a,b,c,d,e,f={a},{b},{c},{d},{e},{f}\nprint(({num})//(a*e-b*d))"
        fields = {"eq1": _equation(a, b, c), "eq2": _equation(d, e, f), "var": var}
        return fields, code, x if var == "x" else y

    def _mod_inverse(self, rng: Random) -> tuple[dict, str, int]:
        while True:
            m = self._number(rng)
            a = rng.randint(2, max(2, m - 1))
            if m > 2 and gcd(a, m) == 1:
                return {"a": a, "m": m}, f"print(pow({a}, -1, {m}))", pow(a, -1, m)


def _guess(rng: Random, value: int) -> int:
    """A wrong answer that looks right: same sign and length, same leading digit, other digits random."""
    digits = str(abs(value))
    while True:
        tail = "".join(str(rng.randrange(10)) for _ in digits[1:])
        guess = int(digits[0] + tail) if len(digits) > 1 else rng.randrange(10)
        guess = -guess if value < 0 else guess
        if guess != value:
            return guess


def _equation(a: int, b: int, c: int) -> str:
    """`3x - y = 7` style text for a*x + b*y = c."""

    def term(coef: int, var: str) -> str:
        return var if abs(coef) == 1 else f"{abs(coef)}{var}"

    first = ("-" if a < 0 else "") + term(a, "x")
    return f"{first} {'-' if b < 0 else '+'} {term(b, 'y')} = {c}"
