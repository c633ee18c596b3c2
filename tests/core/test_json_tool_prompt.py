"""Under the JSON protocol the model always sees the tool schemas: from the chat template when it
writes `tools` (Qwen, Hermes), else from our system turn (templates that ignore `tools`)."""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401
from agent_envs.core.protocols.json_calls import renders_tools
from algorithms.models.tiny import build_tiny_model

# ChatML that ignores `tools`, as SmolLM2's and many other templates do
PLAIN_CHATML = ("{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny_model(seed=0))


def test_a_template_that_writes_tools_gets_them_once(tokenizer):
    assert renders_tools(tokenizer)
    env = gym.make("AgentMath-v0", protocol="json", tokenizer=tokenizer)
    prompt, _ = env.reset(seed=0)
    assert prompt.count('"name": "python"') == 1


def test_a_template_that_ignores_tools_gets_them_in_our_system_turn(tokenizer):
    plain = copy.copy(tokenizer)
    plain.chat_template = PLAIN_CHATML
    assert not renders_tools(plain)
    env = gym.make("AgentMath-v0", protocol="json", tokenizer=plain)
    prompt, _ = env.reset(seed=0)
    assert '"name": "python"' in prompt and "<tool_call>" in prompt


def test_a_custom_system_prompt_is_kept(tokenizer):
    env = gym.make("AgentMath-v0", protocol="json", tokenizer=tokenizer, system_prompt="Be brief.")
    prompt, _ = env.reset(seed=0)
    assert "Be brief." in prompt
