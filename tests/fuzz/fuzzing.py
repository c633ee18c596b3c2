"""Driving an env with adversarial actions and checking every step's contract.

The contract (docs/envs.md, The contract): whatever the action, `step`
returns a str observation that is valid UTF-8 and inside the observation space, a finite float
reward, booleans `terminated` and `truncated` that are never both true, and an info dict; bad
model output is an observation and a reward, never an exception.
"""

from __future__ import annotations

import math
import random
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import gymnasium as gym

import agent_envs  # noqa: F401  (registers the ids)
from agent_envs.data import BENCHMARKS
from tests.fuzz.adversarial import KINDS, random_action

PROTOCOLS = ("arpo", "json")


def env_ids() -> list[str]:
    """The registered ids of our envs; a remote env (`agent_envs.remote`) plays a served one, which
    is fuzzed here under its own id, so it has no server of its own to fuzz."""
    return sorted(i for i in gym.registry if i.startswith("Agent") and gym.spec(i).entry_point.startswith("agent_envs.")
                  and not gym.spec(i).entry_point.startswith("agent_envs.remote."))


def make_kwargs(env_id: str) -> dict:
    """Offline settings of an id. A benchmark's browse tool fetches the live web, which tests
    cannot reach; it is left out there and fuzzed through AgentSearch-v0's in-memory site."""
    name = gym.spec(env_id).kwargs.get("benchmark")
    if name is not None and BENCHMARKS[name].family == "search":
        return {"browse": False}
    return {}


def missing_data(env_id: str, data_root) -> str | None:
    """Why an id cannot be fuzzed here (its benchmark file is absent), else None."""
    name = gym.spec(env_id).kwargs.get("benchmark")
    if name is None:
        return None
    path = data_root / BENCHMARKS[name].default_file
    return None if path.exists() else f"{env_id}: no data at {path}"


def seed_of(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode())


def check_step(env, out) -> None:
    """Assert the step contract (module docstring) on one `step` result."""
    obs, reward, terminated, truncated, info = out
    assert isinstance(obs, str) and env.observation_space.contains(obs), type(obs)
    obs.encode("utf-8")  # raises on a lone surrogate, which would break a tokenizer
    assert type(reward) is float and math.isfinite(reward), reward
    assert type(terminated) is bool and type(truncated) is bool and not (terminated and truncated)
    assert isinstance(info, dict)
    if terminated or truncated:
        assert obs == "" and info["reward"] == reward and isinstance(info["format_ok"], bool)


# A step slower than this is a failure: an input that makes parsing or grading superlinear
# stalls a whole rollout batch. Generous, for a loaded 2-core machine; the slowest fuzz step
# measured here takes ~1 s (a symbolic-math timeout), the quadratic answer scan it caught minutes.
STEP_LIMIT_S = 30.0


@dataclass
class Tally:
    actions: int = 0
    episodes: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    slowest_s: float = 0.0
    longest_episode: int = 0  # in steps

    def line(self, what: str) -> str:
        return (f"{what}: {self.actions} actions, {self.episodes} episodes (longest {self.longest_episode} steps), "
                f"{len(self.failures)} exceptions, slowest step {self.slowest_s:.2f} s")


def make_env(env_id: str, protocol: str):
    return gym.make(env_id, protocol=protocol, **make_kwargs(env_id)).unwrapped


def drive(env, actions: Iterable[tuple[str, str]], tally: Tally, where: str) -> None:
    """Step `env` through (kind, action) pairs, resetting when an episode ends; every exception,
    broken contract or over-long step is recorded in `tally` with the action that caused it."""
    env.reset(seed=0)
    steps = 0
    for i, (kind, action) in enumerate(actions):
        steps += 1
        tally.actions += 1
        tally.by_kind[kind] = tally.by_kind.get(kind, 0) + 1
        start = time.perf_counter()
        try:
            out = env.step(action)
            check_step(env, out)
            done = out[2] or out[3]
        except Exception as exc:
            tally.failures.append(f"{where} action #{i} ({kind}) {action[:120]!r}: {type(exc).__name__}: {exc}")
            done = True
        took = time.perf_counter() - start
        tally.slowest_s = max(tally.slowest_s, took)
        if took > STEP_LIMIT_S:
            tally.failures.append(f"{where} action #{i} ({kind}) {action[:120]!r}: took {took:.0f} s")
        if done:
            tally.episodes += 1
            tally.longest_episode = max(tally.longest_episode, steps)
            steps = 0
            env.reset(seed=i)


def fuzz_env(env_id: str, protocol: str, n_actions: int, tally: Tally, kinds: Sequence = KINDS) -> None:
    """`n_actions` seeded adversarial actions through one env, episodes running to their end
    (multi-step: non-final actions continue the episode). Kinds cycle so each appears; a kind of
    None is drawn at random."""
    env = make_env(env_id, protocol)
    tools = list(env.tools)
    rng = random.Random(seed_of(env_id, protocol))
    actions = (random_action(rng, tools, protocol, kinds[i % len(kinds)]) for i in range(n_actions))
    drive(env, actions, tally, f"{env_id} {protocol}")
    env.close()
