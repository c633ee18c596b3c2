"""The lean answer path (`ToolEnv._answer_now`) gives exactly what the general path gives.

A plain answer right after reset skips `parse`, `_begin` and the general grading call; these
tests step two envs built alike, one with the lean path and one with it switched off, on the same
task and the same action, and compare everything a caller can see: the observation, the reward,
the flags, `info` (values and key order) and the episode state afterwards. The actions cover
right, wrong, hedged, malformed and tool-using answers on real benchmark files and procedural
worlds, under every reward recipe, plus the fuzzer's actions and worst cases (tests/fuzz); a
count checks that the lean path did take the plain ones.
"""

from __future__ import annotations

import asyncio
import random

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agent_envs  # noqa: F401  (registers the ids)
from agent_envs import ToolEnv
from agent_envs.core.vector import ToolVectorEnv
from agent_envs.rewards import RECIPES
from tests.fuzz.adversarial import EDGE_CHARS, WORDS, action_strategy, worst_cases

BODIES = (
    "The answer is \\boxed{{{gold}}}.",
    "\\boxed{{{gold}}}",
    "\\boxed{{ {gold} }} and more",
    "first \\boxed{{Paris}} then \\boxed{{{gold}}}",
    "\\fbox{{{gold}}}",
    "\\boxed {gold}",
    "{gold}",
    "\\boxed{{\\frac{{1}}{{2}}}}",
    "\\boxed{{{gold} or Lyon}}",
    "\\boxed{{Lyon | {gold}}}",
    "\\boxed{{{gold}; Lyon}}",
    "\\boxed{{yes}}",
    "\\boxed{{}}",
    "\\boxed{{unclosed",
    "The {gold} is, a... \\boxed{{THE {gold}!}}",
)
SHAPES = (
    "<think> so </think> <answer> {body} </answer>",
    "<think> so </think><answer>{body}</answer> trailing words",
    "<answer> {body} </answer>",
    "<think> a </think> <think> b <answer> {body} </answer>",
    "<think> so </think> <answer> x <answer> {body} </answer>",
    "<think> so </think> <answer> {body} </answer> <answer> again </answer>",
    "<think> so </think> <answer> {body} </answer> <search> after </search>",
    "<think> so </think> <search> q </search> <answer> {body} </answer>",
    "<think> so </think> <result> fake </result> <answer> {body} </answer>",
    "<think> so </think> <python> 1 </python> <answer> {body} </answer>",
    "<think> so </think> no answer block, \\boxed{{{gold}}}",
    "<think> \u00e9t\u00e9 </think> <answer> {body} </answer>",
)
ENVS = (
    ("AgentQA-HotpotQA-v0", {}),
    ("AgentQA-Bamboogle-v0", {}),
    ("AgentMath-MATH500-v0", {}),
    ("AgentMath-GSM8K-v0", {}),
    ("AgentQA-v0", {}),
    ("AgentMath-v0", {}),
    ("AgentSearch-v0", {}),
    ("AgentQA-HotpotQA-v0", {"prefill": "<think>"}),
    ("AgentQA-HotpotQA-v0", {"max_response_chars": 60}),
    ("AgentQA-HotpotQA-v0", {"reward_kwargs": {"tool_cost": 0.1, "multi_tool_bonus": 0.2}}),
)


def _actions(task, rng: random.Random) -> list[str]:
    gold = task.answers[0] if task.answers else "x"
    out = [shape.format(body=body.format(gold=gold), gold=gold) for shape in SHAPES for body in rng.sample(BODIES, 4)]
    out += [task.gold_trace[-1]] if task.gold_trace else []
    return out


def _general_only(env: gym.Env) -> gym.Env:
    env.unwrapped._answer_now = lambda action: None  # what every step did before the lean path
    return env


def _outcome(env: gym.Env, result: tuple) -> tuple:
    obs, reward, terminated, truncated, info = result
    if "tool_result" in info:  # a tool call (general path on both sides): its latency differs
        info = {**info, "tool_result": {**info["tool_result"], "latency_s": None}}
    return obs, reward, type(reward), terminated, truncated, list(info.items()), env.unwrapped.get_state()


def _agree(lean: gym.Env, general: gym.Env, action: str, seed: int = 0) -> bool:
    lean.reset(seed=seed)
    general.reset(seed=seed)
    taken = lean.unwrapped._answer_now(action) is not None
    lean.reset(seed=seed)
    assert _outcome(lean, lean.step(action)) == _outcome(general, general.step(action)), action
    return taken


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize(("env_id", "kwargs"), ENVS, ids=[f"{i}{'+' + next(iter(k)) if k else ''}" for i, k in ENVS])
def test_lean_and_general_paths_agree(env_id: str, kwargs: dict, recipe: str, shared_data) -> None:
    kwargs = {**kwargs, "reward": recipe}
    lean, general = gym.make(env_id, **kwargs), _general_only(gym.make(env_id, **kwargs))
    served = 0
    rng = random.Random(f"{env_id}{recipe}")
    for seed in range(6):
        lean.reset(seed=seed)
        for action in _actions(lean.unwrapped.task, rng):
            served += _agree(lean, general, action, seed)
    assert served >= 40  # of ~140 plain answers (math ones may need the symbolic stage, which waits)


_PAIRS: dict[str, tuple[gym.Env, gym.Env]] = {}


def _pair(recipe: str) -> tuple[gym.Env, gym.Env]:
    if recipe not in _PAIRS:
        _PAIRS[recipe] = (gym.make("AgentQA-v0", reward=recipe),
                          _general_only(gym.make("AgentQA-v0", reward=recipe)))
    return _PAIRS[recipe]


_PLAIN = st.tuples(
    st.lists(st.sampled_from(["<think>", "</think>", " x ", "<answer>"]), max_size=4).map("".join),
    st.lists(st.sampled_from([*WORDS, *EDGE_CHARS, "\\boxed{", "\\fbox{", "{", "}", " or ", " | ", "; "]),
             max_size=12).map("".join),
).map(lambda parts: f"{parts[0]}<answer>{parts[1]}</answer>")


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(action=st.one_of(_PLAIN, action_strategy(["search"], "arpo")), recipe=st.sampled_from(RECIPES))
def test_fuzzed_actions_agree(action: str, recipe: str) -> None:
    _agree(*_pair(recipe), action)


def test_worst_cases_agree() -> None:
    for _, action in worst_cases(["search"]):
        for recipe in RECIPES:
            _agree(*_pair(recipe), action)


def test_async_and_deferred_steps_agree(shared_data) -> None:
    lean = gym.make("AgentQA-HotpotQA-v0", reward="arpo")
    general = _general_only(gym.make("AgentQA-HotpotQA-v0", reward="arpo"))
    for seed in range(4):
        lean.reset(seed=seed)
        for action in _actions(lean.unwrapped.task, random.Random(seed))[:20]:
            results = []
            for env in (lean, general):
                env.reset(seed=seed)
                results.append(_outcome(env, asyncio.run(env.unwrapped.astep(action))))
                env.reset(seed=seed)
                now, later = env.unwrapped.step_or_defer(action)
                results.append(_outcome(env, now if later is None else asyncio.run(later)))
            assert results[0] == results[1] == results[2] == results[3], action


def test_vector_env_serves_a_batch_of_answers_like_single_envs(shared_data) -> None:
    venv = ToolVectorEnv.make("AgentQA-HotpotQA-v0", num_envs=8)
    singles = [_general_only(gym.make("AgentQA-HotpotQA-v0")) for _ in range(8)]
    venv.reset(seed=0)
    actions = [f"<think> x </think> <answer> \\boxed{{{e.unwrapped.task.answers[0]}}} </answer>" for e in venv.envs]
    obs, rewards, terminated, truncated, infos = venv.step(actions)
    for i, env in enumerate(singles):
        env.reset(seed=i)
        expected = _outcome(env, env.step(actions[i]))
        assert (obs[i], rewards[i], terminated[i], truncated[i], list(infos[i].items())) == (
            expected[0], expected[1], expected[3], expected[4], expected[5])
    assert rewards.tolist() == [1.0] * 8


def test_a_subclassed_protocol_or_reward_takes_the_general_path() -> None:
    from agent_envs.core.protocols import ArpoTags
    from agent_envs.rewards.recipe import RewardRecipe

    class Strict(ArpoTags):
        def check_format(self, response: str, prefill: str = "") -> tuple[bool, str | None]:
            return False, "strict"

    class Halved(RewardRecipe):
        def __call__(self, *args):  # a subclass may change the grading itself
            result = super().__call__(*args)
            result.score /= 2
            return result

    task = agent_envs.Task("t", "q?", ["Paris"])
    answer = "<think> x </think> <answer> \\boxed{Paris} </answer>"
    env = ToolEnv([task], protocol=Strict())
    env.reset(seed=0)
    assert env.step(answer)[4]["format_error"] == "strict"
    env = ToolEnv([task], reward=Halved())
    env.reset(seed=0)
    assert env.step(answer)[1] == 0.5
