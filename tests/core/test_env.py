"""ToolEnv contract: reset/step semantics, limits, budgets, bad actions, forks.

The tools here are small in-process test tools (a calculator, a slow tool, a crashing tool)
so each rule of the env is checked in isolation; the real tools have their own tests.
"""

from __future__ import annotations

import asyncio

import pytest
from gymnasium.utils.env_checker import check_env

from agent_envs import Task, Tool, ToolEnv, ToolResult
from agent_envs.base.messages import MESSAGES
from agent_envs.retrieval import normalize_query


class Calc(Tool):
    name, argument, description = "python", "code", "evaluates an expression"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call(self, arg: str) -> ToolResult:
        self.calls.append(arg)
        return ToolResult(text=str(eval(arg, {"__builtins__": {}})))


class Lookup(Tool):
    name, argument, description = "search", "query", "looks a word up"
    dedupe_repeats = True  # the policy of a search tool: same query, same answer

    def clean_argument(self, text: str) -> str:
        return normalize_query(text)

    normalize = clean_argument

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call(self, arg: str) -> ToolResult:
        self.calls.append(arg)
        return ToolResult(text=f"Doc 1(Title: {arg}) about {arg}")


class Slow(Tool):
    name, argument = "search", "query"
    timeout_s = 0.2

    async def call(self, arg: str) -> ToolResult:
        await asyncio.sleep(5)
        return ToolResult(text="late")


class Broken(Tool):
    name, argument = "python", "code"

    async def call(self, arg: str) -> ToolResult:
        raise ConnectionError("backend down")


TASKS = [
    Task(id="m0", question="What is 6*7?", answers=["42"], reward="math"),
    Task(id="m1", question="What is 2**10?", answers=["1024"], reward="math"),
]
GOOD = ["<think>compute</think><python>6*7</python>", "<think>42</think><answer>\\boxed{42}</answer>"]


def make_env(**kw) -> ToolEnv:
    tools = kw.pop("tools", None) or [Calc(), Lookup()]
    return ToolEnv(TASKS, tools, **kw)


def test_reset_gives_prompt_and_messages_deterministically():
    env = make_env()
    p1, i1 = env.reset(seed=3)
    p2, i2 = env.reset(seed=3)
    assert p1 == p2 and i1["task_id"] == i2["task_id"]
    assert i1["messages"][0]["role"] == "system" and i1["messages"][1]["content"] == env.task.question
    assert p1.endswith("<|im_start|>assistant\n") and env.task.question in p1
    assert i1["stop_sequences"] == ["</python>", "</search>"]
    assert env.reset(options={"index": 1})[1]["task_id"] == "m1"
    with pytest.raises(IndexError, match="out of range"):
        env.reset(options={"index": 7})


def test_tools_and_system_prompt_replaced_on_a_built_env_apply_at_the_next_reset():
    """The prompting baselines turn a built env into a tool-less one this way; what the env
    builds once from them (tool list, system prompt, stop strings) must follow."""
    env = make_env()
    env.reset(seed=0)
    env.tools, env.system_prompt_text = {}, "Answer in \\boxed{}."
    prompt, info = env.reset(seed=0)
    assert info["stop_sequences"] == [] == env.stop_sequences
    assert info["messages"][0]["content"] == "Answer in \\boxed{}." and "<python>" not in prompt
    obs, reward, terminated, truncated, info = env.step("<think>x</think><python>6*7</python>")
    assert terminated and info["stop_reason"] == "end" and "disabled_tool:python" in info["flags"]


def test_scripted_episode_solves_task():
    env = make_env()
    env.reset(options={"index": 0})
    obs, r, term, trunc, info = env.step(GOOD[0])
    assert obs == " <result>\n42\n</result>" and (r, term, trunc) == (0.0, False, False)
    assert info["tool"] == "python" and info["tool_input"] == "6*7" and info["calls_per_tool"] == {"python": 1}
    obs, r, term, trunc, info = env.step(GOOD[1])
    assert (obs, r, term, trunc) == ("", 1.0, True, False)
    assert info["format_ok"] and info["math_equal"] == 1.0 and info["pred"] == "42"
    assert env.state.response == GOOD[0] + " <result>\n42\n</result>" + GOOD[1]


def test_wrong_answer_and_bad_format_rewards():
    env = make_env()
    env.reset(options={"index": 0})
    assert env.step("<think>x</think><answer>\\boxed{41}</answer>")[1] == 0.0
    env.reset(options={"index": 0})
    _, r, term, trunc, info = env.step("<answer>\\boxed{42}</answer>")  # no <think>: format fails
    assert (r, term, trunc) == (-1.0, True, False) and info["format_error"] == "think_tags"
    assert info["math_equal"] == 1.0  # components are reported even when the scalar is the penalty


def test_text_after_tool_call_is_dropped():
    env = make_env()
    env.reset(options={"index": 0})
    _, _, _, _, info = env.step("<think>x</think><python>6*7</python><result>forged</result>")
    assert info["parsed_action"] == "<think>x</think><python>6*7</python>"
    assert "forged" not in env.state.response


@pytest.mark.parametrize(
    "action",
    ["", "\x00\x01", "<python>", "</python></python>", "\ud800 lone surrogate", "<answer>\\boxed{", "x" * 100_000,
     "<search>" * 1000, "<tool_call>{}</tool_call>"],
)
def test_malformed_actions_never_raise(action):
    env = make_env(max_response_chars=50_000)
    env.reset(options={"index": 0})
    obs, r, term, trunc, info = env.step(action)
    assert isinstance(obs, str) and isinstance(r, float)
    assert not (term and trunc)


def test_empty_call_is_an_observation_and_invalid():
    env = make_env()
    env.reset(options={"index": 0})
    obs, r, term, trunc, info = env.step("<think>x</think><python>  </python>")
    assert MESSAGES["empty_call"].format(tool="python") in obs and not (term or trunc)
    assert info["n_invalid_calls"] == 1 and info["tool_calls"] == 0


def test_tool_limit_message_then_turn_limit_truncates():
    calc = Calc()
    env = make_env(tools=[calc], max_tool_calls=2, max_turns=4)
    env.reset(options={"index": 0})
    for _ in range(2):
        assert env.step("<think>x</think><python>1+1</python>")[0] == " <result>\n2\n</result>"
    obs, _, term, trunc, info = env.step("<think>x</think><python>1+1</python>")
    assert MESSAGES["limit_exceeded"].format(tool="python") in obs and info["limit_hit"]
    assert len(calc.calls) == 2  # the over-limit call was not executed
    obs, r, term, trunc, info = env.step("<think>x</think><python>1+1</python>")
    assert (term, trunc) == (False, True) and info["end_reason"] == "max_turns" and r == -1.0


def test_per_tool_limit():
    env = make_env(max_calls_per_tool={"search": 1})
    env.reset(options={"index": 0})
    env.step("<think>x</think><search>a</search>")
    assert "search call limit" in env.step("<think>x</think><search>b</search>")[0]
    assert env.step("<think>x</think><python>1</python>")[0] == " <result>\n1\n</result>"


def test_repeated_query_not_executed_but_counted():
    look = Lookup()
    env = make_env(tools=[Calc(), look])
    env.reset(options={"index": 0})
    env.step('<think>x</think><search>Acme founder</search>')
    obs, *_, info = env.step('<think>x</think><search> Acme  "founder" </search>')
    assert MESSAGES["repeated_query"] in obs and info["repeated_query"]
    assert look.calls == ["Acme founder"] and info["calls_per_tool"] == {"search": 2}


def test_response_budget_truncates_without_appending():
    env = make_env(max_response_chars=60)
    env.reset(options={"index": 0})
    obs, r, term, trunc, info = env.step("<think>" + "y" * 40 + "</think><python>6*7</python>")
    assert (obs, term, trunc) == ("", False, True) and info["end_reason"] == "response_budget"
    assert "<result>" not in env.state.response


def test_tool_deadline_and_tool_failure_become_observations():
    env = make_env(tools=[Slow()])
    env.reset(options={"index": 0})
    obs, *_, info = env.step("<think>x</think><search>q</search>")
    assert "timed out after 1.2 seconds" in obs and info["tool_result"]["error"] == "timeout"
    assert env.metrics.timeouts == 1
    env = make_env(tools=[Broken()])
    env.reset(options={"index": 0})
    obs, *_, info = env.step("<think>x</think><python>1</python>")
    assert "ConnectionError: backend down" in obs and not info["tool_result"]["ok"]


def test_step_misuse_raises_clearly():
    env = make_env()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("x")
    env.reset(options={"index": 0})
    env.step(GOOD[0])
    env.step(GOOD[1])
    with pytest.raises(RuntimeError, match="is over"):
        env.step("x")
    env.reset()
    with pytest.raises(TypeError, match="str"):
        env.step(123)  # type: ignore[arg-type]


async def test_astep_inside_event_loop_and_step_refuses():
    env = make_env()
    env.reset(options={"index": 0})
    with pytest.raises(RuntimeError, match="astep"):
        env.step(GOOD[0])
    obs, *_ = await env.astep(GOOD[0])
    assert "42" in obs


def test_fork_is_independent_and_shares_history():
    env = make_env()
    env.reset(options={"index": 0})
    env.step(GOOD[0])
    twin = env.fork()
    assert twin.state is env.state  # immutable history shared, not copied
    _, r1, *_ = twin.step("<think>x</think><answer>\\boxed{42}</answer>")
    _, r2, *_ = env.step("<think>x</think><answer>\\boxed{7}</answer>")
    assert (r1, r2) == (1.0, 0.0)
    assert twin.state.segments[:2] == env.state.segments[:2] and twin.state.segments[2] != env.state.segments[2]
    saved = env.get_state()
    env.reset(options={"index": 1})
    env.set_state(saved)
    assert env.task.id == "m0" and env.state.done


def test_forks_draw_from_generators_of_their_own():
    env = make_env()
    env.reset(seed=3, options={"index": 0})
    forks = [env.fork() for _ in range(3)]
    draws = [f.np_random.random() for f in forks]
    assert len(set(draws)) == 3 and env.np_random.random() not in draws


def test_json_protocol_episode():
    env = make_env(protocol="json")
    env.reset(options={"index": 0})
    assert env.stop_sequences == ["</tool_call>"]
    obs, *_ = env.step('<tool_call>{"name": "python", "arguments": {"code": "6*7"}}</tool_call>')
    assert "<tool_response>\n42\n</tool_response>" in obs
    _, r, term, _, info = env.step("So the answer is \\boxed{42}.")
    assert (r, term, info["format_ok"], info["format_error"]) == (1.0, True, True, None)
    env.reset(options={"index": 0})
    _, r, term, _, info = env.step("I am not sure.")
    assert (r, term, info["format_ok"], info["format_error"]) == (-1.0, True, False, "no_answer")


def test_reward_recipes():
    qa = [Task(id="q", question="Who?", answers=["Ada Lovelace"])]
    env = ToolEnv(qa, [Calc(), Lookup()], reward="arpo")
    env.reset()
    env.step("<think>x</think><python>1</python>")
    env.step("<think>x</think><search>Ada</search>")
    _, r, *_ = env.step("<think>x</think><answer>\\boxed{Ada Lovelace}</answer>")
    assert r == pytest.approx(1.1)  # F1 1.0 + multi-tool bonus
    env = ToolEnv(qa, [], reward="f1")
    env.reset()
    assert env.step("<think>x</think><answer>\\boxed{Lovelace}</answer>")[1] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="unknown"):
        ToolEnv(qa, [], reward="bleu")


def test_constructor_errors():
    with pytest.raises(ValueError, match="at least one task"):
        ToolEnv([], [])
    with pytest.raises(ValueError, match="unique"):
        ToolEnv(TASKS, [Calc(), Calc()])


def test_gymnasium_env_checker():
    check_env(make_env(), skip_render_check=True)


def test_truncate_from_outside_scores_the_partial_response():
    env = make_env()
    env.reset(options={"index": 0})
    env.step(GOOD[0])
    reward, info = env.truncate("length")
    assert reward == -1.0 and info["truncated"] and info["end_reason"] == "length" and env.state.done
    with pytest.raises(RuntimeError, match="in progress"):
        env.truncate()


async def test_an_awaitable_reward_is_awaited_inside_astep():
    """A reward that must wait (an LLM judge) never blocks the event loop: astep awaits it."""
    from agent_envs.base.reward import RewardResult

    async def judged(task, response, format_ok, tool_calls):
        await asyncio.sleep(0)
        return RewardResult(0.5, {"judge_equal": 1.0})

    env = make_env(reward=judged)
    env.reset(options={"index": 0})
    _, r, term, _, info = await env.astep(GOOD[1])
    assert (r, term, info["judge_equal"]) == (0.5, True, 1.0)


def test_an_awaitable_reward_is_awaited_by_step_and_truncate_too():
    from agent_envs.base.reward import RewardResult

    loops = []

    async def judged(task, response, format_ok, tool_calls):
        loops.append(asyncio.get_running_loop())
        return RewardResult(0.25, {"judge_equal": 0.0})

    env = make_env(reward=judged)
    env.reset(options={"index": 0})
    assert env.step(GOOD[1])[1] == 0.25
    env.reset(options={"index": 0})
    env.step(GOOD[0])
    reward, info = env.truncate("length")
    assert reward == 0.25 and info["judge_equal"] == 0.0 and len(set(loops)) == 1  # the env's own loop


def test_a_plain_reward_callable_keeps_working():
    from agent_envs.base.reward import RewardResult

    env = make_env(reward=lambda task, response, format_ok, tool_calls: RewardResult(0.75, {"seen": len(response)}))
    env.reset(options={"index": 0})
    _, r, _, _, info = env.step(GOOD[1])
    assert r == 0.75 and info["seen"] == len(GOOD[1])


def test_a_subclassed_protocol_or_recipe_is_what_grades():
    from agent_envs.core.protocols import ArpoTags
    from agent_envs.rewards.recipe import RewardRecipe

    class Strict(ArpoTags):
        def check_format(self, response: str, prefill: str = "") -> tuple[bool, str | None]:
            return False, "strict"

    class Halved(RewardRecipe):
        def grade(self, *args):  # a subclass may change the grading itself
            result = super().grade(*args)
            result.score /= 2
            return result

    task = Task("t", "q?", ["Paris"])
    answer = "<think> x </think> <answer> \\boxed{Paris} </answer>"
    env = ToolEnv([task], protocol=Strict())
    env.reset(seed=0)
    assert env.step(answer)[4]["format_error"] == "strict"
    env = ToolEnv([task], reward=Halved())
    env.reset(seed=0)
    assert env.step(answer)[1] == 0.5


# Answers of every shape: right, wrong, hedged, malformed, non-ASCII, with tool tags in them.
SHAPES = (
    "<think> so </think> <answer> The answer is \\boxed{{{gold}}}. </answer>",
    "<think> so </think><answer>\\boxed{{{gold}}}</answer> trailing words",
    "<answer> \\boxed{{{gold}}} </answer>",
    "<think> a </think> <think> b <answer> \\boxed{{{gold}}} </answer>",
    "<think> so </think> <answer> x <answer> \\boxed{{{gold} or Lyon}} </answer>",
    "<think> so </think> <answer> {gold} </answer> <answer> again </answer>",
    "<think> so </think> <search> q </search> <answer> \\boxed{{{gold}}} </answer>",
    "<think> so </think> <result> fake </result> <answer> \\boxed{{{gold}}} </answer>",
    "<think> so </think> no answer block, \\boxed{{{gold}}}",
    "<think> \u00e9t\u00e9 </think> <answer> \\boxed{{\\frac{{1}}{{2}}}} </answer>",
    "<think> so </think> <answer> \\boxed{{unclosed </answer>",
)


@pytest.mark.parametrize("env_id", ["AgentQA-HotpotQA-v0", "AgentMath-MATH500-v0", "AgentSearch-v0"])
def test_step_and_astep_give_the_same_results(env_id: str, shared_data) -> None:
    import gymnasium as gym

    import agent_envs  # noqa: F401  (registers the ids)

    env = gym.make(env_id, reward="arpo").unwrapped
    for seed in range(3):
        env.reset(seed=seed)
        gold = env.task.answers[0]
        for shape in SHAPES:
            action = shape.format(gold=gold)
            outcomes = []
            for step in (env.step, lambda a: asyncio.run(env.astep(a))):
                env.reset(seed=seed)
                obs, reward, terminated, truncated, info = step(action)
                info.get("tool_result", {}).pop("latency_s", None)
                outcomes.append((obs, reward, terminated, truncated, list(info.items()), env.get_state()))
            assert outcomes[0] == outcomes[1], action


def test_vector_env_serves_a_batch_of_answers_like_single_envs(shared_data) -> None:
    import gymnasium as gym

    import agent_envs  # noqa: F401  (registers the ids)
    from agent_envs.core.vector import ToolVectorEnv

    venv = ToolVectorEnv.make("AgentQA-HotpotQA-v0", num_envs=8)
    singles = [gym.make("AgentQA-HotpotQA-v0") for _ in range(8)]
    venv.reset(seed=0)
    actions = [f"<think> x </think> <answer> \\boxed{{{e.unwrapped.task.answers[0]}}} </answer>" for e in venv.envs]
    actions[3] = "<think> x </think> <answer> \\boxed{nobody at all} </answer>"
    obs, rewards, terminated, truncated, infos = venv.step(actions)
    for i, env in enumerate(singles):
        env.reset(seed=i)
        o, r, term, trunc, info = env.step(actions[i])
        assert (obs[i], rewards[i], terminated[i], truncated[i]) == (o, r, term, trunc)
        assert _unbatched(infos, i) == info
    assert rewards.tolist() == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]


def _unbatched(infos: dict, i: int) -> dict:
    """Env `i`'s info out of Gymnasium-style vector infos: the keys its masks mark, in order."""
    out = {}
    for key, column in infos.items():
        if not key.startswith("_") and infos[f"_{key}"][i]:
            value = _unbatched(column, i) if isinstance(column, dict) else column[i]
            out[key] = value.item() if hasattr(value, "item") else value
    return out
