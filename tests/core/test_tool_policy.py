"""A tool brings its own policy: defined here, in the test file, it works through ToolEnv with
both protocols without any change to the env or the protocols. Also: the chat-template prefill
is an explicit env setting."""

from __future__ import annotations

import json

import pytest

from agent_envs import Task, Tool, ToolEnv, ToolResult
from agent_envs.base.messages import MESSAGES

TASKS = [Task(id="r0", question="What is 'olleh' reversed?", answers=["hello"], reward="exact")]


class Reverse(Tool):
    """A tool no core file knows: its tag, argument cleaning and repeat policy are its own."""

    name, argument, description = "reverse", "text", "reverses a word"
    dedupe_repeats = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    def clean_argument(self, text: str) -> str:
        return text.strip().lower()

    async def call(self, arg: str) -> ToolResult:
        self.calls.append(arg)
        return ToolResult(text=arg[::-1])


class Echo(Tool):
    name, argument = "echo", "text"

    async def call(self, arg: str) -> ToolResult:
        return ToolResult(text=arg)


def test_new_tool_through_arpo_tags():
    tool = Reverse()
    env = ToolEnv(TASKS, [tool], reward="binary")
    _, info = env.reset(seed=0)
    assert info["stop_sequences"] == ["</reverse>"]
    assert "<reverse> text </reverse>" in info["messages"][0]["content"]
    obs, _, done, _, info = env.step("<think>reverse it</think><reverse> OLLEH </reverse>")
    assert obs == " <result>\nhello\n</result>" and not done
    assert tool.calls == ["olleh"] and info["tool_input"] == "olleh"
    # the tool asked for repeats to be answered, not run; its own cleaning makes these the same call
    obs, *_, info = env.step("<think>again</think><reverse>olleh</reverse>")
    assert MESSAGES["repeated_query"] in obs and info["repeated_query"] and tool.calls == ["olleh"]
    _, reward, done, _, info = env.step("<think>so</think><answer>\\boxed{hello}</answer>")
    # the format check knows the new tag: each call is closed and answered by a result block
    assert done and reward == 1.0 and info["format_ok"] and info["calls_per_tool"] == {"reverse": 2}


def test_new_tool_through_json_tool_calls():
    tool = Reverse()
    env = ToolEnv(TASKS, [tool], protocol="json", reward="binary")
    _, info = env.reset(seed=0)
    assert info["stop_sequences"] == ["</tool_call>"]
    assert '"name": "reverse"' in info["messages"][0]["content"]
    call = json.dumps({"name": "reverse", "arguments": {"text": " OLLEH "}})
    obs, _, done, _, info = env.step(f"<tool_call>{call}</tool_call>")
    assert "hello" in obs and not done and tool.calls == ["olleh"]
    obs, *_, info = env.step(f"<tool_call>{call}</tool_call>")
    assert MESSAGES["repeated_query"] in obs and tool.calls == ["olleh"]
    _, reward, done, _, _ = env.step("It is \\boxed{hello}.")
    assert done and reward == 1.0


def test_tools_without_the_policy_run_every_call_and_unknown_tags_are_flagged():
    env = ToolEnv(TASKS, [Echo()])
    env.reset(seed=0)
    env.step("<think>a</think><echo>hi</echo>")
    obs, *_, info = env.step("<think>a</think><echo>hi</echo>")
    assert obs == " <result>\nhi\n</result>" and "repeated_query" not in info
    # a known tool this env does not enable is flagged, and not run
    obs, *_, info = env.step("<think>a</think><reverse>x</reverse><echo>y</echo>")
    assert "disabled_tool:reverse" in info["flags"] and info["tool"] == "echo"


def _answer_after_prefilled_think(env: ToolEnv) -> dict:
    env.reset(seed=0)
    return env.step("the reverse of olleh</think><answer>\\boxed{hello}</answer>")[-1]


def test_prefill_is_an_explicit_setting():
    # without a tokenizer nothing is pre-filled: a response with no opening <think> breaks the format
    assert ToolEnv(TASKS).prefill == ""
    assert _answer_after_prefilled_think(ToolEnv(TASKS))["format_error"] == "think_tags"
    assert _answer_after_prefilled_think(ToolEnv(TASKS, prefill="<think>\n"))["format_ok"]


def test_prefill_defaults_to_what_the_chat_template_writes():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)
    hf.chat_template = (
        "{% for m in messages %}<<{{ m.role }}>>{{ m.content }}<</{{ m.role }}>>{% endfor %}"
        "{% if add_generation_prompt %}<<assistant>><think>\n{% endif %}"
    )
    env = ToolEnv(TASKS, tokenizer=hf)
    assert env.prefill == "<<assistant>><think>\n"
    assert _answer_after_prefilled_think(env)["format_ok"]
    # the setting overrides the template
    assert _answer_after_prefilled_think(ToolEnv(TASKS, tokenizer=hf, prefill=""))["format_error"] == "think_tags"
