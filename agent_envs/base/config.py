"""Typed dataclass configs from YAML presets plus `key=value` overrides, with errors that name the key.

    >>> from dataclasses import dataclass
    >>> from typing import Literal
    >>> from agent_envs.base.config import build_config, option
    >>> @dataclass
    ... class Demo:
    ...     lr: float = option(1e-6, "learning rate")
    ...     schedule: Literal["constant", "cosine"] = option("constant", "learning-rate schedule")
    ...     env_kwargs: dict = option(factory=dict, help="passed to the env")
    >>> build_config(Demo, None, ["lr=3", "env_kwargs.world.difficulty=2"])
    Demo(lr=3.0, schedule='constant', env_kwargs={'world': {'difficulty': 2}})
    >>> build_config(Demo, None, ["schedule=cosin"])
    Traceback (most recent call last):
    ...
    ValueError: override 'schedule=cosin': config field 'schedule' must be one of ['constant', 'cosine'], got 'cosin' (did you mean 'cosine'?)

Every field declares its type (checked from the annotation: `Literal[...]` choices, numbers,
`X | None`) and its help text (`option(default, help)`). A field whose type is itself a config
dataclass (ARPO's `tree`) is a nested mapping in YAML and a dotted key on the command line
(`tree.beam_size=3`). Override values are parsed as YAML (`3e-4` → float, `true` → bool, `[1,2]`
→ list, `null` → None). Unknown keys, at the top or nested, are errors with the closest valid name.

A preset may start from another file with `inherit: base/tiny.yaml` (relative to the preset,
chains allowed): the preset's keys replace the inherited ones, and mappings merge key by key.

Every entry point declares its settings this way (learners, SFT, `evaluate`, `compare`,
`quickstart`, `play`, the worlds, the tree rollout): `add_flags` turns chosen fields into
`--flags` whose help shows type and default, and `format_help` lists every key for `--help`.
Mistakes in what a user typed raise `UserError` (a ValueError); the `agent-envs` command prints
its message as one line and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

T = TypeVar("T")
INHERIT = "inherit"
_MISSING = dataclasses.MISSING


class UserError(ValueError):
    """A mistake in what the user gave (an id, a file, a key): the message says what and what to do."""


def option(
    default: Any = _MISSING, help: str = "", *, factory: Callable[[], Any] | None = None
) -> Any:
    """A dataclass field with its help text (shown by `agent-envs train --algo X --help`)."""
    if not help:
        raise ValueError("a config option needs its help text")
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_config(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is not None:
        return typing.get_origin(tp).__name__
    return getattr(tp, "__name__", str(tp))


def coerce(tp: Any, value: Any, key: str) -> Any:
    """`value` as type `tp` (ints into float fields, lists into tuples), or a ValueError naming `key`."""

    def fail(what: str) -> ValueError:
        return ValueError(f"config field {key!r} must be {what}, got {value!r}")

    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = list(typing.get_args(tp))
        if value not in choices:
            hint = suggest(value, [str(c) for c in choices]) if isinstance(value, str) else ""
            raise ValueError(f"config field {key!r} must be one of {choices}, got {value!r}{hint}")
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(arg, value, key)
            except ValueError:
                pass
        raise fail(_type_name(tp))
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise fail("true or false")
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise fail("an integer")
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                return float(value)  # YAML 1.1 reads "1e-4" as a string
            except ValueError:
                raise fail("a number") from None
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise fail("a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise fail("a string")
        return value
    if origin is tuple or tp is tuple:
        if not isinstance(value, list | tuple):
            raise fail("a list")
        args = typing.get_args(tp)
        if args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise fail(f"a list of {len(args)}")
            return tuple(coerce(a, v, key) for a, v in zip(args, value, strict=True))
        if args:
            return tuple(coerce(args[0], v, key) for v in value)
        return tuple(value)
    if origin is list or tp is list:
        if not isinstance(value, list | tuple):
            raise fail("a list")
        return list(value)
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise fail("a mapping")
        return dict(value)
    if _is_config(tp):
        if not isinstance(value, tp):
            raise fail(f"a {tp.__name__} mapping")
        return value
    return value


def check_types(cfg: Any, prefix: str = "") -> None:
    """Check (and coerce in place) every field of `cfg` against its annotation; nested configs too."""
    for f in dataclasses.fields(cfg):
        tp = _hints(type(cfg))[f.name]
        value = coerce(tp, getattr(cfg, f.name), prefix + f.name)
        object.__setattr__(cfg, f.name, value)
        if _is_config(tp):
            check_types(value, f"{prefix}{f.name}.")


def suggest(key: str, names: Sequence[str]) -> str:
    """` (did you mean 'x'?)` for the closest of `names`, or "" when none is close.

    >>> suggest("max_tool_cals", ["max_turns", "max_tool_calls"])
    " (did you mean 'max_tool_calls'?)"
    """
    close = difflib.get_close_matches(key, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def require(ok: bool, key: str, rule: str, value: Any) -> None:
    """A range rule: ValueError `config field 'key' <rule>, got <value>` unless `ok`.

    >>> require(3 >= 1, "tree.beam_size", "must be >= 1", 3)
    """
    if not ok:
        raise ValueError(f"config field {key!r} {rule}, got {value!r}")


def _accepts_text(tp: Any) -> bool:
    """Whether a command-line string is the value as is (a str field), not YAML to parse."""
    if tp is str:
        return True
    if typing.get_origin(tp) is Literal:  # YAML would read the choice `off` as false
        return all(isinstance(a, str) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return bool(args) and all(_accepts_text(a) for a in args)
    return False


def parse_text(tp: Any, text: str) -> Any:
    """A command-line string as a value for a field of type `tp` (None: type unknown).

    String fields take the text as is (`null` aside where None is allowed); lists and tuples
    also accept `1,4`; everything else is parsed as YAML.

    >>> parse_text(tuple[int, ...], "1,4"), parse_text(str, "yes"), parse_text(int | None, "null")
    ((1, 4), 'yes', None)
    """
    if tp is not None and _accepts_text(tp):
        if text == "null" and tp is not str:
            return None
        return text
    origin = typing.get_origin(tp) or tp
    if origin in (tuple, list) and "," in text and not text.lstrip().startswith("["):
        text = f"[{text}]"
    value = _parse_value(text)
    if origin in (tuple, list) and value is not None and not isinstance(value, list):
        value = [value]  # `--seeds 0`: a list of one
    return tuple(value) if origin is tuple and isinstance(value, list) else value


def _parse_value(text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _merge(base: dict, top: Mapping) -> dict:
    """`top` over `base`; mappings merge key by key."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def load_preset(path: str | os.PathLike, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The key: value mapping of a preset with its `inherit:` chain resolved (no `inherit` key left)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} not found")
    here = path.resolve()
    if here in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, here))
        raise ValueError(f"{path}: `inherit` forms a cycle: {cycle}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: a config is a mapping of key: value, got {type(data).__name__}")
    parent = data.pop(INHERIT, None)
    if parent is None:
        return dict(data)
    if not isinstance(parent, str):
        raise ValueError(f"{path}: `inherit` names one file (relative to {path.parent}), got {parent!r}")
    parent_path = path.parent / parent
    if not parent_path.is_file():
        raise FileNotFoundError(f"{path}: inherits {parent!r}, but {parent_path} does not exist")
    return _merge(load_preset(parent_path, (*_chain, here)), data)


def _build(cls: type[T], base: T, data: Mapping[str, Any], where: str, prefix: str = "") -> T:
    """`base` (an instance of `cls`) with the keys of `data` set, nested configs recursively."""
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = {name: getattr(base, name) for name in names}
    for key, value in data.items():
        full = prefix + key
        if key not in names:
            raise ValueError(f"{where}: unknown config key {full!r}{suggest(key, names)}")
        tp = hints[key]
        if _is_config(tp) and isinstance(value, tp):  # the nested config itself, already built
            values[key] = value
        elif _is_config(tp):
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}: {full!r} is a mapping of its keys, got {value!r}")
            values[key] = _build(tp, values[key], value, where, full + ".")
        elif isinstance(value, Mapping) and isinstance(values[key], Mapping):
            values[key] = _merge(values[key], value)
        else:
            try:
                values[key] = coerce(tp, value, full)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
    return cls(**values)


def _override_mapping(cls: type, item: str) -> dict[str, Any]:
    """`a.b.c=v` as {"a": {"b": {"c": v}}}, with the top and config-nested keys checked here."""
    if "=" not in item:
        raise ValueError(f"override {item!r} must look like key=value")
    key, text = item.split("=", 1)
    parts = key.split(".")
    node: dict[str, Any] = {}
    root = node
    for part in parts[:-1]:
        node[part] = {}
        node = node[part]
    # a dotted key must pass through mappings: a scalar field cannot be reached into
    owner: Any = cls
    for i, part in enumerate(parts[:-1]):
        if not _is_config(owner):
            break
        tp = _hints(owner).get(part)
        if tp is None:
            break  # unknown: reported with a suggestion by _build
        if not (_is_config(tp) or tp is dict or typing.get_origin(tp) is dict):
            raise ValueError(f"override {item!r}: {'.'.join(parts[: i + 1])!r} is not a mapping")
        owner = tp
    leaf = _hints(owner).get(parts[-1]) if _is_config(owner) else None
    node[parts[-1]] = parse_text(leaf, text)
    return root


def from_mapping(cls: type[T], data: Mapping[str, Any], where: str, prefix: str = "", base: T | None = None) -> T:
    """`cls` (or `base`) with the keys of `data` set: unknown keys at any level are errors naming
    `where` and the dotted key with the closest valid name; values are type-checked.

    >>> @dataclasses.dataclass
    ... class World:
    ...     difficulty: int = option(1, "how hard")
    >>> from_mapping(World, {"dificulty": 2}, "env_kwargs", "world.")
    Traceback (most recent call last):
    ...
    ValueError: env_kwargs: unknown config key 'world.dificulty' (did you mean 'difficulty'?)
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: {prefix.rstrip('.') or 'the config'} is a mapping of its keys, got {data!r}")
    return _build(cls, cls() if base is None else base, data, where, prefix)


def build_config(
    cls: type[T],
    path: str | os.PathLike | None,
    overrides: Sequence[str] = (),
    *,
    ignore: Sequence[str] = ("algo",),
    base: T | None = None,
    given: Mapping[str, Any] | None = None,
) -> T:
    """Defaults of `cls` (or `base`) ← the preset at `path` (with its `inherit` chain) ← `given`
    (values of `--flags`, already typed) ← `key=value` overrides; then the type checks and
    `validate()`.

    Keys in `ignore` (e.g. `algo`, which the CLI reads itself) may appear at the top of the file.
    """
    cfg = cls() if base is None else base
    if path is not None:
        data = {k: v for k, v in load_preset(path).items() if k not in ignore}
        cfg = _build(cls, cfg, data, str(path))
    if given:
        cfg = _build(cls, cfg, given, "command line")
    for item in overrides:
        mapping = _override_mapping(cls, item)
        key = item.split("=", 1)[0]
        tp = _hints(cls).get(key)
        if isinstance(mapping.get(key), Mapping) and (tp is dict or typing.get_origin(tp) is dict):
            # a whole mapping on the command line replaces the preset's (`env_kwargs={}` clears
            # it); a dotted key (`env_kwargs.world.difficulty=2`) reaches in and merges
            cfg = dataclasses.replace(cfg, **{key: {}})
        cfg = _build(cls, cfg, mapping, f"override {item!r}")
    validate = getattr(cfg, "validate", None)
    if validate is not None:
        validate()
    else:
        check_types(cfg)
    return cfg


def config_dict(cfg: Any) -> dict[str, Any]:
    """The fully resolved config as plain data (for config.json and the start-of-run log)."""
    return dataclasses.asdict(cfg)


def field_help(cls: type, name: str) -> str:
    """The help of field `name`, from `cls` or the first base class that declares it with help
    (a subclass that only changes a default keeps its parent's help)."""
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass):
            for f in dataclasses.fields(klass):
                if f.name == name and f.metadata.get("help"):
                    return f.metadata["help"]
    return ""


def _show(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def describe_config(cls: type, defaults: Any = None, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) of every key of `cls`, nested configs as dotted keys.

    Nested defaults are the owner's (AEPO's `tree` turns its switches on), as a user starts from.
    """
    defaults = cls() if defaults is None else defaults
    rows = []
    for f in dataclasses.fields(cls):
        tp = _hints(cls)[f.name]
        value = getattr(defaults, f.name)
        if _is_config(tp):
            rows += describe_config(tp, value, prefix + f.name + ".")
        else:
            rows.append((prefix + f.name, _type_name(tp), _show(value), field_help(cls, f.name)))
    return rows


def format_help(cls: type) -> str:
    """The `--help` text of a config class: one block per key with its type, default and help."""
    lines = []
    for key, tp, default, help_text in describe_config(cls):
        lines.append(f"  {key} ({tp}, default {default})")
        lines.append(f"      {help_text}")
    return "\n".join(lines)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_flags(parser: Any, cls: type, names: Sequence[str], *, metavars: Mapping[str, str] | None = None) -> None:
    """Add `--name` options for fields `names` of `cls`, with the field's help, type and default.

    They default to None, so `flag_values` can tell what was typed; values are parsed by type
    (`parse_text`) and checked by `build_config(..., given=flag_values(args, names))`.
    """
    hints = _hints(cls)
    defaults = cls() if all(f.default is not _MISSING or f.default_factory is not _MISSING
                            for f in dataclasses.fields(cls)) else None
    for name in names:
        tp = hints[name]
        default = _show(getattr(defaults, name)) if defaults is not None else "required"
        text = f"{field_help(cls, name)} ({_type_name(tp)}, default {default})".replace("%", "%%")
        metavar = (metavars or {}).get(name) or _metavar(tp)
        parser.add_argument(_flag(name), dest=name, default=None, metavar=metavar, help=text)


def _metavar(tp: Any) -> str:
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    origin = typing.get_origin(tp) or tp
    if typing.get_origin(tp) is Literal:
        return "{" + ",".join(str(a) for a in typing.get_args(tp)) + "}"
    if origin in (tuple, list):
        return "A,B"
    if origin is dict:
        return "YAML"
    return _type_name(tp).upper().replace(" ", "")


def flag_values(args: Any, names: Sequence[str], cls: type) -> dict[str, Any]:
    """The `--flags` of `names` that were given, parsed by their field's type."""
    hints = _hints(cls)
    return {n: parse_text(hints[n], getattr(args, n)) for n in names if getattr(args, n, None) is not None}


__all__ = [
    "UserError",
    "add_flags",
    "build_config",
    "check_types",
    "coerce",
    "config_dict",
    "describe_config",
    "field_help",
    "flag_values",
    "format_help",
    "from_mapping",
    "load_preset",
    "option",
    "parse_text",
    "require",
    "suggest",
]
