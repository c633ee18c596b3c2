"""Prompting baselines: the same env and model, asked differently.

| name     | tools | what the system prompt asks for                                   |
|----------|-------|-------------------------------------------------------------------|
| `tools`  | yes   | the env's own protocol: think, call tools, answer (ReAct-style)    |
| `cot`    | no    | think step by step in `<think>`, then answer in `<answer>\\boxed{}` |
| `direct` | no    | answer at once in `<answer>\\boxed{}`                               |

    >>> import gymnasium as gym, agent_envs
    >>> env = apply_baseline(gym.make("AgentMath-v0").unwrapped, "cot")
    >>> env.stop_sequences
    []
"""

from __future__ import annotations

from agent_envs.core.env import ToolEnv

BASELINES = ("tools", "cot", "direct")

_PROMPTS = {
    "cot": (
        "You are a helpful assistant. Think about the question step by step inside <think> </think>, then give "
        "the final answer inside <answer> </answer>, with the exact final answer in \\boxed{} in LaTeX format."
    ),
    "direct": (
        "You are a helpful assistant. Give the final answer at once, without explanation, as "
        "<answer> \\boxed{answer} </answer>."
    ),
}


def apply_baseline(env: ToolEnv, name: str) -> ToolEnv:
    """Turn `env` (in place) into the named prompting baseline and return it."""
    if name not in BASELINES:
        raise ValueError(f"prompting baseline {name!r} is unknown; choose one of {BASELINES}")
    if name != "tools":
        env.tools = {}
        env.system_prompt_text = _PROMPTS[name]
    return env
