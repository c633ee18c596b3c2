"""Chat-template certification: does a template keep earlier turns fixed as a conversation grows?

    agent-envs check-template runs/sft_tiny/final_model
    agent-envs check-template tiny --template qwen3.jinja
    agent-envs check-template smollm2

    >>> from algorithms.rollout.chat_template import JinjaTemplate, certify
    >>> chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n{% endfor %}"
    ...           "{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}")
    >>> report = certify(JinjaTemplate(chatml))
    >>> report.prefix_preserving, report.strips_reasoning, report.generation_prefill
    (True, False, '<|im_start|>assistant\\n')

A probe conversation (system, user, an assistant turn with `<think>` reasoning and a tool call,
the tool result, an answer, a second user turn and its answer) is rendered one message longer at
a time; each rendering must start with the previous one (`render(messages[:k])` is a prefix of
`render(messages[:k+1])`, and the generation prompt is a prefix of the assistant turn that
follows it). With a tokenizer the same is checked on token ids. The report also says whether
the template drops earlier reasoning (Qwen3 removes the `<think>` blocks of assistant turns
before the last user message), what it pre-fills when it opens the assistant turn and how it
renders a tool result (read through the protocols' own rendering: `Protocol.generation_prefill`
and `JsonToolCalls.format_observation`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_envs.core.protocols import JsonToolCalls

REASONING = "I should compute 6*7 with the python tool."
PROBE: list[dict[str, str]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 6*7?"},
    {"role": "assistant", "content": f"<think>\n{REASONING}\n</think>\n\n"
     '<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>'},
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "<think>\nThe tool printed 42.\n</think>\n\nThe answer is \\boxed{42}."},
    {"role": "user", "content": "And 6*8?"},
    {"role": "assistant", "content": "<think>\nSix more.\n</think>\n\nThe answer is \\boxed{48}."},
]

WHAT_WE_DO = """\
What agent-envs does about it:
- RL rollouts are token-in/token-out: the env renders the prompt through the template once
  (reset), and the runner appends the engine's ids and each tool result's encoded text; it never
  re-renders the conversation, so prefix drift cannot change what the learner trains on.
- The `json` protocol reads the tool-result wrapping from this template once (the text between
  an assistant turn and the next, shown above) and appends it as mask-0 tokens.
- SFT on `messages` rows renders messages[:k] with the generation prompt and messages[:k+1]
  for every assistant turn: a reply that does not extend its context is an error naming the
  message; a context that re-renders differently (earlier reasoning stripped) restarts the
  example from the new rendering, so earlier assistant turns become context (mask 0).
- Prompts built elsewhere by re-rendering a whole conversation see the drift shown above."""


class JinjaTemplate:
    """A chat template without a tokenizer, with the `apply_chat_template` interface the
    protocols use (text only). `bos_token`/`eos_token` fill the template's variables."""

    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        self.chat_template = template
        self.bos_token, self.eos_token = bos_token, eos_token

    def apply_chat_template(
        self, messages: list[dict], tools: list | None = None, tokenize: bool = False,
        add_generation_prompt: bool = False, **kwargs: Any,
    ) -> str:
        from transformers.utils.chat_template_utils import render_jinja_template

        if tokenize:
            raise ValueError("a template file alone cannot tokenize; pass a tokenizer folder too")
        rendered, _ = render_jinja_template(
            [messages], tools=tools, chat_template=self.chat_template, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token, eos_token=self.eos_token, **kwargs,
        )
        return rendered[0]


@dataclass
class PrefixBreak:
    """Where growing the conversation by message `k` rewrote what was rendered before it."""

    message: int  # index of the message that was added
    role: str
    offset: int  # first differing character (or token, when `unit` is "token")
    before: str  # the earlier rendering from a little before the offset
    after: str  # the longer rendering at the same place
    unit: str = "char"

    def __str__(self) -> str:
        return (f"adding message {self.message} ({self.role}) changes earlier {self.unit}s at {self.offset}: "
                f"{self.before!r} became {self.after!r}")


@dataclass
class TemplateReport:
    name: str
    breaks: list[PrefixBreak] = field(default_factory=list)
    strips_reasoning: bool = False
    generation_prefill: str = ""
    tool_result: tuple[str, str] | None = None  # the text around a tool result
    tool_error: str | None = None
    tokens_checked: bool = False

    @property
    def prefix_preserving(self) -> bool:
        return not self.breaks

    def format(self) -> str:
        lines = [f"chat template of {self.name}"]
        verdict = "yes" if self.prefix_preserving else "NO"
        checked = "text and token ids" if self.tokens_checked else "text only, no tokenizer"
        lines.append(f"  prefix-preserving across turns ({checked}): {verdict}")
        lines += [f"    - {b}" for b in self.breaks]
        lines.append("  earlier reasoning: " + (
            "STRIPPED (the <think> blocks of assistant turns before the last user message are dropped)"
            if self.strips_reasoning else "kept"))
        lines.append(f"  generation prompt (pre-filled when the assistant turn opens): {self.generation_prefill!r}")
        if self.tool_result is not None:
            head, tail = self.tool_result
            lines.append(f"  tool role: a result is appended as {head!r} + RESULT + {tail!r}")
        else:
            lines.append(f"  tool role: {self.tool_error}")
        return "\n".join(lines + ["", WHAT_WE_DO])


def _render(tok: Any, messages: list[dict], generation: bool = False) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def _first_difference(a: str | list, b: str | list) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _break(k: int, role: str, earlier: str | list, later: str | list, unit: str = "char") -> PrefixBreak | None:
    if later[: len(earlier)] == earlier:
        return None
    at = _first_difference(earlier, later)
    lo = max(0, at - 12)
    return PrefixBreak(k, role, at, earlier[lo : at + 24], later[lo : at + 24], unit)


def certify(tok: Any, name: str = "the template", messages: list[dict] | None = None) -> TemplateReport:
    """Render the probe conversation one message longer at a time and report what changed."""
    messages = messages or PROBE
    if len(messages) < 3:
        raise ValueError("certify needs a conversation of at least 3 messages")
    report = TemplateReport(name)
    encode = getattr(tok, "encode", None) if not isinstance(tok, JinjaTemplate) else None
    report.tokens_checked = encode is not None
    renders = {k: _render(tok, messages[:k]) for k in range(2, len(messages) + 1)}
    for k in range(2, len(messages)):
        earlier, later, role = renders[k], renders[k + 1], messages[k]["role"]
        found = _break(k, role, earlier, later)
        if found is None and role == "assistant":  # the prompt the model continued
            found = _break(k, role, _render(tok, messages[:k], generation=True), later)
        if found is None and encode is not None:
            ids = encode(earlier, add_special_tokens=False)
            found = _break(k, role, ids, encode(later, add_special_tokens=False), unit="token")
        if found is not None:
            report.breaks.append(found)
    # the first assistant turn's reasoning, before and after a later user message
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    report.strips_reasoning = any(
        REASONING in renders[k] for k in range(2, last_user + 1)
    ) and REASONING not in renders[len(messages)]
    protocol = JsonToolCalls(tok)  # the protocols' own reading of the template
    report.generation_prefill = protocol.generation_prefill(tok)
    try:
        report.tool_result = protocol._build_obs_template()
    except Exception as exc:  # noqa: BLE001  (any template error is the finding to report)
        turn = _tool_turn(tok)
        why = ("it JSON-encodes the content of a tool message (the result 42 becomes \"42\")"
               if '"42"' in turn else f"{type(exc).__name__}: {exc}")
        report.tool_error = (f"the json protocol cannot wrap tool results with this template: {why}; "
                             f"one tool message renders as {turn!r}")
    return report


def _tool_turn(tok: Any) -> str:
    """What the template writes for one tool message, when it writes anything."""
    try:
        three = _render(tok, PROBE[:4])
        return three[len(_render(tok, PROBE[:3])) :]
    except Exception as exc:  # noqa: BLE001
        return f"(rendering fails: {type(exc).__name__}: {exc})"


def load(source: str | None, template: str | None = None) -> tuple[Any, str]:
    """A tokenizer (or a bare template) and a name for the report.

    `source`: a model name of the resolver (`tiny`, `smollm2`), a model or tokenizer folder, a
    folder holding one `.gguf` file, or a `.gguf` file; `template`: a Jinja file that replaces
    the tokenizer's template (alone: text checks).
    """
    tok = None
    name = source or ""
    if source:
        tok = _tokenizer(source)
    if template is not None:
        path = Path(template)
        if not path.is_file():
            raise SystemExit(f"--template {template}: no such file")
        text = path.read_text()
        name = f"{path.name}" + (f" with the tokenizer of {source}" if source else "")
        if tok is None:
            return JinjaTemplate(text), name
        tok.chat_template = text
    if tok is None:
        raise SystemExit("check-template: give a model or tokenizer folder, or --template FILE.jinja")
    if not getattr(tok, "chat_template", None):
        raise SystemExit(f"{source}: the tokenizer has no chat template; pass --template FILE.jinja")
    return tok, name


def _tokenizer(source: str) -> Any:
    from transformers import AutoTokenizer

    from algorithms.models.resolve import NAMED_MODELS, resolve_model

    if source in NAMED_MODELS:  # tiny, smollm2: built or converted on first use
        return AutoTokenizer.from_pretrained(resolve_model(source))
    path = Path(source)
    if path.is_file() and path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    if path.is_dir() and not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return AutoTokenizer.from_pretrained(path, gguf_file=ggufs[0].name)
        if len(ggufs) > 1:
            raise SystemExit(f"{source}: several .gguf files ({', '.join(g.name for g in ggufs)}); name one")
    if not path.exists():
        raise SystemExit(f"{source}: no such folder (the hub is not used here; give a local folder)")
    return AutoTokenizer.from_pretrained(path)


def add_cli(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check-template", help="does a chat template preserve prefixes across turns? (docs/diagnostics.md)"
    )
    p.add_argument("model", nargs="?",
                   help="tiny, smollm2, a model or tokenizer folder, or a .gguf file (or its folder)")
    p.add_argument("--template", help="a Jinja chat template file (replaces the tokenizer's)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_run)


def _run(args: Any) -> int:
    tok, name = load(args.model, args.template)
    report = certify(tok, name)
    if args.json:
        print(json.dumps({"name": report.name, "prefix_preserving": report.prefix_preserving,
                          "breaks": [str(b) for b in report.breaks], "strips_reasoning": report.strips_reasoning,
                          "generation_prefill": report.generation_prefill,
                          "tool_result": report.tool_result, "tool_error": report.tool_error}, indent=1))
    else:
        print(report.format())
    return 0


__all__ = ["PROBE", "JinjaTemplate", "PrefixBreak", "TemplateReport", "certify", "load"]
