"""What every procedural world shares: a seeded config, deterministic indexing, and a registry.

A world is an indexable source of `Task`s (what `ToolEnv` plays) plus the tools its tasks need.
Task `i` of a world is built from `Random(seed * 1_000_003 + i)` alone, so the same config always
gives the same task, and any index can be generated without the ones before it.

    >>> from agent_envs.worlds import make_world
    >>> w = make_world("arithmetic", seed=0)
    >>> w[3] == make_world("arithmetic", seed=0)[3]
    True

Gold traces come from a scripted *teacher*. By default it is perfect: every trace solves its task
the intended way. Real cold-start data comes from imperfect teachers, and fixing their strategy
is what RL is for, so `teacher_shortcut` makes a share of traces take the world's shortcut
(answer without the tool, or stop after one hop) and guess a wrong answer. Each task's metadata
says what its trace does: `teacher` is `"intended"`, `"shortcut"` or `"needless_tool"` (a tool
call the task did not need), and `trace_correct` is False exactly when replaying the trace does
not earn the reward.
"""

from __future__ import annotations

import typing
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from functools import cache
from random import Random
from typing import Any, ClassVar

from agent_envs.base.config import check_types, from_mapping, option, require, suggest
from agent_envs.base.task import Task
from agent_envs.base.tool import Tool

# Task i of seed s uses Random(s * SEED_STRIDE + i): distinct for every (s, i) with i < SEED_STRIDE.
SEED_STRIDE = 1_000_003


@dataclass
class WorldConfig:
    """Fields every world has. Subclasses add their own (with `option(default, help)`) and extend
    `validate()`; every float field of a world config is a share in [0, 1]."""

    seed: int = option(0, "the world (entities, pages) and every task derive from it")
    difficulty: int = option(1, "meaning is per world; see each world's config")
    size: int = option(100_000, "len(world): how many task indices are valid")
    # Teacher policy of the gold traces (see `World.takes_shortcut`)
    teacher_shortcut: float = option(
        0.0, "share of gold traces that take the world's shortcut (skip the tool, stop after one hop) and guess"
    )

    max_difficulty: ClassVar[int] = 1

    def validate(self) -> None:
        """Raise ValueError naming the first bad field and its allowed range."""
        name = type(self).__name__
        for f in fields(self):  # shares first: their rule also covers their type
            if _hints(type(self))[f.name] is float:
                self._require(f.name, _is_share(getattr(self, f.name)), "must be a share in [0, 1]")
        check_types(self, f"{name}.")
        self._require("seed", self.seed >= 0, "must be >= 0")
        self._require("size", 1 <= self.size <= SEED_STRIDE, f"must be in [1, {SEED_STRIDE}]")
        self._require("difficulty", 1 <= self.difficulty <= self.max_difficulty, f"must be in [1, {self.max_difficulty}]")

    def _require(self, field_name: str, ok: bool, rule: str) -> None:
        require(ok, f"{type(self).__name__}.{field_name}", rule, getattr(self, field_name))


def _is_share(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0


class World(ABC):
    """An indexable, seeded source of tasks with gold traces (a `TaskSource` for `ToolEnv`)."""

    name: ClassVar[str] = "world"
    config_class: ClassVar[type[WorldConfig]] = WorldConfig

    def __init__(self, config: WorldConfig | None = None) -> None:
        config = config if config is not None else self.config_class()
        if not isinstance(config, self.config_class):
            raise TypeError(
                f"{type(self).__name__} takes a {self.config_class.__name__}, got {type(config).__name__}"
            )
        config.validate()
        self.config = config

    def __len__(self) -> int:
        return self.config.size

    def __getitem__(self, index: int) -> Task:
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"{self.name} world indices are ints, got {type(index).__name__}")
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(
                f"task index {index} is out of range for the {self.name} world of size {len(self)}"
            )
        return self._make_task(Random(self.config.seed * SEED_STRIDE + index), index)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"

    def task_id(self, index: int) -> str:
        return f"{self.name}-s{self.config.seed}-{index}"

    def metadata(self, index: int, teacher: str = "intended", **extra: Any) -> dict[str, Any]:
        """Metadata every task of a world carries, plus world-specific fields."""
        return {
            "world": self.name,
            "seed": self.config.seed,
            "index": index,
            "difficulty": self.config.difficulty,
            "teacher": teacher,
            "trace_correct": teacher != "shortcut",
            **extra,
        }

    def takes_shortcut(self, rng: Random) -> bool:
        """Whether the teacher takes the shortcut on this task (draws from `rng` only when the
        policy is on, so worlds with the default perfect teacher keep their tasks unchanged)."""
        share = self.config.teacher_shortcut
        return share > 0 and rng.random() < share

    @abstractmethod
    def _make_task(self, rng: Random, index: int) -> Task:
        """Build task `index` using only `rng` (and the world's seeded structure)."""

    @abstractmethod
    def make_tools(self) -> list[Tool]:
        """Fresh instances of the tools this world's tasks need, with deterministic output."""


WORLDS: dict[str, type[World]] = {}


def register_world(world: type[World]) -> type[World]:
    """Add a world class to the registry under its `name`."""
    old = WORLDS.get(world.name)
    # re-registering the same class (a module reload) replaces it; another class is a clash
    if old is not None and (old.__module__, old.__qualname__) != (world.__module__, world.__qualname__):
        raise ValueError(
            f"a world named {world.name!r} is already registered ({old.__module__}.{old.__qualname__})"
        )
    WORLDS[world.name] = world
    return world


def make_world(name: str, **config: Any) -> World:
    """Build a registered world from config fields, e.g. `make_world("web", seed=1, difficulty=3)`."""
    if name not in WORLDS:
        raise KeyError(f"unknown world {name!r}; registered worlds: {sorted(WORLDS)}")
    cls = WORLDS[name]
    known = [f.name for f in fields(cls.config_class)]
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ValueError(f"{cls.config_class.__name__} has no field(s) {unknown}{suggest(unknown[0], known)}; "
                         f"fields are {sorted(known)}")
    return cls(world_config(cls.config_class, config))


def world_config(config_class: type[WorldConfig], values: Any, where: str = "world",
                 prefix: str = "world.") -> WorldConfig:
    """A world config from a mapping (`env_kwargs.world`): unknown keys are named with the closest
    field, values are type-checked, and the world's own rules run (`validate`)."""
    if isinstance(values, config_class):
        values = {f.name: getattr(values, f.name) for f in fields(values)}
    config = from_mapping(config_class, values if values is not None else {}, where, prefix)
    config.validate()
    return config


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)
