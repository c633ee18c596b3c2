"""Registered env ids: four families with an offline default each, plus one id per benchmark.

    >>> import gymnasium as gym, agent_envs
    >>> env = gym.make("AgentQA-v0")
    >>> gym.spec("AgentQA-HotpotQA-v0").kwargs     # = AgentQA-v0 with benchmark="hotpotqa"
    {'benchmark': 'hotpotqa'}
"""

from __future__ import annotations

import importlib

import gymnasium as gym

# each env family's own procedural id: (id, factory, summary for `agent-envs list`)
FAMILY_ENVS = {
    "math": ("AgentMath-v0", "agent_envs.envs.math:make_math_env",
             "procedural arithmetic world; python sandbox; math-equivalence reward"),
    "qa": ("AgentQA-v0", "agent_envs.envs.qa:make_qa_env",
           "synthetic knowledge base, 1-4 hop questions; BM25 search; F1 reward"),
    "search": ("AgentSearch-v0", "agent_envs.envs.search:make_search_env",
               "synthetic linked web; search + browse; F1 reward"),
    "notebook": ("AgentNotebook-v0", "agent_envs.envs.notebook:make_notebook_env",
                 "multi-call python tasks that reuse earlier names; python session; math reward"),
}
# any id served by `agent-envs serve-env`, played over HTTP (no family: it has no world of its own)
REMOTE = ("AgentRemote-v0", "agent_envs.remote.env_client:RemoteEnv", "an env served by `agent-envs serve-env`, played over HTTP (url=, env_id=, env_kwargs=)")


# The ARPO training sets default to the public ARPO setting: both tools and ARPO's reward recipe.
BENCHMARK_DEFAULTS = {
    "arpo_rl": {"python": {}, "reward": "arpo", "max_tool_calls": 3},
    "arpo_hard_search": {"reward": "arpo"},
}


def _benchmarks() -> dict:
    from agent_envs.data import BENCHMARKS

    return BENCHMARKS


def register_envs() -> None:
    """Register every id once; safe to call again.

    The env checks its own call order (step before reset raises), so Gymnasium's OrderEnforcing
    wrapper, which costs a few microseconds per step, is left out.
    """
    for env_id, entry_point, _ in (*FAMILY_ENVS.values(), REMOTE):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True, order_enforce=False)
    for name, spec in _benchmarks().items():
        if spec.env_id not in gym.registry:
            gym.register(
                id=spec.env_id,
                entry_point=FAMILY_ENVS[spec.family][1],
                kwargs={"benchmark": name, **BENCHMARK_DEFAULTS.get(name, {})},
                disable_env_checker=True,
                order_enforce=False,
            )


def register_benchmark(spec, **env_defaults) -> str:
    """Add a benchmark of your own: `load_benchmark(spec.name)` finds it and `spec.env_id` is a
    registered id of its family. `env_defaults` become that id's default `gym.make` kwargs (e.g.
    `corpus=` for QA). Returns the env id.

        >>> from agent_envs.data import BenchmarkSpec
        >>> register_benchmark(BenchmarkSpec(name="mine", family="math", reward="math",
        ...     env_id="AgentMath-Mine-v0", default_file="/data/mine.jsonl", description="my set",
        ...     metric="accuracy"))
        'AgentMath-Mine-v0'
    """
    benchmarks = _benchmarks()
    if spec.name in benchmarks and benchmarks[spec.name] != spec:
        raise ValueError(f"a different benchmark named {spec.name!r} is already registered; pick another name")
    if spec.env_id in gym.registry and spec.name not in benchmarks:
        raise ValueError(f"env id {spec.env_id!r} is already registered; pick another env_id")
    benchmarks[spec.name] = spec
    BENCHMARK_DEFAULTS[spec.name] = dict(env_defaults)
    gym.register(id=spec.env_id, entry_point=FAMILY_ENVS[spec.family][1],
                 kwargs={"benchmark": spec.name, **env_defaults}, disable_env_checker=True, order_enforce=False)
    return spec.env_id


# Other packages' env ids: a distribution names a module (or a function that registers them) in
# this entry-point group, and every command finds its ids (docs/adding-a-benchmark.md)
ENTRY_POINT_GROUP = "agent_envs.envs"
# modules to import for their ids, comma-separated: `--import` sets it, so the processes a command
# starts (compare's workers, accelerate's ranks) import them too
IMPORT_ENV = "AGENT_ENVS_IMPORT"
_ADDED: dict[str, str] = {}  # env id -> where it came from, for `agent-envs list`
_plugins_loaded = False


def import_envs(module: str, origin: str) -> list[str]:
    """Import `module` for the env ids it registers (`--import MODULE`, a `module:Id` id); returns
    them. `origin` names what asked for it in the error."""
    from agent_envs.base.config import UserError

    register_envs()
    before = set(gym.registry)
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise UserError(f"{origin}: cannot import module {module!r} ({exc}); install the package that "
                        "provides it, or fix the name") from exc
    added = [env_id for env_id in gym.registry if env_id not in before]
    for env_id in added:
        _ADDED.setdefault(env_id, f"registered by {module}")
    return added


def load_plugins() -> None:
    """Load the `agent_envs.envs` entry points of the installed distributions, once: each names a
    module whose import registers env ids, or a function that does. A broken one is reported in
    one line on stderr and skipped, so it cannot take the package's own ids down with it. Then
    the modules named in `$AGENT_ENVS_IMPORT` (comma-separated) are imported."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    import inspect
    import os
    import sys
    from importlib.metadata import entry_points

    register_envs()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        origin = f"{ep.value} ({ep.dist.name if ep.dist else 'an installed package'})"
        before = set(gym.registry)
        try:
            loaded = ep.load()
            if callable(loaded) and not inspect.ismodule(loaded):
                loaded()
        except Exception as exc:  # someone else's code: any failure is theirs to fix
            print(f"agent-envs: skipped the envs of entry point {ep.name!r} = {origin}: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        for env_id in gym.registry:
            if env_id not in before:
                _ADDED.setdefault(env_id, f"registered by {origin}")
    for module in filter(None, (m.strip() for m in os.environ.get(IMPORT_ENV, "").split(","))):
        import_envs(module, f"${IMPORT_ENV} {module}")


def check_env_id(env_id: str, key: str = "env") -> str:
    """The registry id of `env_id` (`module:Id` imports `module` first, as `gymnasium.make`
    does; installed packages' ids are loaded); a UserError naming the closest registered id
    unless it is one."""
    from agent_envs.base.config import UserError, suggest

    load_plugins()
    module, _, name = env_id.rpartition(":")
    if module:
        import_envs(module, f"config field {key!r}: {env_id!r}")
    if name not in gym.registry:
        hint = suggest(name, list(gym.registry)) or (
            "; `agent-envs list` shows them (an id of your own package: MODULE:ID or --import MODULE)")
        where = f" (importing {module} registered no such id)" if module else ""
        raise UserError(f"config field {key!r}: {name!r} is not a registered env id{where}{hint}")
    return name


def family_configs() -> dict[str, type]:
    """The settings class of each family (`MathEnvConfig`, ...): what `gym.make` of its ids takes."""
    from agent_envs.envs.math import MathEnvConfig
    from agent_envs.envs.notebook import NotebookEnvConfig
    from agent_envs.envs.qa import QAEnvConfig
    from agent_envs.envs.search import SearchEnvConfig

    return {"math": MathEnvConfig, "qa": QAEnvConfig, "search": SearchEnvConfig, "notebook": NotebookEnvConfig}


def env_config_class(env_id: str) -> type | None:
    """The settings class of a registered id of this package's families; None for any other id
    (another package's, `AgentRemote-v0`): its constructor is not ours to read."""
    entry = gym.spec(env_id).entry_point
    family = next((f for f, (_, factory, _) in FAMILY_ENVS.items() if factory == entry), None)
    return None if family is None else family_configs()[family]


def env_settings_help() -> str:
    """Every setting of the family envs with its type, default and help (`play`, `evaluate` and
    `train` `--help`): the ones all envs share, then each family's own and its world's keys."""
    from agent_envs.base.config import describe_config
    from agent_envs.core.env_config import ToolEnvConfig

    common = describe_config(ToolEnvConfig)
    lines = ["  every env:"] + [f"    {key} ({tp}, default {default}): {text}" for key, tp, default, text in common]
    for family, config in family_configs().items():
        lines.append(f"  {FAMILY_ENVS[family][0]} (a benchmark's id takes its family's):")
        lines += [f"    {key} ({tp}, default {default}): {text}" for key, tp, default, text in describe_config(config)
                  if (key, tp, default) not in {row[:3] for row in common}]
    return "\n".join(lines)


def env_summaries() -> list[tuple[str, str]]:
    """(id, one-line description) for every id this package registers, then the ids of installed
    packages' entry points and `--import`ed modules."""
    load_plugins()
    rows = [(env_id, summary) for env_id, _, summary in (*FAMILY_ENVS.values(), REMOTE)]
    for name, spec in _benchmarks().items():
        rows.append((spec.env_id, f"{FAMILY_ENVS[spec.family][0]} with benchmark={name!r}: {spec.description}"))
    listed = {env_id for env_id, _ in rows}
    rows += [(env_id, origin) for env_id, origin in _ADDED.items() if env_id not in listed]
    return rows
