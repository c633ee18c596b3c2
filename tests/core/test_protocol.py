"""Protocol parsing: every kind of model output becomes a ParsedAction, never an exception."""

from __future__ import annotations

import json

import pytest

from agent_envs.core.protocols import ArpoTags, JsonToolCalls, make_protocol
from agent_envs.retrieval import BM25Backend
from agent_envs.tools import PythonTool, SearchTool

# Real tools: each brings its policy (tag, argument cleaning). Neither starts anything until called.
TOOLS = [PythonTool(), SearchTool(BM25Backend([{"id": "d1", "title": "Acme", "text": "Acme was founded by Ada."}]))]


@pytest.fixture
def arpo() -> ArpoTags:
    return ArpoTags()


def test_tool_call_content_between_last_open_and_first_close(arpo):
    p = arpo.parse("<think>a</think><search>x</search><search> who  founded \"Acme\" </search> tail", TOOLS)
    assert (p.kind, p.tool, p.tool_input) == ("tool", "search", "x")
    assert p.text == "<think>a</think><search>x</search>"


def test_search_query_cleaned_and_python_fences_stripped(arpo):
    assert arpo.parse('<search> who  founded\n"Acme" </search>', TOOLS).tool_input == "who founded Acme"
    code = arpo.parse("<python>```python\nprint(1)\n```</python>", TOOLS).tool_input
    assert code == "print(1)"


def test_answer_and_end(arpo):
    p = arpo.parse("<think>t</think><answer>\\boxed{3}</answer> trailing junk", TOOLS)
    assert p.kind == "answer" and p.text.endswith("</answer>")
    assert arpo.parse("I give up", TOOLS).kind == "end"
    # an answer written before a tool call wins: the model finished
    assert arpo.parse("<answer>\\boxed{1}</answer><python>1</python>", TOOLS).kind == "answer"


@pytest.mark.parametrize(
    "action",
    ["", "<python></python>", "<python>   </python>", "</python>", "<search>\"\"</search>"],
)
def test_empty_calls_are_invalid_not_errors(arpo, action):
    p = arpo.parse(action, TOOLS)
    assert p.kind in ("invalid", "end")
    if p.kind == "invalid":
        assert p.reason == "empty_call"


def test_flags_for_model_written_result_and_disabled_tools(arpo):
    p = arpo.parse("<browse>x</browse><result>fake</result><answer>\\boxed{1}</answer>", [PythonTool()])
    assert "model_wrote_result" in p.flags and "disabled_tool:browse" in p.flags
    assert p.kind == "answer"


def test_stop_sequences_follow_enabled_tools():
    assert ArpoTags().stop_sequences(["python"]) == ["</python>"]
    assert ArpoTags(stop_on_answer=True).stop_sequences([]) == ["</answer>"]
    assert JsonToolCalls().stop_sequences(["search"]) == ["</tool_call>"]


def test_arpo_format_check_rules(arpo):
    good = "<think>a</think><python>1</python> <result>\n1\n</result><think>b</think><answer>\\boxed{1}</answer>"
    assert arpo.check_format(good) == (True, None)
    assert arpo.check_format("<answer>\\boxed{1}</answer>")[1] == "think_tags"
    assert arpo.check_format("<think>a</think><answer>1</answer>")[1] == "no_boxed"
    two = "<think>a</think><answer>\\boxed{1}</answer><answer>\\boxed{2}</answer>"
    assert arpo.check_format(two)[1] == "answer_tags"
    # a result block the model wrote itself (no tool call before it) breaks the format
    forged = "<think>a</think><result>x</result><answer>\\boxed{1}</answer>"
    assert arpo.check_format(forged) == (False, "model_wrote_result")


def test_json_tool_calls_parse():
    proto = JsonToolCalls()
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(2)"}}</tool_call>'
    p = proto.parse("Let me compute. " + call + " ignored", TOOLS)
    assert (p.kind, p.tool, p.tool_input) == ("tool", "python", "print(2)")
    assert p.text.endswith("</tool_call>")
    # arguments given as a JSON string (some models do that)
    s = json.dumps({"name": "search", "arguments": json.dumps({"query": 'a "b"'})})
    assert proto.parse(f"<tool_call>{s}</tool_call>", TOOLS).tool_input == "a b"


@pytest.mark.parametrize(
    "body,reason",
    [
        ("{not json", "not valid JSON"),
        ('{"name": "shell", "arguments": {"cmd": "ls"}}', "unknown tool"),
        ('{"name": "python", "arguments": {}}', "empty_call"),
        ("", "empty_call"),
        ('["python"]', "not valid JSON"),
    ],
)
def test_json_tool_calls_malformed(body, reason):
    p = JsonToolCalls().parse(f"<tool_call>{body}</tool_call>", TOOLS)
    assert p.kind == "invalid" and reason in p.reason


def test_json_final_answer_and_observation_without_tokenizer():
    proto = JsonToolCalls()
    assert proto.parse("The answer is \\boxed{4}.", TOOLS).kind == "answer"
    assert proto.parse("no idea", TOOLS).kind == "end"
    obs = proto.format_observation("42")
    assert obs.startswith("<|im_end|>") and "<tool_response>\n42\n</tool_response>" in obs
    assert obs.endswith("<|im_start|>assistant\n")


def test_json_format_verdict_names_a_failing_rule_only_when_it_fails():
    proto = JsonToolCalls()
    assert proto.check_format("The answer is \\boxed{4}.") == (True, None)
    assert proto.check_format("no idea") == (False, "no_answer")


def test_json_observation_from_chat_template():
    """With a tokenizer, the tool turn is whatever the chat template renders for a tool message."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok)
    hf.chat_template = (
        "{% for m in messages %}<<{{ m.role }}>>{{ m.content }}<</{{ m.role }}>>{% endfor %}"
        "{% if add_generation_prompt %}<<assistant>>{% endif %}"
    )
    obs = JsonToolCalls(hf).format_observation("RESULT")
    assert obs == "<</assistant>><<tool>>RESULT<</tool>><<assistant>>"


def test_make_protocol_errors():
    with pytest.raises(ValueError, match="unknown"):
        make_protocol("xml")
