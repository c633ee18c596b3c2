"""Adversarial actions for fuzzing the envs: what a badly trained or hostile policy can emit.

Two sources share one vocabulary. `random_action(rng, ...)` draws from a seeded `random.Random`
(cheap, reproducible by seed, used for the long runs); `action_strategy(...)` is the same space
as a `hypothesis` strategy (shrinks a failing action to a minimal one). Sizes are kept sane for
the actions that reach a real tool (sandboxed Python, BM25): only actions the protocol cuts or
rejects before any tool runs are megabytes long.
"""

from __future__ import annotations

import json
import random

from hypothesis import strategies as st

# Characters that break naive text handling: lone surrogates, NUL and other controls, bidi
# overrides, combining marks, zero-width joiners, BOM, non-characters, full-width look-alikes of
# the protocol's angle brackets, and astral-plane code points.
EDGE_CHARS = [
    "\ud800", "\udfff", "\udc80", "\x00", "\x07", "\x1b[31m", "\r", "\r\n", "\t", "\x0b", "\x0c",
    "\u202e", "\u202d", "\u2066", "\u200f", "\u0301", "\u0336" * 30, "\u200b", "\u200d", "\ufeff",
    "\uffff", "\ufffe", "\ufffd", "\U0010ffff", "\U0001f600", "\U0001f469\u200d\U0001f4bb",
    "\uff1c", "\uff1e", "\u3008", "\u2329", "\u00a0", "\u2028", "\u2029", "\\", "\\\\", "$", "{", "}",
]

WORDS = ["Paris", "the", "42", "Alpha", "founded", "x", "print(1)", "1/0", "\\frac{1}{2}", "who", "A or B", "None"]

# Valid Python a policy might send; random text in a <python> tag is mostly a SyntaxError, which
# the sandbox answers in milliseconds. Nothing here runs long, writes files or imports heavy modules.
CODE = [
    "print(6*7)", "1/0", "x = 1\nx", "print('\\x00\\ud800'.encode('utf-8', 'replace'))", "import math\nmath.pi",
    "print('a' * 100000)", "raise SystemExit(3)", "print('\\u202eabc')", "def f(:", "while False: pass",
    "import sys; sys.stdout.write('\\x1b[2J')", "print(open.__name__)", "'''", "print(*range(50))",
]


def _tags(tools: list[str]) -> list[str]:
    names = [*tools, "think", "answer", "result", "tool_call", "search", "python", "browse"]
    out = []
    for n in dict.fromkeys(names):
        out += [f"<{n}>", f"</{n}>", f"<{n}", f"</{n}", f"<{n} >", f"< /{n}>", f"<{n.upper()}>"]
    return out + ["\\boxed{", "\\boxed ", "\\fbox{", "}", "{", "<<<", ">>>", "```python\n", "```"]


JSON_VARIANTS = 14


def json_call_body(rng: random.Random, tools: list[str], pick: int | None = None) -> str:
    """Tool-call bodies for the JSON protocol: valid, truncated, mistyped, deeply nested."""
    name = rng.choice([*tools, "nope", ""]) if tools else "nope"
    arg = rng.choice(["Paris", "print(1)", "", " ", "\x00", "\ud800", "x" * rng.randint(0, 300)])
    pick = rng.randrange(JSON_VARIANTS) if pick is None else pick
    if pick == 0:
        return json.dumps({"name": name, "arguments": {"query": arg}})
    if pick == 1:
        full = json.dumps({"name": name, "arguments": {"code": arg}})
        return full[: rng.randrange(len(full) + 1)]  # truncated mid-token
    if pick == 2:
        return json.dumps({"name": rng.choice([[name], {"n": name}, 3, None, True, 1.5]), "arguments": {"q": arg}})
    if pick == 3:
        return json.dumps({"name": name, "arguments": rng.choice([[], [arg], 7, None, "", arg, "{", "{bad json"])})
    if pick == 4:
        depth = rng.choice([50, 1000, 100_000])
        return "[" * depth + "]" * rng.choice([0, depth])  # deeper than the JSON parser recurses
    if pick == 5:
        depth = rng.choice([50, 5000])
        return json.dumps({"name": name, "arguments": {"q": "x"}})[:-1] + ', "z": ' + '{"a":' * depth + "1" + "}" * depth + "}"
    if pick == 6:
        return json.dumps({"name": name, "arguments": json.dumps({"query": arg})})  # arguments as a JSON string
    if pick == 7:
        return '{"name": "' + name + '", "arguments": {"q": NaN, "r": Infinity, "s": -Infinity}}'
    if pick == 8:
        return '{"name": "' + name + '", "name": "x", "arguments": {"q": "\\ud800\\u0000"}}'
    if pick == 9:
        return json.dumps({"name": name, "arguments": {"a": arg, "b": [1, {"c": None}], "d": 1e308}})
    if pick == 10:
        return json.dumps([{"name": name, "arguments": {"q": arg}}])  # a list of calls
    if pick == 11:
        return json.dumps(rng.choice([None, 0, "search", [], {}, {"arguments": {}}]))
    if pick == 12:
        digits = "9" * rng.choice([3, 400, 5000])  # Python refuses to parse ints over 4300 digits
        return '{"name": "' + name + '", "arguments": {"q": ' + digits + "}}"
    return '{"name": "' + name + '", "arguments": {"query": "' + rng.choice(EDGE_CHARS) + '"}}'


def _soup(rng: random.Random, tools: list[str], n: int) -> str:
    vocab = _tags(tools) + EDGE_CHARS + WORDS + [" ", "\n"]
    return "".join(rng.choice(vocab) for _ in range(n))


def _call(rng: random.Random, tool: str, body: str, protocol: str) -> str:
    if protocol == "json":
        return f"<tool_call>{json.dumps({'name': tool, 'arguments': {'input': body}})}</tool_call>"
    return f"<{tool}>{body}</{tool}>"


def _tool_argument(rng: random.Random, tool: str) -> str:
    if tool == "python":
        return rng.choice(CODE + [_soup(rng, ["python"], rng.randint(1, 40))])
    if tool == "browse":
        return rng.choice(["https://w/a", "w/a", "javascript:alert(1)", "file:///etc/passwd", "\x00", "http://" + "a" * 300])
    return _soup(rng, [tool], rng.randint(1, 60))


KINDS = ("soup", "nested", "unclosed", "json", "unicode", "binary", "huge", "tool_call", "answer")


def random_action(rng: random.Random, tools: list[str], protocol: str, kind: str | None = None) -> tuple[str, str]:
    """One adversarial action (kind, text) for an env with `tools` under `protocol` (arpo|json)."""
    kind = kind or rng.choice(KINDS)
    if kind == "soup":
        text = _soup(rng, tools, rng.randint(0, 200))
    elif kind == "nested":
        tag = rng.choice([*tools, "think", "answer", "tool_call"] if tools else ["think", "answer"])
        depth = rng.choice([10, 500, 20_000])
        text = f"<{tag}>" * depth + rng.choice(WORDS) + f"</{tag}>" * rng.choice([0, 1, depth])
        if rng.random() < 0.5:
            text = "<answer>" + "\\boxed{" * depth + "1" + "}" * rng.choice([0, depth]) + "</answer>"
    elif kind == "unclosed":
        text = rng.choice(["<think>", "<answer>\\boxed{", "<answer>", "<tool_call>{", "<search>Paris", "<python>print(1)",
                           "<think>x</think><answer>\\boxed{Paris", "\\boxed{\\frac{1}{", "<result>", "</answer>"])
    elif kind == "json":
        body = json_call_body(rng, tools)
        text = rng.choice(["<tool_call>{}</tool_call>", "<tool_call>\n{}\n</tool_call>", "{}", "<tool_call>{}"]).format(body)
        text = text.replace("{}", body) if "{}" in text else text
    elif kind == "unicode":
        text = "".join(rng.choice(EDGE_CHARS + WORDS) for _ in range(rng.randint(1, 80)))
        if rng.random() < 0.5:
            text = f"<think>{text}</think><answer>\\boxed{{{text}}}</answer>"
    elif kind == "binary":
        raw = rng.randbytes(rng.randint(1, 4000))
        text = raw.decode(rng.choice(["latin-1", "utf-8"]), errors=rng.choice(["replace", "surrogateescape", "ignore"]))
    elif kind == "huge":
        size = rng.choice([1 << 20, 3 << 20])
        unit = rng.choice(["a", "<think>", "\\boxed{", "\u0301", "\ud800", "<answer>x</answer>", "</tool_call>", " "])
        text = unit * (size // len(unit))
        if rng.random() < 0.3:  # a huge answer: the grader sees megabytes after the cut
            text = "<think>x</think><answer>\\boxed{" + "Paris " * (size // 12) + "}</answer>"
    elif kind == "tool_call":
        tool = rng.choice(tools) if tools else "python"
        text = rng.choice(["<think>go</think>", "", " "]) + _call(rng, tool, _tool_argument(rng, tool), protocol)
        if rng.random() < 0.2:
            text += "trailing text the engine would not have produced <answer>\\boxed{1}</answer>"
    else:
        pred = rng.choice([*WORDS, "", " ", "A or B or C", "\\frac{1}{0}", "10^{10^{10}}", "x" * 5000,
                           "\\sqrt{\\sqrt{\\sqrt{2}}}" * 20, "1,2,3", "(0,1]", "\\infty", "1e999", "0.1" * 200])
        text = rng.choice(["<think>t</think>", "", "<think></think>", "<think>"]) + f"<answer>\\boxed{{{pred}}}</answer>"
    return kind, text


def worst_cases(tools: list[str]) -> list[tuple[str, str]]:
    """(name, action): the actions that once crashed or stalled an env, each kept as a fixed case.
    Every JSON body variant comes wrapped in a call; the rest are the pathological sizes."""
    rng = random.Random(0)
    echo = "browse" if "browse" in tools else (tools or ["x"])[-1]  # browse echoes what it could not open
    cases = [(f"json_variant_{i}", f"<tool_call>{json_call_body(rng, tools, i)}</tool_call>") for i in range(JSON_VARIANTS)]
    return cases + [
        ("json_name_not_a_string", '<tool_call>{"name": {"a": 1}, "arguments": {"q": "x"}}</tool_call>'),
        ("json_int_over_4300_digits", '<tool_call>{"name": "search", "arguments": {"q": ' + "9" * 5000 + "}}</tool_call>"),
        ("json_nested_100k", "<tool_call>" + "[" * 100_000 + "</tool_call>"),
        ("answer_tags_20k_unclosed", "<answer>" * 20_000 + "x"),  # was quadratic: minutes per step
        ("boxed_3mb_answer", "<think>x</think><answer>\\boxed{" + "Paris " * 500_000 + "}</answer>"),
        ("boxed_20k_nested", "<think>x</think><answer>" + "\\boxed{" * 20_000 + "1" + "}" * 20_000 + "</answer>"),
        ("json_escaped_surrogate", '<tool_call>{"name": "' + echo + '", "arguments": {"q": "\\ud800"}}</tool_call>'),
        ("surrogates_and_nul", "<think>\ud800\x00</think><answer>\\boxed{\udfff\x00}</answer>"),
    ]


def action_strategy(tools: list[str], protocol: str) -> st.SearchStrategy[str]:
    """A hypothesis strategy over the same space: any Unicode (surrogates included), tag soups,
    and the seeded generator's kinds (hypothesis picks the seed, so failures shrink to a seed)."""
    any_text = st.text(st.characters(codec=None, categories=None), max_size=300)
    soup = st.lists(st.sampled_from(_tags(tools) + EDGE_CHARS + WORDS), max_size=60).map("".join)
    seeded = st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([k for k in KINDS if k != "huge"])).map(
        lambda s: random_action(random.Random(s[0]), tools, protocol, s[1])[1]
    )
    return st.one_of(any_text, soup, seeded, st.tuples(soup, any_text, soup).map("".join))
