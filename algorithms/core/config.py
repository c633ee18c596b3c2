"""Dataclass configs from YAML presets plus `key=value` overrides, with errors that name the key.

    >>> from dataclasses import dataclass, field
    >>> from algorithms.core.config import build_config
    >>> @dataclass
    ... class Demo:
    ...     lr: float = 1e-6
    ...     env_kwargs: dict = field(default_factory=dict)
    >>> build_config(Demo, None, ["lr=3e-4", "env_kwargs.world.difficulty=2"])
    Demo(lr=0.0003, env_kwargs={'world': {'difficulty': 2}})

Override values are parsed as YAML (`3e-4` → float, `true` → bool, `[1,2]` → list, `null` →
None). Dotted keys reach into dict fields. Unknown keys are errors with the closest valid name.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def _suggest(key: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _parse_value(text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    # YAML 1.1 reads "1e-4" as a string; numbers with exponents are floats here
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _coerce(name: str, value: Any, current: Any, where: str) -> Any:
    """Make YAML scalars fit the field's default type (ints into float fields, '1e-4' into float)."""
    if isinstance(current, bool) or value is None or current is None:
        return value
    if isinstance(current, float) and isinstance(value, int | str) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{where}: field {name!r} must be a number, got {value!r}") from None
    if isinstance(current, int) and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def build_config(
    cls: type[T],
    path: str | os.PathLike | None,
    overrides: Sequence[str] = (),
    *,
    ignore: Sequence[str] = ("algo",),
) -> T:
    """Defaults of `cls` ← the YAML file at `path` ← `key=value` overrides; then `validate()`.

    Keys in `ignore` (e.g. `algo`, which the CLI reads itself) may appear in the file.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    defaults = cls()
    merged: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} not found")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML ({exc})") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: a config is a mapping of key: value, got {type(data).__name__}")
        for key, value in data.items():
            if key in ignore:
                continue
            if key not in names:
                raise ValueError(f"{path}: unknown config key {key!r}{_suggest(key, names)}")
            merged[key] = _coerce(key, value, getattr(defaults, key), str(path))
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value")
        key, text = item.split("=", 1)
        top, *rest = key.split(".")
        if top not in names:
            raise ValueError(f"override {item!r}: unknown config key {top!r}{_suggest(top, names)}")
        value = _parse_value(text)
        if rest:
            base = merged.get(top, getattr(defaults, top))
            if not isinstance(base, dict):
                raise ValueError(f"override {item!r}: {top!r} is not a mapping, so {key!r} cannot be set")
            node = base = _deep_copy(base)
            for part in rest[:-1]:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ValueError(f"override {item!r}: {part!r} is not a mapping")
            node[rest[-1]] = value
            merged[top] = base
        else:
            merged[top] = _coerce(top, value, getattr(defaults, top), f"override {item!r}")
    cfg = cls(**merged)
    validate = getattr(cfg, "validate", None)
    if validate is not None:
        validate()
    return cfg


def _deep_copy(d: dict) -> dict:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def config_dict(cfg: Any) -> dict[str, Any]:
    """The fully resolved config as plain data (for config.json and the start-of-run log)."""
    return dataclasses.asdict(cfg)


__all__ = ["build_config", "config_dict"]
