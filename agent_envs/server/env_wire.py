"""The env server's wire format: OpenEnv's payload shapes, our JSON Schemas, and the checks that
turn a malformed request into a 4xx with a reason (docs/interop.md).

Shapes follow OpenEnv (meta-pytorch/OpenEnv, `openenv-core` 0.3): a reset or step answers
`{"observation": {...}, "reward": float | null, "done": bool}`; a validation failure is 422 with
`{"detail": [{"type", "loc", "msg", "input"}]}`; other failures `{"detail": "reason"}`; on `/ws`
an error is `{"type": "error", "data": {"message", "code"}}`.

    >>> check({"message": "hi", "mood": 1}, ACTION_FIELDS, ("data",))
    Traceback (most recent call last):
    ...
    agent_envs.server.env_wire.ValidationError: data.mood: Extra inputs are not permitted
"""

from __future__ import annotations

import json as _json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

PROTOCOL = "agent-envs-env/1"
OPENENV_API_VERSION = "1.0.0"

# name -> (accepted JSON types, required); None is accepted for every field that is not required
Fields = Mapping[str, tuple[tuple[type, ...], bool]]

ACTION_FIELDS: Fields = {"message": ((str,), True), "metadata": ((dict,), False)}
RESET_FIELDS: Fields = {"seed": ((int,), False), "episode_id": ((str,), False), "options": ((dict,), False)}
STEP_FIELDS: Fields = {"action": ((dict,), True), "timeout_s": ((int, float), False), "request_id": ((str,), False)}
BATCH_FIELDS: Fields = {"steps": ((list,), True), "timeout_s": ((int, float), False)}
BATCH_ITEM_FIELDS: Fields = {"session_id": ((str,), True), "action": ((dict,), True), "request_id": ((str,), False)}
# the messages of /ws: reset's data is optional, step's required, state and close carry none
WS_FIELDS: dict[str, Fields] = {
    "reset": {"type": ((str,), True), "data": ((dict,), False)},
    "step": {"type": ((str,), True), "data": ((dict,), True)},
    "state": {"type": ((str,), True)},
    "close": {"type": ((str,), True)},
}
_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


class RequestError(Exception):
    """A request the server cannot serve: the HTTP status and the reason, for the person."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class ValidationError(Exception):
    """A payload that does not match its schema; `errors` in pydantic's shape (as OpenEnv sends)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors
        first = errors[0]
        super().__init__(f"{'.'.join(map(str, first['loc']))}: {first['msg']}")


def error(kind: str, loc: tuple, msg: str, value: Any) -> dict[str, Any]:
    return {"type": kind, "loc": list(loc), "msg": msg, "input": value}


def check(payload: Any, fields: Fields, loc: tuple) -> dict[str, Any]:
    """`payload` if it is an object with only `fields`, of their types; else a `ValidationError`
    listing every problem."""
    if not isinstance(payload, dict):
        raise ValidationError([error("model_type", loc, "Input should be an object", payload)])
    errors = []
    for key, value in payload.items():
        if key not in fields:
            errors.append(error("extra_forbidden", (*loc, key), "Extra inputs are not permitted", value))
            continue
        types, required = fields[key]
        if value is None and not required:
            continue
        # JSON true is not an integer here, though Python's bool is one
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            name = " or ".join(_TYPE_NAMES[t] for t in types)
            errors.append(error(f"{_TYPE_NAMES[types[0]]}_type", (*loc, key), f"Input should be a valid {name}", value))
    for key, (_, required) in fields.items():
        if required and key not in payload:
            errors.append(error("missing", (*loc, key), "Field required", None))
    errors += _ranges(payload, loc)
    if errors:
        raise ValidationError(errors)
    return payload


def _ranges(payload: dict[str, Any], loc: tuple) -> list[dict[str, Any]]:
    """The bounds OpenEnv's request models put on their fields, and our reset options."""
    out = []
    seed, timeout = payload.get("seed"), payload.get("timeout_s")
    if type(seed) is int and seed < 0:
        out.append(error("greater_than_equal", (*loc, "seed"), "Input should be greater than or equal to 0", seed))
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout <= 0:
        out.append(error("greater_than", (*loc, "timeout_s"), "Input should be greater than 0", timeout))
    episode = payload.get("episode_id")
    if isinstance(episode, str) and len(episode) > 255:
        out.append(error("string_too_long", (*loc, "episode_id"), "String should have at most 255 characters",
                         episode))
    options = payload.get("options")
    if isinstance(options, dict):
        for key, value in options.items():
            if key != "index":
                out.append(error("extra_forbidden", (*loc, "options", key),
                                 "Extra inputs are not permitted (options take only 'index')", value))
            elif type(value) is not int:
                out.append(error("int_type", (*loc, "options", key), "Input should be a valid integer", value))
    return out


def action_text(payload: Any, loc: tuple) -> str:
    """The text of an action payload `{"message": str, "metadata"?: object}`."""
    return check(payload, ACTION_FIELDS, loc)["message"]


async def body(request: web.Request, empty_ok: bool = False) -> Any:
    """The request's JSON body (an empty body is `{}` where `empty_ok`)."""
    raw = await request.read()
    if not raw.strip() and empty_ok:
        return {}
    try:
        return _json.loads(raw)
    except (_json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationError([error("json_invalid", ("body",), f"JSON decode error: {exc}", raw[:200].decode(
            "utf-8", "replace"))]) from None


def result(text: str, reward: float | None, terminated: bool, truncated: bool, info: dict[str, Any]) -> dict:
    """A reset or step answer in OpenEnv's envelope; Gymnasium's two end flags ride in the observation."""
    return {"observation": {"text": text, "terminated": bool(terminated), "truncated": bool(truncated),
                            "info": info},
            "reward": None if reward is None else float(reward), "done": bool(terminated or truncated)}


def _default(value: Any) -> Any:
    """JSON for what `info` may hold beyond JSON's types (numpy scalars, sets, tuples of pairs)."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def dumps(value: Any) -> str:
    return _json.dumps(value, default=_default)


def json(value: Any, status: int = 200) -> web.Response:
    return web.Response(text=dumps(value), status=status, content_type="application/json")


def ws_error(code: str, message: str, **extra: Any) -> str:
    return dumps({"type": "error", "data": {"message": message, "code": code, **extra}})


def _object(title: str, properties: dict[str, Any], required: list[str], extra: bool = False) -> dict[str, Any]:
    return {"title": title, "type": "object", "properties": properties, "required": required,
            "additionalProperties": extra}


SCHEMAS = {
    "action": _object("TextAction", {
        "message": {"type": "string", "description": "one generated segment: text ending at a stop string or EOS"},
        "metadata": {"type": "object", "description": "free-form; ignored by the env"},
    }, ["message"]),
    "observation": _object("TextObservation", {
        "text": {"type": "string", "description": "at reset the rendered prompt; after a step only the new text "
                                                  "to append (a tool result), empty at the end"},
        "terminated": {"type": "boolean", "description": "the agent answered or stopped"},
        "truncated": {"type": "boolean", "description": "a tool-call, turn or response budget ended the episode"},
        "info": {"type": "object", "description": "at reset messages, task_id, stop_sequences; after a step the "
                                                  "reward components (correct, f1, format_ok, tool_calls, ...)"},
    }, ["text", "terminated", "truncated", "info"]),
    "state": _object("EpisodeState", {
        "episode_id": {"type": ["string", "null"]},
        "step_count": {"type": "integer", "minimum": 0},
        "env_id": {"type": "string"},
        "task_id": {"type": ["string", "null"]},
        "done": {"type": "boolean"},
        "tool_calls": {"type": "integer", "minimum": 0},
    }, ["episode_id", "step_count"], extra=True),
}


def metadata(env_id: str) -> dict[str, Any]:
    """OpenEnv's `EnvironmentMetadata` of a registered id; the README is its family's docstring."""
    import gymnasium as gym

    from agent_envs import __version__
    from agent_envs.envs import env_summaries

    summary = dict(env_summaries()).get(env_id, f"the registered env {env_id}")
    entry = gym.spec(env_id).entry_point
    readme = None
    if isinstance(entry, str):
        import importlib

        readme = importlib.import_module(entry.split(":")[0]).__doc__
    return {"name": env_id, "description": summary, "readme_content": readme, "version": __version__,
            "author": None, "documentation_url": None}


def openapi(env_id: str, paths: list[str]) -> dict[str, Any]:
    """A minimal OpenAPI document: OpenEnv's validator reads its `info.version` (the version of
    OpenEnv's HTTP API served, as OpenEnv's own servers state it) and the path set."""
    from agent_envs import __version__

    return {"openapi": "3.1.0", "info": {"title": f"agent-envs env server: {env_id}", "version": OPENENV_API_VERSION,
                                         "x-agent-envs-version": __version__},
            "paths": {p: {} for p in paths}}


def mcp_reply(raw: bytes) -> dict[str, Any]:
    """JSON-RPC 2.0 answers on `/mcp`: this server's tools are played through steps, not MCP calls."""
    try:
        request = _json.loads(raw)
    except (_json.JSONDecodeError, UnicodeDecodeError):
        return {"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": None}
    if not isinstance(request, dict) or not isinstance(request.get("method"), str):
        rid = request.get("id") if isinstance(request, dict) else None
        return {"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request: 'method' is required"},
                "id": rid}
    return {"jsonrpc": "2.0", "error": {"code": -32601, "message": f"Method not found: {request['method']} (this "
                                        "env server plays tools through /step, not MCP)"}, "id": request.get("id")}


__all__ = ["RequestError", "SCHEMAS", "ValidationError", "action_text", "check", "result"]
