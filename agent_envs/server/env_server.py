"""The env server: any registered env id over OpenEnv's HTTP and WebSocket protocol, plus
stateful HTTP sessions that fork, rewind and step in batches.

    agent-envs serve-env AgentMath-v0 max_tool_calls=2 --port 8000    # also writes ./openenv.yaml

OpenEnv's side (docs/interop.md): `POST /reset`, `POST /step`, `GET /state`, `/metadata`,
`/health`, `/schema`, `/openapi.json`, and the `/ws` session (one env per connection, or
`/ws?session_id=ID` on one of our sessions; messages `{"type": "reset" | "step" | "state" |
"close", "data": ...}`). An action is `{"message": str}`
(what OpenEnv's text envs take); an observation is `{"text", "terminated", "truncated", "info"}`
with the reward computed here. Our side: `POST /sessions` gives an id for `POST
/sessions/{id}/reset | step | fork | rewind | truncate`, `GET /sessions/{id}/state` and `DELETE
/sessions/{id}`; `POST /sessions/step` steps many sessions at once. Sessions are bounded in
number (503 beyond) and freed after `idle_timeout_s` without a request.

    >>> import asyncio, json, urllib.request
    >>> async def main():
    ...     server = EnvServer("AgentMath-v0")
    ...     url = await server.start(port=0)
    ...     get = lambda path: json.load(urllib.request.urlopen(url + path))
    ...     health, schema = await asyncio.to_thread(get, "/health"), await asyncio.to_thread(get, "/schema")
    ...     await server.stop()
    ...     return health, sorted(schema["action"]["properties"])
    >>> asyncio.run(main())
    ({'status': 'healthy'}, ['message', 'metadata'])
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
from aiohttp import WSMsgType, web

from agent_envs.server import env_wire as wire
from agent_envs.server.serving import AppServer, bind, serve_until_signal

log = logging.getLogger(__name__)

# no step answered yet (see `Session.last_reply`)
_NO_REPLY: tuple[str | None, dict | None] = (None, None)


@dataclass
class Session:
    """One live env and where its episode stands."""

    id: str
    env: Any  # a ToolEnv (unwrapped)
    kind: str  # "http" or "ws"
    episode_id: str | None = None
    step_count: int = 0
    done: bool = False
    task_id: str | None = None
    tool_calls: int = 0
    # (env.get_state(), done, tool_calls) after reset and after every step: rewind and fork target
    history: list[tuple[Any, bool, int]] = field(default_factory=list)
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    # (request_id, answer) of the last step: a step retried after a lost answer is not played twice
    last_reply: tuple[str | None, dict | None] = _NO_REPLY
    ws: web.WebSocketResponse | None = None

    def state(self, env_id: str) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "step_count": self.step_count, "env_id": env_id,
                "task_id": self.task_id, "done": self.done, "tool_calls": self.tool_calls}


class EnvServer(AppServer):
    """An aiohttp app serving one registered env id.

    Args:
        env_id: a registered id (`agent-envs list`).
        env_kwargs: `gym.make` keyword arguments of every session; a client may add its own
            (`POST /sessions {"env_kwargs": ...}`), which win.
        max_sessions: sessions alive at once, WebSocket connections included; more get 503.
        idle_timeout_s: a session without a request for this long is closed (None: never).
        max_batch: most steps in one `POST /sessions/step`.
    """

    backlog = 4096  # a burst of rollout workers connecting at once (see the retrieval server)

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None = None, *, max_sessions: int = 1024,
                 idle_timeout_s: float | None = 600.0, max_batch: int = 4096) -> None:
        from agent_envs.envs import check_env_id

        env_id = check_env_id(env_id, key="env_id")  # a MODULE:ID imports MODULE; names the closest id
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.max_batch = max_batch
        self.sessions: dict[str, Session] = {}
        self.expired: collections.OrderedDict[str, str] = collections.OrderedDict()  # id -> why
        # one template env per kwargs; sessions are its forks (cheap, independent episodes)
        self._templates: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self.template = self._template({})
        self.stats = {"sessions_opened": 0, "sessions_expired": 0, "steps": 0, "rejected": 0}
        self._reaper: asyncio.Task | None = None

    # -- envs and sessions --------------------------------------------------------------------------

    def _template(self, extra: dict[str, Any]) -> Any:
        key = json.dumps(extra, sort_keys=True, default=str)
        env = self._templates.get(key)
        if env is None:
            kwargs = {**self.env_kwargs, **extra}
            try:
                env = gym.make(self.env_id, **kwargs).unwrapped
            except Exception as exc:  # a bad keyword or value: the person fixes the kwargs
                raise wire.RequestError(422, f"{self.env_id} with env_kwargs {kwargs}: "
                                             f"{type(exc).__name__}: {exc}") from None
            self._templates[key] = env
            if len(self._templates) > 16:
                self._templates.popitem(last=False)
        return env

    def _open(self, kind: str, env_kwargs: dict[str, Any] | None = None, env: Any = None) -> Session:
        """A new session on a fresh env (a fork of the template), or on `env` (a fork of another)."""
        if len(self.sessions) >= self.max_sessions:
            self.stats["rejected"] += 1
            raise wire.RequestError(503, f"server at capacity: {len(self.sessions)}/{self.max_sessions} sessions "
                                         "active; close sessions (DELETE /sessions/{id}) or restart with a "
                                         "larger --max-sessions")
        if env is None:
            env = self._template(env_kwargs or {}).fork()
        session = Session(uuid.uuid4().hex, env, kind)
        self.sessions[session.id] = session
        self.stats["sessions_opened"] += 1
        return session

    def _close(self, session_id: str, why: str) -> Session | None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self.expired[session_id] = why
            while len(self.expired) > 4096:
                self.expired.popitem(last=False)
        return session

    def _get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            why = self.expired.get(session_id)
            gone = f" ({why})" if why else " (never opened here, or the server restarted)"
            raise wire.RequestError(404, f"unknown session {session_id!r}{gone}; open one with POST /sessions")
        session.last_used = time.monotonic()
        return session

    async def _reap(self) -> None:
        """Close sessions idle for longer than `idle_timeout_s`."""
        assert self.idle_timeout_s is not None
        while True:
            await asyncio.sleep(min(max(self.idle_timeout_s / 4, 0.05), 5.0))
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if not session.busy and now - session.last_used > self.idle_timeout_s:
                    self._close(session.id, f"closed after {self.idle_timeout_s:g} s without a request")
                    self.stats["sessions_expired"] += 1
                    if session.ws is not None:
                        with contextlib.suppress(Exception):
                            await session.ws.send_str(wire.ws_error("SESSION_ERROR", "session closed: idle for "
                                                                    f"more than {self.idle_timeout_s:g} s"))
                            await session.ws.close()

    # -- the episode operations (shared by /ws and /sessions) --------------------------------------

    async def _reset(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        seed, options = body.get("seed"), body.get("options")
        if session.busy:
            raise wire.RequestError(409, f"session {session.id}: a step is in flight; wait for its answer")
        try:
            text, info = session.env.reset(seed=seed, options=options)
        except (IndexError, ValueError, TypeError) as exc:
            raise wire.RequestError(422, f"reset: {exc}") from None
        session.episode_id = body.get("episode_id") or uuid.uuid4().hex
        session.step_count, session.done, session.tool_calls = 0, False, 0
        session.task_id = info.get("task_id")
        session.history = [(session.env.get_state(), False, 0)]
        session.last_reply = _NO_REPLY
        return wire.result(text, None, False, False, info, session.state(self.env_id))

    async def _step(self, session: Session, action: str, timeout_s: float | None = None,
                    request_id: str | None = None) -> dict[str, Any]:
        if request_id is not None and session.last_reply[0] == request_id:
            return session.last_reply[1]  # type: ignore[return-value]
        if session.busy:
            raise wire.RequestError(409, f"session {session.id}: a step is already in flight; wait for its answer")
        session.busy = True
        try:
            step = session.env.astep(action)
            obs, reward, terminated, truncated, info = await (
                asyncio.wait_for(step, timeout_s) if timeout_s else step)
        except TimeoutError:
            raise wire.RequestError(504, f"session {session.id}: the step took longer than timeout_s={timeout_s:g}; "
                                         "the episode is where it was before it") from None
        except RuntimeError as exc:  # the env's own call-order errors: step before reset, after the end
            raise wire.RequestError(409, f"session {session.id}: {exc}") from None
        finally:
            session.busy = False
            session.last_used = time.monotonic()
        self.stats["steps"] += 1
        session.step_count += 1
        session.done = terminated or truncated
        session.tool_calls = int(info.get("tool_calls", session.tool_calls))
        session.history.append((session.env.get_state(), session.done, session.tool_calls))
        reply = wire.result(obs, reward, terminated, truncated, info, session.state(self.env_id))
        session.last_reply = (request_id, reply)
        return reply

    # -- the app ----------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[_errors])
        r = app.router
        r.add_get("/health", self._health)
        r.add_get("/metadata", self._metadata)
        r.add_get("/schema", self._schema)
        r.add_get("/openapi.json", self._openapi)
        r.add_post("/mcp", self._mcp)
        r.add_post("/reset", self._http_reset)
        r.add_post("/step", self._http_step)
        r.add_get("/state", self._http_state)
        r.add_get("/ws", self._ws)
        r.add_get("/info", self._info)
        r.add_post("/sessions", self._open_session)
        r.add_post("/sessions/step", self._batch_step)
        r.add_post("/sessions/{sid}/reset", self._session_reset)
        r.add_post("/sessions/{sid}/step", self._session_step)
        r.add_post("/sessions/{sid}/fork", self._session_fork)
        r.add_post("/sessions/{sid}/rewind", self._session_rewind)
        r.add_post("/sessions/{sid}/truncate", self._session_truncate)
        r.add_get("/sessions/{sid}/state", self._session_state)
        r.add_delete("/sessions/{sid}", self._session_delete)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        if self.idle_timeout_s is not None:
            self._reaper = asyncio.create_task(self._reap())

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for session in list(self.sessions.values()):
            if session.ws is not None:
                with contextlib.suppress(Exception):
                    await session.ws.close()
        self.sessions.clear()
        for env in self._templates.values():  # sessions share their template's tools
            with contextlib.suppress(Exception):
                await env.aclose()

    # OpenEnv's endpoints

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    async def _metadata(self, request: web.Request) -> web.Response:
        return web.json_response(wire.metadata(self.env_id))

    async def _schema(self, request: web.Request) -> web.Response:
        return web.json_response(wire.SCHEMAS)

    async def _openapi(self, request: web.Request) -> web.Response:
        paths = sorted({res.canonical for res in request.app.router.resources()})
        return web.json_response(wire.openapi(self.env_id, paths))

    async def _mcp(self, request: web.Request) -> web.Response:
        status, answer = wire.mcp_reply(await request.read())
        return wire.json(answer, status=status)

    async def _http_reset(self, request: web.Request) -> web.Response:
        """OpenEnv's stateless reset: a fresh env each time, its first observation returned."""
        body = wire.check(await wire.body(request, empty_ok=True), wire.RESET_FIELDS, ("body",))
        return wire.json(await self._reset(Session("stateless", self._template({}).fork(), "http"), body))

    async def _http_step(self, request: web.Request) -> web.Response:
        body = wire.check(await wire.body(request), wire.STEP_FIELDS, ("body",))
        wire.action_text(body["action"], ("body", "action"))
        raise wire.RequestError(409, "POST /step acts on a fresh env (OpenEnv's stateless HTTP), which has no "
                                     "episode to step: play episodes over /ws, or open one with POST /sessions")

    async def _http_state(self, request: web.Request) -> web.Response:
        return web.json_response({"episode_id": None, "step_count": 0, "env_id": self.env_id, "task_id": None,
                                  "done": False, "tool_calls": 0})

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        """One session per connection; `/ws?session_id=ID` attaches the connection to a session
        opened with `POST /sessions` instead (OpenEnv 0.10), which outlives the connection."""
        ws = web.WebSocketResponse(max_msg_size=64 * 1024 * 1024)
        await ws.prepare(request)
        wanted = request.query.get("session_id")
        try:
            session = self._attach(wanted) if wanted else self._open("ws")
        except wire.RequestError as exc:
            if wanted:
                await ws.send_str(wire.ws_error("SESSION_ERROR", exc.detail))
            else:
                await ws.send_str(wire.ws_error("CAPACITY_REACHED", exc.detail, active_sessions=len(self.sessions),
                                                max_sessions=self.max_sessions))
            await ws.close()
            return ws
        session.ws = ws
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    await ws.send_str(wire.ws_error("INVALID_JSON", "messages are JSON text frames"))
                    continue
                reply = await self._ws_message(session, msg.data)
                if reply is None:
                    break
                await ws.send_str(reply)
        finally:
            if wanted:  # an attached session stays open for its other clients
                session.ws = None
            else:
                self._close(session.id, "its WebSocket closed")
            with contextlib.suppress(Exception):
                await ws.close()
        return ws

    def _attach(self, session_id: str) -> Session:
        session = self._get(session_id)
        if session.ws is not None:
            raise wire.RequestError(409, f"session {session_id} already has an attached WebSocket; close it first")
        return session

    async def _ws_message(self, session: Session, raw: str) -> str | None:
        """The answer to one /ws message (None: the client closed the session)."""
        try:
            message = wire.loads(raw, ("message",))
        except wire.ValidationError as exc:
            return wire.ws_error("INVALID_JSON", f"Invalid JSON: {exc.errors[0]['msg']}")
        if not isinstance(message, dict) or message.get("type") not in ("reset", "step", "state", "close"):
            kind = message.get("type", "") if isinstance(message, dict) else message
            return wire.ws_error("UNKNOWN_TYPE", f"Unknown message type: {wire.clip(kind)}; send reset, step, "
                                                 "state or close")
        session.last_used = time.monotonic()
        kind = message["type"]
        try:
            wire.check(message, wire.WS_FIELDS[kind], ())
            if kind == "close":
                return None
            if kind == "state":
                return wire.dumps({"type": "state", "data": session.state(self.env_id)})
            if kind == "reset":
                result = await self._reset(session, wire.check(message.get("data") or {}, wire.RESET_FIELDS, ("data",)))
            else:
                result = await self._step(session, wire.action_text(message["data"], ("data",)))
            return wire.dumps({"type": "observation", "data": result})
        except wire.ValidationError as exc:
            return wire.ws_error("VALIDATION_ERROR", "Invalid message", errors=exc.errors)
        except wire.RequestError as exc:
            return wire.ws_error("EXECUTION_ERROR", exc.detail)
        except Exception as exc:  # an env bug must not end the connection or the server
            log.exception("ws message failed in session %s", session.id)
            return wire.ws_error("EXECUTION_ERROR", f"{type(exc).__name__}: {exc}")

    # our sessions

    async def _info(self, request: web.Request) -> web.Response:
        return wire.json({"env_id": self.env_id, "env_kwargs": self.env_kwargs,
                          "stop_sequences": self.template.stop_sequences, "protocol": wire.PROTOCOL,
                          "sessions": len(self.sessions), "max_sessions": self.max_sessions,
                          "idle_timeout_s": self.idle_timeout_s, "max_batch": self.max_batch, **self.stats})

    async def _open_session(self, request: web.Request) -> web.Response:
        body = wire.check(await wire.body(request, empty_ok=True), {"env_kwargs": ((dict,), False)}, ("body",))
        session = self._open("http", body.get("env_kwargs"))
        return wire.json({"session_id": session.id, "stop_sequences": session.env.stop_sequences}, status=201)

    async def _session_reset(self, request: web.Request) -> web.Response:
        body = wire.check(await wire.body(request, empty_ok=True), wire.RESET_FIELDS, ("body",))
        return wire.json(await self._reset(self._get(request.match_info["sid"]), body))

    async def _session_step(self, request: web.Request) -> web.Response:
        body = wire.check(await wire.body(request), wire.STEP_FIELDS, ("body",))
        text = wire.action_text(body["action"], ("body", "action"))
        session = self._get(request.match_info["sid"])
        return wire.json(await self._step(session, text, body.get("timeout_s"), body.get("request_id")))

    async def _batch_step(self, request: web.Request) -> web.Response:
        """Many sessions stepped concurrently; each item answers for itself (a bad one fails alone)."""
        body = wire.check(await wire.body(request), wire.BATCH_FIELDS, ("body",))
        items = body["steps"]
        if len(items) > self.max_batch:
            raise wire.RequestError(413, f"{len(items)} steps in one batch; this server takes at most {self.max_batch}")

        async def one(i: int, item: Any) -> dict[str, Any]:
            try:
                item = wire.check(item, wire.BATCH_ITEM_FIELDS, ("body", "steps", i))
                text = wire.action_text(item["action"], ("body", "steps", i, "action"))
                session = self._get(item["session_id"])
                return await self._step(session, text, body.get("timeout_s"), item.get("request_id"))
            except wire.ValidationError as exc:
                return {"error": {"status": 422, "detail": exc.errors}}
            except wire.RequestError as exc:
                return {"error": {"status": exc.status, "detail": exc.detail}}

        return wire.json({"results": list(await asyncio.gather(*(one(i, x) for i, x in enumerate(items))))})

    async def _session_fork(self, request: web.Request) -> web.Response:
        body = wire.check(await wire.body(request, empty_ok=True), {"step_count": ((int,), False)}, ("body",))
        parent = self._get(request.match_info["sid"])
        if parent.busy:
            raise wire.RequestError(409, f"session {parent.id}: a step is in flight; fork after its answer")
        if body.get("step_count") is not None:  # checked before the child exists: a refused fork leaves none
            self._check_step(parent, body["step_count"])
        child = self._open("http", env=parent.env.fork())
        for name in ("episode_id", "step_count", "done", "task_id", "tool_calls"):
            setattr(child, name, getattr(parent, name))
        child.history = list(parent.history)
        if body.get("step_count") is not None:
            self._rewind(child, body["step_count"], None)
        return wire.json({"session_id": child.id, "stop_sequences": child.env.stop_sequences, **child.state(self.env_id)},
                         status=201)

    def _rewind(self, session: Session, step_count: int, episode_id: str | None) -> None:
        if episode_id is not None and episode_id != session.episode_id:
            raise wire.RequestError(409, f"session {session.id} plays episode {session.episode_id!r}, not "
                                         f"{episode_id!r}: a state can only be restored within its own episode")
        self._check_step(session, step_count)
        state, done, tool_calls = session.history[step_count]
        session.env.set_state(state)
        session.history = session.history[: step_count + 1]
        session.step_count, session.done, session.tool_calls = step_count, done, tool_calls
        session.last_reply = _NO_REPLY

    @staticmethod
    def _check_step(session: Session, step_count: int) -> None:
        if not 0 <= step_count < len(session.history):
            raise wire.RequestError(422, f"step_count={step_count} is not a step of session {session.id}'s episode "
                                         f"(0..{len(session.history) - 1})")

    async def _session_rewind(self, request: web.Request) -> web.Response:
        body = wire.check(await wire.body(request), {"step_count": ((int,), True), "episode_id": ((str,), False)},
                          ("body",))
        session = self._get(request.match_info["sid"])
        if session.busy:
            raise wire.RequestError(409, f"session {session.id}: a step is in flight; rewind after its answer")
        self._rewind(session, body["step_count"], body.get("episode_id"))
        return wire.json(session.state(self.env_id))

    async def _session_truncate(self, request: web.Request) -> web.Response:
        body = wire.check(await wire.body(request, empty_ok=True), {"why": ((str,), False)}, ("body",))
        session = self._get(request.match_info["sid"])
        try:
            reward, info = session.env.truncate(body.get("why") or "response_budget")
        except RuntimeError as exc:
            raise wire.RequestError(409, f"session {session.id}: {exc}") from None
        session.done = True
        session.history.append((session.env.get_state(), True, session.tool_calls))
        return wire.json(wire.result("", reward, False, True, info, session.state(self.env_id)))

    async def _session_state(self, request: web.Request) -> web.Response:
        return wire.json(self._get(request.match_info["sid"]).state(self.env_id))

    async def _session_delete(self, request: web.Request) -> web.Response:
        session_id = request.match_info["sid"]
        session = self._get(session_id)
        self._close(session_id, "deleted by its client")
        if session.ws is not None:  # a WebSocket attached with /ws?session_id= hears why it ends
            with contextlib.suppress(Exception):
                await session.ws.send_str(wire.ws_error("SESSION_ERROR", f"session {session_id} deleted by a client"))
                await session.ws.close()
        return wire.json({"session_id": session_id, "closed": True})


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure becomes a JSON answer with a reason; nothing reaches the person as a 500 page."""
    try:
        return await handler(request)
    except wire.ValidationError as exc:
        return web.json_response({"detail": exc.errors}, status=422)
    except wire.RequestError as exc:
        headers = {"Retry-After": "1"} if exc.status == 503 else None
        return web.json_response({"detail": exc.detail}, status=exc.status, headers=headers)
    except web.HTTPException as exc:  # aiohttp's own 404 / 405
        if exc.status < 400:
            raise
        return web.json_response({"detail": f"{request.method} {request.path}: {exc.reason}"}, status=exc.status)
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response({"detail": f"internal error: {type(exc).__name__}: {exc}"}, status=500)


# -- command line ----------------------------------------------------------------------------------


def parse_kwargs(items: list[str]) -> dict[str, Any]:
    """`key=value` arguments as typed values (YAML, as the rest of the CLI); dotted keys nest.

    >>> parse_kwargs(["max_tool_calls=2", "world.difficulty=3", "protocol=json"])
    {'max_tool_calls': 2, 'world': {'difficulty': 3}, 'protocol': 'json'}
    """
    from agent_envs.base.config import parse_text

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"env argument {item!r} must look like key=value (e.g. max_tool_calls=2)")
        key, text = item.split("=", 1)
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"env argument {item!r}: {part!r} was given a value and cannot also hold keys")
        node[leaf] = parse_text(None, text)
    return out


def write_openenv_yaml(out_dir: str | Path, env_id: str, port: int, kwargs: list[str]) -> Path:
    """The `openenv.yaml` (spec_version 1) that describes this server to OpenEnv's tooling."""
    path = Path(out_dir) / "openenv.yaml"
    name = env_id.lower().replace("-", "_")
    command = " ".join(["agent-envs", "serve-env", env_id, *kwargs, "--port", str(port)])
    text = (f"spec_version: 1\nname: {name}\ntype: space\nruntime: aiohttp\n"
            f"app: agent_envs.server.env_server:main\nport: {port}\n"
            f"# started by: {command}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def serve(args: argparse.Namespace) -> int:
    """`agent-envs serve-env`: build the env once (errors now, not at the first request), then serve."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        kwargs = parse_kwargs(args.kwargs)
        server = EnvServer(args.env_id, kwargs, max_sessions=args.max_sessions,
                           idle_timeout_s=args.idle_timeout if args.idle_timeout > 0 else None)
    except (ValueError, wire.RequestError) as exc:
        raise SystemExit(f"serve-env: {getattr(exc, 'detail', exc)}") from None
    sock = bind(args.host, args.port, server.backlog)  # before openenv.yaml: a port in use leaves nothing behind
    port = sock.getsockname()[1]  # the one the kernel picked under --port 0
    spec = write_openenv_yaml(args.out, args.env_id, port, args.kwargs)
    serve_until_signal(server, args.host, sock, lambda url: (
        f"serve-env: {args.env_id} on {url} (OpenEnv /ws, /reset, /step; sessions at /sessions; up to "
        f"{args.max_sessions}); wrote {spec}"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m agent_envs.server.env_server ID ...`: what openenv.yaml's `app` names."""
    parser = argparse.ArgumentParser(prog="serve-env")
    _arguments(parser)
    return serve(parser.parse_args(argv))


def _arguments(p: argparse.ArgumentParser) -> None:
    from agent_envs.server.serving import port_number

    p.add_argument("env_id", help="a registered env id (agent-envs list)")
    p.add_argument("kwargs", nargs="*", help="env keyword arguments as key=value, typed as YAML "
                                             "(max_tool_calls=2, world.difficulty=3)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port_number, default=8000)
    p.add_argument("--max-sessions", type=int, default=1024, help="sessions alive at once (503 beyond)")
    p.add_argument("--idle-timeout", type=float, default=600.0,
                   help="seconds without a request after which a session is closed (0: never)")
    p.add_argument("--out", default=".", help="folder where openenv.yaml is written (default: the current folder)")
    p.set_defaults(func=serve)


def add_cli(subparsers: Any) -> None:
    """Register `serve-env` on the package CLI."""
    p = subparsers.add_parser(
        "serve-env",
        help="serve an env id over OpenEnv's HTTP/WebSocket protocol (writes openenv.yaml into --out)",
        description=__doc__.split("\n\n")[0],
    )
    _arguments(p)


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["EnvServer", "Session", "add_cli", "parse_kwargs", "write_openenv_yaml"]
