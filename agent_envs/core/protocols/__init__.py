"""Text protocols: how a model calls tools and answers, and how results come back.

`ArpoTags` (inline tags, the default; its format check beside it) and `JsonToolCalls`
(Hermes function calling), both implementing `Protocol`.
"""

from __future__ import annotations

from typing import Any

from agent_envs.core.protocols.arpo import ArpoTags, arpo_format_check
from agent_envs.core.protocols.base import PROMPT_VERSION, ParsedAction, Protocol
from agent_envs.core.protocols.json_calls import JsonToolCalls

PROTOCOLS = {"arpo": ArpoTags, "json": JsonToolCalls}


def make_protocol(spec: str | Protocol, tokenizer: Any = None) -> Protocol:
    if isinstance(spec, Protocol):
        return spec
    if spec == "json":
        return JsonToolCalls(tokenizer)
    if spec in PROTOCOLS:
        return PROTOCOLS[spec]()
    raise ValueError(f"protocol {spec!r} is unknown; choose one of {sorted(PROTOCOLS)} or pass a Protocol")


__all__ = ["PROMPT_VERSION", "PROTOCOLS", "ArpoTags", "JsonToolCalls", "ParsedAction", "Protocol",
           "arpo_format_check", "make_protocol"]
