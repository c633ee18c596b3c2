"""Arithmetic and algebra tasks whose reliable solution needs the python tool.

Numbers are large enough that mental arithmetic is unreliable for a small model, and the gold
trace is one python call followed by an answer copied from its output:

    >>> from agent_envs.worlds import ArithmeticWorld, ArithmeticConfig
    >>> w = ArithmeticWorld(ArithmeticConfig(seed=0, difficulty=1))
    >>> task = w[0]
    >>> task.reward, len(task.gold_trace), task.metadata["family"] in FAMILIES[1]
    ('math', 2, True)

Difficulty levels (each task draws one family of its level, uniformly):

| level | families | example |
|---|---|---|
| 1 (default) | `mul`, `add`, `sub`, `mod` | What is 48213 * 917? |
| 2 | `mul_add`, `mul_mod`, `pow_mod` | What is 5821^317 mod 9973? |
| 3 | `linear_system`, `mod_inverse` | Solve 3x + 5y = 31 and 2x - y = 3. What is x? |
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from random import Random
from typing import ClassVar

from agent_envs.base.task import Task
from agent_envs.base.tool import Tool
from agent_envs.worlds.base import World, WorldConfig, register_world

FAMILIES: dict[int, tuple[str, ...]] = {
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


@dataclass
class ArithmeticConfig(WorldConfig):
    """Arithmetic world settings. `difficulty` picks the family level (1-3, see the module table)."""

    difficulty: int = 1  # 1: one operation; 2: two operations, modular powers; 3: linear systems, inverses
    min_digits: int = 2  # operands have between min_digits and max_digits digits
    max_digits: int = 5

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
        family = rng.choice(FAMILIES[self.config.difficulty])
        template = rng.randrange(3)
        fields, code, value = getattr(self, f"_{family}")(rng)
        question = TEMPLATES[family][template].format(**fields)
        return Task(
            id=self.task_id(index),
            question=question,
            answers=[str(value)],
            reward="math",
            metadata=self.metadata(index, family=family, template=template, hops=1, tool_calls=1),
            gold_trace=[
                f"{PLAN}<python>{code}</python>",
                f"<think> The result is {value}. </think> <answer> \\boxed{{{value}}} </answer>",
            ],
        )

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


def _equation(a: int, b: int, c: int) -> str:
    """`3x - y = 7` style text for a*x + b*y = c."""

    def term(coef: int, var: str) -> str:
        return var if abs(coef) == 1 else f"{abs(coef)}{var}"

    first = ("-" if a < 0 else "") + term(a, "x")
    return f"{first} {'-' if b < 0 else '+'} {term(b, 'y')} = {c}"
