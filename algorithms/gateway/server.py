"""The training gateway: an OpenAI-compatible endpoint in front of our engines that records every
call in tokens, so an agent written with the plain `openai` client can be trained here.

    agent-envs gateway --model tiny --engine hf --port 8200

The agent points `base_url` at `http://127.0.0.1:8200/s/<session>/v1` (or at `/v1` with the
session as its API key) and calls `chat.completions.create` as usual. Every call's prompt and
completion token ids are kept exactly as sampled (`algorithms.gateway.sessions`); a reward is
posted per session (`POST /sessions/<id>/reward {"reward": 1.0}`) or computed by one of our
envs' graders (`{"env": "AgentMath-v0", "index": 3}`). `GET /sessions/<id>` shows the stitched
trajectories, `GET /drift` every call that broke its session's prefix. Learners train from
rewarded sessions with `rollout_source: gateway` (docs/interop.md).

    >>> import asyncio, json, urllib.request
    >>> from algorithms.models.tiny import build_tiny_model
    >>> from algorithms.rollout import HFEngine
    >>> async def main():
    ...     gateway = Gateway(HFEngine(build_tiny_model()), model_name="tiny")
    ...     url = await gateway.start(port=0)
    ...     body = {"model": "tiny", "messages": [{"role": "user", "content": "2+2"}], "max_tokens": 4}
    ...     req = urllib.request.Request(url + "/s/demo/v1/chat/completions", json.dumps(body).encode(),
    ...                                  {"Content-Type": "application/json"})
    ...     reply = await asyncio.to_thread(lambda: json.load(urllib.request.urlopen(req)))
    ...     await gateway.stop()
    ...     return reply["object"], len(gateway.sessions.get("demo").trajectories)
    >>> asyncio.run(main())
    ('chat.completion', 1)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

from aiohttp import web

from agent_envs.server.serving import AppServer, bind, serve_until_signal
from algorithms.gateway.sessions import Session, SessionLog, StitchedTrajectory
from algorithms.rollout.engine import SamplingParams

_FINISH = {"stop": "stop", "eos": "stop", "length": "length"}
_SAMPLING_KEYS = {"temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "stop", "seed", "n",
                  "logprobs", "top_logprobs"}


class BadRequest(ValueError):
    """A request the gateway refuses with 400 and this message."""


def _json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


def sampling_params(body: dict[str, Any]) -> SamplingParams:
    """The request's sampling fields as our `SamplingParams` (OpenAI's defaults where absent)."""
    if body.get("n", 1) != 1:
        raise BadRequest("n must be 1: each call continues one trajectory (send n requests for n samples)")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 256))
    try:
        return SamplingParams(
            temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
            top_k=int(body.get("top_k", -1)), max_tokens=int(max_tokens), stop=list(stop),
            seed=body.get("seed"), logprobs=int(body.get("top_logprobs") or 0),
        )
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"bad sampling field: {exc}") from None


def _template_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages as HF chat templates expect them (tool-call arguments as dicts)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise BadRequest(f"messages[{i}] must be an object with a role")
        m = dict(m)
        if isinstance(m.get("content"), list):  # content parts: keep the text ones
            m["content"] = "".join(p.get("text", "") for p in m["content"] if isinstance(p, dict))
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = dict(c.get("function", {}))
                if isinstance(fn.get("arguments"), str):
                    with contextlib.suppress(json.JSONDecodeError):
                        fn["arguments"] = json.loads(fn["arguments"])
                calls.append({**c, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


class Gateway(AppServer):
    """The aiohttp app: chat and text completions over one engine, recorded per session."""

    def __init__(self, engine: Any, model_name: str = "policy", sessions: SessionLog | None = None,
                 max_response_tokens: int | None = None) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.sessions = sessions or SessionLog()
        self._locks: dict[str, asyncio.Lock] = {}  # one call of a session at a time
        self.gate: Any = None  # training: a `Gate` that holds calls while the learner updates
        self.max_response_tokens = max_response_tokens  # training: a session's token budget
        self.url = ""

    # -- the app ------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        for prefix in ("", "/s/{session}"):
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_post(prefix + "/v1/completions", self._completions)
            app.router.add_get(prefix + "/v1/models", self._models)
        app.router.add_get("/sessions", self._list_sessions)
        app.router.add_get("/sessions/{session}", self._get_session)
        app.router.add_post("/sessions/{session}/reward", self._reward)
        app.router.add_get("/drift", self._drift)
        app.router.add_get("/health", self._health)
        return app

    def forget(self, name: str) -> Session | None:
        """Remove session `name` (and its call lock) and return it: a finished agent run's."""
        self._locks.pop(name, None)
        return self.sessions.pop(name)

    # -- handlers -----------------------------------------------------------------------------

    @staticmethod
    def _session_name(request: web.Request) -> str:
        if "session" in request.match_info:
            return request.match_info["session"]
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        return key or "default"

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequest("the body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    async def _chat(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            messages = _template_messages(body.get("messages"))
            params = sampling_params(body)
            try:
                # vLLM's extension: continue the last assistant message instead of opening a new
                # turn (how an agent keeps a tag-protocol response going after a tool result)
                cont = bool(body.get("continue_final_message", False))
                rendered = self.tokenizer.apply_chat_template(
                    messages, tools=body.get("tools") or None, tokenize=False,
                    add_generation_prompt=bool(body.get("add_generation_prompt", not cont)),
                    continue_final_message=cont)
            except Exception as exc:  # a template that cannot render these messages: the caller's to fix
                raise BadRequest(f"the chat template could not render the messages: {exc}") from None
        except BadRequest as exc:
            return _json_error(400, str(exc))
        session = self.sessions.session(self._session_name(request))
        prompt_ids, text, ids, reason, logprobs = await self._generate(session, rendered, params)
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": _FINISH.get(reason, "stop"), "token_ids": ids}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": self.tokenizer.decode([t]), "logprob": lp}
                                              for t, lp in zip(ids, logprobs, strict=True)]}
        return web.json_response(self._envelope("chat.completion", choice, prompt_ids, len(ids)))

    async def _completions(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise BadRequest("prompt must be a string (one prompt per call)")
            params = sampling_params(body)
        except BadRequest as exc:
            return _json_error(400, str(exc))
        session = self.sessions.session(self._session_name(request))
        prompt_ids, text, ids, reason, _ = await self._generate(session, prompt, params)
        choice = {"index": 0, "text": text, "finish_reason": _FINISH.get(reason, "stop"), "token_ids": ids}
        return web.json_response(self._envelope("text_completion", choice, prompt_ids, len(ids)))

    def _envelope(self, kind: str, choice: dict[str, Any], prompt_ids: list[int], n_out: int) -> dict[str, Any]:
        return {"id": f"gw-{uuid.uuid4().hex[:12]}", "object": kind, "created": int(time.time()),
                "model": self.model_name, "choices": [choice], "prompt_token_ids": prompt_ids,
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": n_out,
                          "total_tokens": len(prompt_ids) + n_out}}

    async def _generate(self, session: Session, rendered: str, params: SamplingParams
                        ) -> tuple[list[int], str, list[int], str, list[float]]:
        """Stitch, generate from the exact ids, record; one call of a session at a time."""
        def tokenize(text: str) -> list[int]:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

        async with self._locks.setdefault(session.name, asyncio.Lock()):
            if self.gate is not None:
                await asyncio.to_thread(self.gate.enter)
            try:
                traj, ids = session.prompt_ids(rendered, tokenize)
                ids = list(ids)
                if self.max_response_tokens is not None:  # what is left of the session's budget
                    left = max(0, self.max_response_tokens - len(traj.response_ids))
                    params = params.with_(max_tokens=min(params.max_tokens, left))
                [seg] = await self.engine.agenerate([ids], params)
                sampled = list(seg.token_ids)
                # the exact text of the sampled ids, special tokens included: the next call's rendered
                # prompt must start with it to continue this branch
                raw = self.tokenizer.decode(sampled, skip_special_tokens=False, clean_up_tokenization_spaces=False)
                session.record(traj, ids, sampled, seg.logprobs, raw, seg.finish_reason)
            finally:  # after the record: a closed gate means every call so far is in its session
                if self.gate is not None:
                    self.gate.leave()
        text = self.tokenizer.decode(sampled, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        return ids, text, sampled, seg.finish_reason, list(seg.logprobs)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def _list_sessions(self, request: web.Request) -> web.Response:
        out = []
        for name in self.sessions.names():
            s = self.sessions.get(name)
            if s is not None:
                out.append({"session": name, "calls": s.calls, "branches": len(s.trajectories),
                            "reward": s.reward, "drift": len(s.drift)})
        return web.json_response({"sessions": out})

    async def _get_session(self, request: web.Request) -> web.Response:
        session = self.sessions.get(request.match_info["session"])
        if session is None:
            return _json_error(404, f"no session {request.match_info['session']!r}")
        return web.json_response(session.summary())

    async def _drift(self, request: web.Request) -> web.Response:
        return web.json_response({"drift": self.sessions.drift_report()})

    async def _reward(self, request: web.Request) -> web.Response:
        name = request.match_info["session"]
        try:
            body = await self._body(request)
            session = self.sessions.get(name)
            if session is None or not session.trajectories:
                return _json_error(404, f"no session {name!r} with calls; reward a session after its calls")
            if "reward" in body:
                try:
                    reward, components = float(body["reward"]), dict(body.get("components") or {})
                except (TypeError, ValueError):
                    raise BadRequest("reward must be a number") from None
            elif "env" in body:
                reward, components = await asyncio.to_thread(grade_with_env, session.trajectories[-1],
                                                             self.tokenizer, body)
            else:
                raise BadRequest('give {"reward": number} or {"env": id, "index": task index}')
        except BadRequest as exc:
            return _json_error(400, str(exc))
        group = body.get("group")
        self.sessions.set_reward(name, reward, components, None if group is None else str(group))
        return web.json_response({"session": name, "reward": reward, "components": components})


def grade_with_env(traj: StitchedTrajectory, tokenizer: Any, body: dict[str, Any]) -> tuple[float, dict]:
    """Score a session's last answer with one of our envs' graders: the env's task `index`, the
    answer taken from the last sampled segment (the agent's final message)."""
    import gymnasium as gym

    import agent_envs  # noqa: F401  (registers the ids)

    try:
        env = gym.make(str(body["env"]), **dict(body.get("env_kwargs") or {}))
    except gym.error.Error as exc:
        raise BadRequest(f"env {body['env']!r}: {exc}") from None
    index = body.get("index")
    if not isinstance(index, int):
        raise BadRequest("index must be the env's task index (an integer)")
    start = traj.segment_starts[-1] if traj.segment_starts else 0
    answer = tokenizer.decode(traj.response_ids[start:], skip_special_tokens=True)
    try:
        env.reset(seed=0, options={"index": index})
        _, reward, _, _, info = env.step(answer)
    except IndexError as exc:
        raise BadRequest(str(exc)) from None
    finally:
        env.close()
    scalars = {k: v for k, v in info.items() if isinstance(v, (int, float, str, bool)) or v is None}
    return float(reward), scalars


def _serve(args: argparse.Namespace) -> int:
    from algorithms.models.resolve import resolve_model
    from algorithms.rollout.engines import make_engine

    sock = bind(args.host, args.port)  # the port first: one in use is said at once, not after the model loads
    folder = resolve_model(args.model)
    engine = make_engine(args.engine, folder, tokenizer=folder, base_url=args.base_url)
    serve_until_signal(Gateway(engine, model_name=args.model), args.host, sock, lambda url: (
        f"gateway: {url}/s/<session>/v1 (OpenAI-compatible); rewards: POST {url}/sessions/<id>/reward"))
    return 0


def add_cli(subparsers: Any) -> None:
    """Register `gateway` on the package CLI."""
    from agent_envs.server.serving import port_number

    p = subparsers.add_parser("gateway", help="OpenAI-compatible endpoint that records calls for training",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="model name or folder (default: tiny)")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm", "vllm-server"],
                   help="rollout engine behind the gateway (default: hf)")
    p.add_argument("--base-url", default=None, help="for --engine vllm-server: the server's /v1 address")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8200, help="port to listen on (default: 8200)")
    p.set_defaults(func=_serve)


__all__ = ["BadRequest", "Gateway", "add_cli", "grade_with_env", "sampling_params"]
