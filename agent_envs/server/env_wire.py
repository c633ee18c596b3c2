"""The env server's wire format: OpenEnv's payload shapes, our JSON Schemas, and the checks that
turn a malformed request into a 4xx with a reason (docs/interop.md).

Every request body and `/ws` message is decoded by `loads` alone: at most `MAX_DEPTH` levels of
nesting, finite numbers only (JSON has no NaN or Infinity), and an action's text at most
`MAX_ACTION_CHARS`; what a reply echoes of a request is cut by `clip` with a marker.

Shapes follow OpenEnv (meta-pytorch/OpenEnv, PyPI `openenv` 0.10): a reset or step answers
`{"observation": {...}, "reward": float | null, "done": bool, "metadata": {...}}`; a validation
failure is 422 with `{"detail": [{"type", "loc", "msg", "input"}]}`; other failures `{"detail":
"reason"}`; on `/ws` an error is `{"type": "error", "data": {"message", "code"}}`.

    >>> check({"message": "hi", "mood": 1}, ACTION_FIELDS, ("data",))
    Traceback (most recent call last):
    ...
    agent_envs.server.env_wire.ValidationError: data.mood: Extra inputs are not permitted
"""

from __future__ import annotations

import json as _json
import math
from collections.abc import Mapping
from typing import Any

from aiohttp import web

PROTOCOL = "agent-envs-env/1"
OPENENV_API_VERSION = "1.0.0"

MAX_DEPTH = 32  # nesting levels of a request; our payloads use 4
MAX_ACTION_CHARS = 1 << 20  # an action's text; envs end an episode long before (max_response_chars)
MAX_ID_CHARS = 255  # episode_id, request_id, session_id, why
ECHO_CHARS = 200  # what an error answer quotes of a request's value
DETAIL_CHARS = 2000  # an error's reason

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
        detail = clip(detail, DETAIL_CHARS)  # a reason may quote a request (env_kwargs, a seed)
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
    return {"type": kind, "loc": list(loc), "msg": clip(msg, DETAIL_CHARS), "input": clip(value)}


def clip(value: Any, limit: int = ECHO_CHARS) -> Any:
    """`value` as an answer may quote it: a string, or a container as its JSON, longer than `limit`
    is cut there with a marker; a non-finite float becomes its name (strict JSON has no NaN).

    >>> clip("x" * 300, 5)
    'xxxxx... [truncated: 300 characters in all]'
    >>> clip([1, 2], 10), clip(float("nan"))
    ([1, 2], 'nan')
    """
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (dict, list)):
        text = dumps(value)
        if len(text) <= limit:
            return value
        value = text
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}... [truncated: {len(value)} characters in all]"
    return value


def loads(raw: bytes | str, loc: tuple = ("body",)) -> Any:
    """The JSON of a request body or a `/ws` message, or a `ValidationError` saying why not: not
    JSON, nested deeper than `MAX_DEPTH`, or a number that is not finite (`NaN`, `Infinity`,
    `1e999`), which strict JSON parsers refuse and no field of ours takes.

    >>> loads(b'{"timeout_s": NaN}')
    Traceback (most recent call last):
    ...
    agent_envs.server.env_wire.ValidationError: body: JSON decode error: NaN is not a JSON number; send a finite number
    """
    try:
        value = _json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:  # the decoder's own limit, for bodies far deeper than ours
        raise ValidationError([error("json_invalid", loc, f"JSON nested deeper than {MAX_DEPTH} levels", raw)]) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, ours, int digits over Python's limit
        raise ValidationError([error("json_invalid", loc, f"JSON decode error: {exc}", raw)]) from None
    if _too_deep(value):
        raise ValidationError([error("json_invalid", loc, f"JSON nested deeper than {MAX_DEPTH} levels", raw)])
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; send a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{clip(text, 40)} is beyond a float's range; send a finite number")
    return value


def _too_deep(value: Any) -> bool:
    """Whether `value` nests deeper than `MAX_DEPTH` (walked with a stack, not recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


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
    for key in ("episode_id", "request_id", "session_id", "why"):
        value = payload.get(key)
        if isinstance(value, str) and len(value) > MAX_ID_CHARS:
            out.append(error("string_too_long", (*loc, key), f"String should have at most {MAX_ID_CHARS} characters",
                             value))
    message = payload.get("message")
    if isinstance(message, str) and len(message) > MAX_ACTION_CHARS:
        out.append(error("string_too_long", (*loc, "message"), f"String should have at most {MAX_ACTION_CHARS} "
                         f"characters (an action is one generated segment), got {len(message)}", message))
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
    return loads(raw)


def result(text: str, reward: float | None, terminated: bool, truncated: bool, info: dict[str, Any],
           state: dict[str, Any]) -> dict:
    """A reset or step answer in OpenEnv's envelope; Gymnasium's two end flags ride in the
    observation, and `metadata` (OpenEnv 0.10's `StepResult.metadata`) is the episode's state after it."""
    return {"observation": {"text": text, "terminated": bool(terminated), "truncated": bool(truncated),
                            "info": info},
            "reward": None if reward is None else float(reward), "done": bool(terminated or truncated),
            "metadata": state}


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
    return dumps({"type": "error", "data": {"message": clip(message, DETAIL_CHARS), "code": code, **extra}})


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
SCHEMAS["reset_observation"] = SCHEMAS["observation"]  # OpenEnv 0.10's key: a reset answers the same shape


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


def mcp_reply(raw: bytes) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON-RPC 2.0 answer) on `/mcp`: this server's tools are played through steps,
    not MCP calls; a body that is not JSON is a 400 (as MCP's HTTP transport answers it)."""
    try:
        request = loads(raw)
    except ValidationError as exc:
        return 400, {"jsonrpc": "2.0", "error": {"code": -32700, "message": f"Parse error: {exc.errors[0]['msg']}"},
                     "id": None}
    return 200, _mcp_answer(request)


def _mcp_answer(request: Any) -> dict[str, Any]:
    if not isinstance(request, dict) or not isinstance(request.get("method"), str):
        rid = request.get("id") if isinstance(request, dict) else None
        return {"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request: 'method' is required"},
                "id": clip(rid)}
    return {"jsonrpc": "2.0", "error": {"code": -32601, "message": f"Method not found: {clip(request['method'])} (this "
                                        "env server plays tools through /step, not MCP)"}, "id": clip(request.get("id"))}


__all__ = ["MAX_ACTION_CHARS", "MAX_DEPTH", "RequestError", "SCHEMAS", "ValidationError", "action_text", "check",
           "clip", "loads", "result"]
