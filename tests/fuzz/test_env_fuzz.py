"""Fuzzing every registered env id with adversarial actions, on both protocols.

Random, malformed, megabyte-long, nested and unclosed tags, broken JSON tool calls, binary and
Unicode-edge actions (lone surrogates, NUL, bidi overrides, combining marks) must each give a
well-formed observation and a finite reward, never an exception (contract: tests/fuzz/fuzzing.py),
and memory must stay bounded. Tool calls run the real tools (the sandboxed Python worker, BM25
over the shared corpus); the benchmark envs read the real shared data and are skipped, with the
path, where it is absent.

The fast part runs in `make test`; the long runs (thousands of actions, multi-step episodes,
memory over many episodes) are `@pytest.mark.stress` (`make stress`). Counts are printed (-s).
"""

from __future__ import annotations

import gc
import math
import tracemalloc

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_envs.base.task import Task
from agent_envs.core.protocols import make_protocol
from agent_envs.rewards import RECIPES, make_reward
from tests.fuzz.adversarial import KINDS, action_strategy, worst_cases
from tests.fuzz.fuzzing import (
    PROTOCOLS,
    Tally,
    check_step,
    drive,
    env_ids,
    fuzz_env,
    make_env,
    make_kwargs,
    missing_data,
)

FAST_ACTIONS = 9  # per id and protocol: one of each kind
STRESS_ACTIONS = 1000


# the two big math sets take ~8 s each to load and check (busy 2-core machine): `make test` only
SLOW_IDS = ("AgentMath-GSM8K-v0", "AgentMath-MATH500-v0")


@pytest.fixture(params=[pytest.param(i, marks=pytest.mark.slow) if i in SLOW_IDS else i for i in env_ids()])
def env_id(request, shared_data) -> str:
    why = missing_data(request.param, shared_data)
    if why:
        pytest.skip(why)
    return request.param


def test_every_env_survives_every_kind_of_bad_action(env_id: str) -> None:
    tally = Tally()
    for protocol in PROTOCOLS:
        fuzz_env(env_id, protocol, FAST_ACTIONS, tally)
    print(tally.line(f"fuzz {env_id} (arpo+json)"))
    assert set(tally.by_kind) == set(KINDS)
    assert not tally.failures, "\n".join(tally.failures)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("env_id", ["AgentMath-v0", "AgentQA-v0", "AgentSearch-v0", "AgentQA-ARPO-RL-v0"])
def test_worst_cases_found_by_fuzzing(env_id: str, protocol: str, shared_data) -> None:
    """Each action that once crashed or stalled a step, kept as a fixed case: each family's
    parser and grader, and the ARPO recipe with both tools."""
    env = make_env(env_id, protocol)
    tally = Tally()
    drive(env, worst_cases(list(env.tools)), tally, f"{env_id} {protocol}")
    print(tally.line(f"worst cases {env_id} {protocol}"))
    assert not tally.failures, "\n".join(tally.failures)


# -- hypothesis: the same contract, with shrinking to a minimal failing action ------------------

_FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("env_id", ["AgentQA-v0", "AgentSearch-v0"])
def test_hypothesis_actions_through_env(env_id: str, protocol: str) -> None:
    env = gym.make(env_id, protocol=protocol).unwrapped
    count = 0

    @_FAST
    @given(st.lists(action_strategy(list(env.tools), protocol), min_size=1, max_size=3))
    def episode(actions: list[str]) -> None:
        nonlocal count
        env.reset(seed=len(actions))
        for action in actions:
            out = env.step(action)
            count += 1
            check_step(env, out)
            if out[2] or out[3]:
                break

    episode()
    print(f"hypothesis {env_id} {protocol}: {count} actions, 0 exceptions")


QA = Task("q", "Who founded Alpha?", ["Ada Lovelace"], reward="qa")
EXACT = Task("e", "Code?", ["X1"], reward="exact")
JUDGE = Task("j", "Capital?", ["Paris"], reward="judge")  # no judge configured: exact match, said so
WEB_TOOLS = list(gym.make("AgentSearch-v0").unwrapped.tools.values())  # search + browse of the synthetic web


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(action_strategy(["search", "python", "browse"], "arpo"), st.sampled_from(PROTOCOLS))
def test_hypothesis_parse_format_and_every_recipe(response: str, protocol: str) -> None:
    """The text path without running tools: parse, format check and every recipe on non-math
    tasks (the math grader is covered through the math envs above)."""
    p = make_protocol(protocol)
    parsed = p.parse(response.encode("utf-8", "replace").decode("utf-8"), WEB_TOOLS)
    assert parsed.kind in ("tool", "invalid", "answer", "end") and isinstance(parsed.text, str)
    ok, why = p.check_format(response)
    assert isinstance(ok, bool) and (ok or isinstance(why, str))
    for recipe in RECIPES:
        for task in (QA, EXACT, JUDGE):
            r = make_reward(recipe)(task, response, ok, {"search": 1})
            assert math.isfinite(r.score) and -1.0 <= r.score <= 1.1, (recipe, task.reward, r)


# -- memory -------------------------------------------------------------------------------------

def _traced_growth(env_id: str, protocol: str, n: int, kinds=KINDS) -> tuple[int, int]:
    """(bytes allocated and still alive after n fuzz actions, after 2n): a leak grows with the
    number of actions, a cache filled once does not."""
    tally = Tally()
    fuzz_env(env_id, protocol, 20, tally, kinds)  # warm-up: tools, indexes and caches built once
    gc.collect()
    tracemalloc.start()
    try:
        fuzz_env(env_id, protocol, n, tally, kinds)
        gc.collect()
        first = tracemalloc.get_traced_memory()[0]
        fuzz_env(env_id, protocol, n, tally, kinds)
        gc.collect()
        second = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert not tally.failures, "\n".join(tally.failures)
    return first, second


def test_memory_stays_bounded_over_many_actions() -> None:
    # megabyte actions are left to the stress run: each costs ~0.2 s to build and parse
    first, second = _traced_growth("AgentQA-v0", "arpo", 200, [k for k in KINDS if k != "huge"])
    print(f"memory AgentQA-v0: {first / 1e6:.2f} MB retained after 200 actions, {second / 1e6:.2f} MB after 400")
    assert second - first < 2_000_000


# -- stress -------------------------------------------------------------------------------------

# Stress episodes lean on actions that keep an episode going (tool calls, JSON calls), so most
# episodes run several steps and reach the call limits; None draws any kind.
STRESS_KINDS = ("tool_call", "json", "tool_call", "tool_call", None)


@pytest.fixture(scope="module")
def stress_total():
    total = Tally()
    yield total
    if total.actions:
        print(total.line("stress, all envs"))


@pytest.mark.stress
def test_stress_every_env_thousands_of_actions(env_id: str, stress_total: Tally) -> None:
    for protocol in PROTOCOLS:
        tally = Tally()
        fuzz_env(env_id, protocol, STRESS_ACTIONS, tally, kinds=STRESS_KINDS)
        print(tally.line(f"stress {env_id} {protocol}"), flush=True)
        stress_total.actions += tally.actions
        stress_total.episodes += tally.episodes
        stress_total.failures += tally.failures
        stress_total.slowest_s = max(stress_total.slowest_s, tally.slowest_s)
        stress_total.longest_episode = max(stress_total.longest_episode, tally.longest_episode)
        assert tally.longest_episode >= 4, "the stress kinds should make episodes of several steps"
        assert not tally.failures, "\n".join(tally.failures)


@pytest.mark.stress
@pytest.mark.parametrize("env_id", ["AgentMath-v0", "AgentQA-v0", "AgentSearch-v0"])
def test_stress_memory_with_megabyte_actions(env_id: str) -> None:
    first, second = _traced_growth(env_id, "json", 400)
    print(f"memory {env_id}: {first / 1e6:.2f} MB retained after 400 actions, {second / 1e6:.2f} MB after 800")
    assert second - first < 4_000_000


def test_make_kwargs_leave_out_only_the_web_browse() -> None:
    assert make_kwargs("AgentSearch-GAIA-v0") == {"browse": False}
    assert make_kwargs("AgentSearch-v0") == {} and make_kwargs("AgentQA-HotpotQA-v0") == {}
