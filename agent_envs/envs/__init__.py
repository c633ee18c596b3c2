"""Registered env ids: three families with an offline default each, plus one id per benchmark.

    >>> import gymnasium as gym, agent_envs
    >>> env = gym.make("AgentQA-v0")
    >>> gym.spec("AgentQA-HotpotQA-v0").kwargs     # = AgentQA-v0 with benchmark="hotpotqa"
    {'benchmark': 'hotpotqa'}
"""

from __future__ import annotations

import gymnasium as gym

FAMILIES = {
    "math": ("AgentMath-v0", "agent_envs.envs.math:make_math_env",
             "procedural arithmetic world; python sandbox; math-equivalence reward"),
    "qa": ("AgentQA-v0", "agent_envs.envs.qa:make_qa_env",
           "synthetic knowledge base, 1-4 hop questions; BM25 search; F1 reward"),
    "search": ("AgentSearch-v0", "agent_envs.envs.search:make_search_env",
               "synthetic linked web; search + browse; F1 reward"),
}


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
    for env_id, entry_point, _ in FAMILIES.values():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=True, order_enforce=False)
    for name, spec in _benchmarks().items():
        if spec.env_id not in gym.registry:
            gym.register(
                id=spec.env_id,
                entry_point=FAMILIES[spec.family][1],
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
    gym.register(id=spec.env_id, entry_point=FAMILIES[spec.family][1],
                 kwargs={"benchmark": spec.name, **env_defaults}, disable_env_checker=True, order_enforce=False)
    return spec.env_id


def env_summaries() -> list[tuple[str, str]]:
    """(id, one-line description) for every id this package registers."""
    rows = [(env_id, summary) for env_id, _, summary in FAMILIES.values()]
    for name, spec in _benchmarks().items():
        rows.append((spec.env_id, f"{FAMILIES[spec.family][0]} with benchmark={name!r}: {spec.description}"))
    return rows
