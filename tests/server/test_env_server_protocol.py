"""The env server against OpenEnv's documented protocol, spoken by raw clients (aiohttp
WebSocket, urllib), not by our `RemoteEnv`: a whole AgentMath-v0 episode over `/ws` on the task's
gold trace, the HTTP endpoints' shapes, and malformed payloads answered with 4xx and a reason.

Shapes checked here are those of `openenv-core` 0.3: reset/step answer `{observation, reward,
done}`; `/ws` messages `{"type": "reset"|"step"|"state"|"close", "data": ...}` are answered
`{"type": "observation"|"state"|"error", "data": ...}`; errors carry `message` and `code`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
import pytest
from env_server_helpers import call, gold_episode, serving, strict_json

from agent_envs.server.env_wire import MAX_ACTION_CHARS, MAX_DEPTH

OPENENV_METADATA_FIELDS = {"name", "description", "readme_content", "version", "author", "documentation_url"}


@pytest.fixture(scope="module")
def server():
    with serving("AgentMath-v0") as (url, srv):
        yield url, srv


async def _ws(url: str, http: aiohttp.ClientSession) -> aiohttp.ClientWebSocketResponse:
    return await http.ws_connect(url.replace("http://", "ws://") + "/ws")


async def test_openenv_ws_client_plays_the_gold_trace_to_reward_1(server):
    url, srv = server
    task_id, gold = gold_episode("AgentMath-v0", seed=7)
    assert len(gold) >= 2, "the gold trace calls the python tool before answering"
    async with aiohttp.ClientSession() as http, await _ws(url, http) as ws:
        await ws.send_json({"type": "reset", "data": {"seed": 7, "episode_id": "ep-7"}})
        msg = await ws.receive_json()
        assert msg["type"] == "observation" and set(msg["data"]) == {"observation", "reward", "done", "metadata"}
        assert msg["data"]["metadata"] == {"episode_id": "ep-7", "step_count": 0, "env_id": "AgentMath-v0",
                                           "task_id": task_id, "done": False, "tool_calls": 0}
        assert msg["data"]["reward"] is None and msg["data"]["done"] is False
        first = msg["data"]["observation"]
        assert first["info"]["task_id"] == task_id and first["text"].startswith("<|im_start|>system")
        for k, action in enumerate(gold, 1):
            await ws.send_json({"type": "step", "data": {"message": action}})
            msg = await ws.receive_json()
            assert msg["type"] == "observation", msg
            result = msg["data"]
            if k < len(gold):  # a tool result to append, no reward yet
                assert result["done"] is False and result["reward"] == 0.0
                assert "<result>" in result["observation"]["text"]
        assert result["done"] is True and result["reward"] == 1.0
        assert result["metadata"]["step_count"] == len(gold) and result["metadata"]["done"] is True
        assert result["observation"]["terminated"] is True and result["observation"]["info"]["correct"] == 1.0
        await ws.send_json({"type": "state"})
        state = await ws.receive_json()
        assert state["type"] == "state"
        assert state["data"]["episode_id"] == "ep-7" and state["data"]["step_count"] == len(gold)
        assert len(srv.sessions) == 1
        await ws.send_json({"type": "close"})
        closing = await ws.receive()
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
    assert srv.sessions == {}, "a closed connection frees its session"


async def test_ws_errors_have_openenv_codes_and_the_connection_survives(server):
    url, _ = server
    async with aiohttp.ClientSession() as http, await _ws(url, http) as ws:
        cases = [
            ("{not json", "INVALID_JSON", "Invalid JSON"),
            ('{"type": "dance"}', "UNKNOWN_TYPE", "dance"),
            ('{"type": "step", "data": {"message": "x"}}', "EXECUTION_ERROR", "reset"),  # step before reset
            ('{"type": "step", "data": {"message": 3}}', "VALIDATION_ERROR", "Invalid message"),
            ('{"type": "step", "data": {"message": "x", "temperature": 1}}', "VALIDATION_ERROR", "Invalid message"),
            ('{"type": "step"}', "VALIDATION_ERROR", "Invalid message"),
            ('{"type": "reset", "data": {"seed": "zero"}}', "VALIDATION_ERROR", "Invalid message"),
            ('{"type": "state", "data": {}}', "VALIDATION_ERROR", "Invalid message"),
        ]
        for raw, code, words in cases:
            await ws.send_str(raw)
            msg = await ws.receive_json()
            assert msg["type"] == "error" and msg["data"]["code"] == code, (raw, msg)
            assert words in msg["data"]["message"], (raw, msg)
        await ws.send_json({"type": "step", "data": {"message": "x", "temperature": 1}})
        errors = (await ws.receive_json())["data"]["errors"]
        assert errors[0]["type"] == "extra_forbidden" and errors[0]["loc"] == ["data", "temperature"]
        await ws.send_json({"type": "reset", "data": {"seed": 1}})
        assert (await ws.receive_json())["type"] == "observation", "the session still plays after the errors"


async def test_ws_attaches_to_an_http_session_which_outlives_the_connection(server):
    url, srv = server
    sid = call("POST", url + "/sessions", {})[1]["session_id"]
    assert call("POST", f"{url}/sessions/{sid}/reset", {"seed": 0})[0] == 200
    ws_url = url.replace("http://", "ws://") + "/ws?session_id="
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url + sid) as ws:
            await ws.send_json({"type": "step", "data": {"message": "<think> x </think> <python>print(6 * 7)</python>"}})
            msg = await ws.receive_json()
            assert msg["type"] == "observation" and "42" in msg["data"]["observation"]["text"], msg
            async with http.ws_connect(ws_url + sid) as second:  # one connection at a time
                refused = await second.receive_json()
                assert refused["data"]["code"] == "SESSION_ERROR" and "already has" in refused["data"]["message"]
            await ws.send_json({"type": "close"})
            await ws.receive()
        async with http.ws_connect(ws_url + "nope") as unknown:
            refused = await unknown.receive_json()
            assert refused["data"]["code"] == "SESSION_ERROR" and "unknown session 'nope'" in refused["data"]["message"]
            assert (await unknown.receive()).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert sid in srv.sessions and srv.sessions[sid].ws is None, "an attached session outlives its connection"
    status, state, _ = call("GET", f"{url}/sessions/{sid}/state")
    assert status == 200 and state["step_count"] == 1, state
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url + sid) as ws:
        assert call("DELETE", f"{url}/sessions/{sid}")[0] == 200  # while a connection is attached
        ended = await ws.receive_json()
        assert ended["data"]["code"] == "SESSION_ERROR" and "deleted" in ended["data"]["message"], ended
    assert sid not in srv.sessions


def test_http_endpoints_answer_with_openenv_shapes(server):
    url, _ = server
    assert call("GET", url + "/health")[:2] == (200, {"status": "healthy"})
    status, meta, _ = call("GET", url + "/metadata")
    assert status == 200 and set(meta) == OPENENV_METADATA_FIELDS and meta["name"] == "AgentMath-v0"
    assert isinstance(meta["description"], str) and "arithmetic" in meta["description"]
    status, schema, _ = call("GET", url + "/schema")
    assert status == 200 and set(schema) == {"action", "observation", "reset_observation", "state"}
    assert schema["reset_observation"] == schema["observation"]
    assert schema["action"]["required"] == ["message"] and schema["action"]["additionalProperties"] is False
    assert {"text", "terminated", "truncated", "info"} <= set(schema["observation"]["properties"])
    assert {"episode_id", "step_count"} <= set(schema["state"]["properties"])
    status, reset, _ = call("POST", url + "/reset", {"seed": 3})
    assert status == 200 and set(reset) == {"observation", "reward", "done", "metadata"} and reset["done"] is False
    assert call("POST", url + "/reset", raw=b"")[0] == 200, "OpenEnv's reset body is optional"
    status, state, _ = call("GET", url + "/state")
    assert status == 200 and state["episode_id"] is None and state["step_count"] == 0
    # OpenEnv's HTTP step builds a fresh env: ours says where episodes are played instead
    status, answer, _ = call("POST", url + "/step", {"action": {"message": "<answer> 1 </answer>"}})
    assert status == 409 and "/ws" in answer["detail"] and "/sessions" in answer["detail"]
    status, openapi, _ = call("GET", url + "/openapi.json")
    assert status == 200 and openapi["info"]["version"].startswith("1."), "OpenEnv's validator reads 1.x as its profile"
    assert {"/reset", "/step", "/state", "/ws"} <= set(openapi["paths"])
    status, rpc, _ = call("POST", url + "/mcp", {})
    assert status == 200 and rpc["jsonrpc"] == "2.0" and rpc["error"]["code"] == -32600


MALFORMED = [
    # (method, path, raw body, status, words in the reason)
    ("POST", "/step", b"{oops", 422, "JSON decode error"),
    ("POST", "/step", b'{"action": {"message": 7}}', 422, "valid string"),
    ("POST", "/step", b'{"action": {"message": "x", "tool": "python"}}', 422, "Extra inputs"),
    ("POST", "/step", b'{"action": {"message": "x"}, "timeout_s": 0}', 422, "greater than 0"),
    ("POST", "/step", b"[1, 2]", 422, "object"),
    ("POST", "/reset", b'{"seed": -1}', 422, "greater than or equal to 0"),
    ("POST", "/reset", b'{"seed": true}', 422, "valid integer"),
    ("POST", "/reset", b'{"options": {"index": 10000000}}', 422, "out of range"),
    ("POST", "/reset", b'{"options": {"task": "mine"}}', 422, "only 'index'"),
    ("POST", "/sessions", b'{"env_kwargs": {"max_tool_calz": 1}}', 422, "max_tool_calz"),
    ("POST", "/sessions/nope/step", b'{"action": {"message": "x"}}', 404, "unknown session 'nope'"),
    # {sid}: a live session in mid-episode, so only the checks stand between the body and its env
    ("POST", "/sessions/{sid}/step", b'{"action": {"message": "x"}, "mood": 1}', 422, "Extra inputs"),
    ("POST", "/sessions/{sid}/step", b'{"action": {"message": 7}}', 422, "valid string"),
    ("POST", "/sessions/{sid}/step", b'{"action": {"message": "x"}, "timeout_s": "soon"}', 422,
     "valid integer or number"),
    ("GET", "/sessions/nope/state", None, 404, "POST /sessions"),
    ("DELETE", "/sessions/nope", None, 404, "unknown session"),
    ("POST", "/sessions/step", b'{"steps": "all"}', 422, "valid array"),
    ("POST", "/sessions/nope/rewind", b'{"step_count": "one"}', 422, "valid integer"),
    ("GET", "/no/such/path", None, 404, "Not Found"),
    ("GET", "/step", None, 405, "Method Not Allowed"),
    # hostile input: non-finite numbers (JSON has none), integers past Python's digit limit
    ("POST", "/sessions/{sid}/step", b'{"action": {"message": "x"}, "timeout_s": NaN}', 422, "NaN is not a JSON number"),
    ("POST", "/sessions/{sid}/step", b'{"action": {"message": "x"}, "timeout_s": Infinity}', 422, "Infinity is not"),
    ("POST", "/sessions/{sid}/step", b'{"action": {"message": "x"}, "timeout_s": -Infinity}', 422, "-Infinity is not"),
    ("POST", "/sessions/{sid}/step", b'{"action": {"message": "x"}, "timeout_s": 1e999}', 422, "beyond a float"),
    ("POST", "/sessions/step", b'{"steps": [], "timeout_s": NaN}', 422, "NaN is not a JSON number"),
    ("POST", "/step", b'{"action": {"message": "x"}, "timeout_s": Infinity}', 422, "Infinity is not"),
    ("POST", "/reset", b'{"seed": NaN}', 422, "NaN is not a JSON number"),
    ("POST", "/reset", b'{"seed": ' + b"9" * 5000 + b"}", 422, "digits"),
    ("POST", "/mcp", b'{"jsonrpc": "2.0", "id": NaN, "method": "tools/list"}', 400, "NaN is not a JSON number"),
    # oversized fields: refused with a reason that quotes them cut, never whole
    ("POST", "/sessions/{sid}/step", b'{"action": {"message": "' + b"x" * 5_000_000 + b'"}}', 422,
     f"at most {MAX_ACTION_CHARS} characters"),
    ("POST", "/step", b'{"action": {"message": "' + b"x" * 5_000_000 + b'"}}', 422, "truncated: 5000000 characters"),
    ("POST", "/sessions/{sid}/step", b'{"action": {"message": "x"}, "mood": "' + b"x" * 5_000_000 + b'"}', 422,
     "Extra inputs"),
    ("POST", "/sessions/{sid}/step", b'{"action": {"message": "x"}, "request_id": "' + b"r" * 100_000 + b'"}', 422,
     "at most 255"),
    ("POST", "/sessions/{sid}/reset", b'{"episode_id": "' + b"e" * 100_000 + b'"}', 422, "at most 255"),
    ("POST", "/sessions/{sid}/truncate", b'{"why": "' + b"w" * 100_000 + b'"}', 422, "at most 255"),
    ("POST", "/sessions", b'{"env_kwargs": {"max_tool_calls": "' + b"9" * 100_000 + b'"}}', 422, "truncated"),
    ("POST", "/mcp", b'{"jsonrpc": "2.0", "id": 1, "method": "' + b"m" * 100_000 + b'"}', 200, "truncated"),
]
# a 2 KB body nested 1,000 deep on every endpoint that reads JSON (past the decoder's own recursion
# limit), and 40 deep inside a field (past ours, under the decoder's)
DEEP = b"[" * 1000 + b"]" * 1000
NESTED_FIELD = b'{"action": {"message": "x", "metadata": ' + b'{"a": ' * 40 + b"1" + b"}" * 40 + b"}}"
JSON_ENDPOINTS = ["/reset", "/step", "/mcp", "/sessions", "/sessions/step", "/sessions/{sid}/reset",
                  "/sessions/{sid}/step", "/sessions/{sid}/fork", "/sessions/{sid}/rewind", "/sessions/{sid}/truncate"]
MALFORMED += [("POST", path, DEEP, 400 if path == "/mcp" else 422, f"nested deeper than {MAX_DEPTH} levels")
              for path in JSON_ENDPOINTS]
MALFORMED += [("POST", path, NESTED_FIELD, 422, f"nested deeper than {MAX_DEPTH}")
              for path in ("/step", "/sessions/{sid}/step")]


@pytest.mark.parametrize(("method", "path", "raw", "status", "words"), MALFORMED,
                         ids=[f"{m} {p} {(r or b'')[:40]!r}" for m, p, r, _, _ in MALFORMED])
def test_malformed_requests_get_a_4xx_with_a_reason_and_the_server_lives_on(server, live_session, method, path,
                                                                             raw, status, words):
    url, srv = server
    if "{sid}" in path:
        path = path.format(sid=live_session)
    sessions = set(srv.sessions)
    got, answer, _ = call(method, url + path, raw=raw)
    assert got == status, str(answer)[:2000]
    reason = answer["detail"] if "detail" in answer else answer["error"]  # /mcp answers in JSON-RPC
    assert words in str(reason), str(answer)[:2000]
    assert len(json.dumps(answer)) < 10_000, "an answer quotes a request's values cut, never whole"
    assert set(srv.sessions) == sessions, "a refused request leaves no session behind"
    assert call("GET", url + "/health")[0] == 200


async def test_a_ws_message_over_the_size_limit_closes_with_code_1009_and_frees_the_session(server):
    url, srv = server
    async with aiohttp.ClientSession() as http, await _ws(url, http) as ws:
        closing = asyncio.create_task(ws.receive())
        with contextlib.suppress(ConnectionError):  # the server may close while the frame is still going out
            await ws.send_str('{"type": "step", "data": {"message": "' + "x" * (65 * 1024 * 1024) + '"}}')
        frame = await closing
    assert (frame.type, frame.data) == (aiohttp.WSMsgType.CLOSE, aiohttp.WSCloseCode.MESSAGE_TOO_BIG)
    deadline = time.monotonic() + 10
    while srv.sessions and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert srv.sessions == {}
    status, answer, _ = call("POST", url + "/reset", raw=b'{"seed": "' + b"1" * (65 * 1024 * 1024) + b'"}')
    assert status == 413 and "Too Large" in answer["detail"], answer


def test_a_refused_fork_leaves_no_session_behind():
    with serving("AgentMath-v0", max_sessions=3) as (url, srv):
        sid = call("POST", url + "/sessions", {})[1]["session_id"]
        assert call("POST", f"{url}/sessions/{sid}/reset", {"seed": 0})[0] == 200
        for _ in range(3):  # more bad forks than the server has room for
            status, answer, _ = call("POST", f"{url}/sessions/{sid}/fork", {"step_count": 5})
            assert status == 422 and "step_count=5 is not a step" in answer["detail"], answer
        assert list(srv.sessions) == [sid]
        forks = [call("POST", f"{url}/sessions/{sid}/fork", {"step_count": 0}) for _ in range(2)]
        assert [status for status, _, _ in forks] == [201, 201], "the room is still there for good forks"
        assert call("POST", f"{url}/sessions/{sid}/fork", {})[0] == 503


async def test_ws_hostile_messages_get_an_error_frame_and_the_socket_plays_on(server):
    url, srv = server
    cases = [
        (DEEP.decode(), "INVALID_JSON", f"nested deeper than {MAX_DEPTH} levels"),
        ('{"type": "reset", "data": {"options": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}}", "INVALID_JSON",
         "nested deeper"),
        ('{"type": "reset", "data": {"seed": NaN}}', "INVALID_JSON", "NaN is not a JSON number"),
        ('{"type": "reset", "data": {"seed": 1e999}}', "INVALID_JSON", "beyond a float"),
        ('{"type": "' + "t" * 1_000_000 + '"}', "UNKNOWN_TYPE", "truncated: 1000000 characters"),
        ('{"type": "step", "data": {"message": "' + "x" * 5_000_000 + '"}}', "VALIDATION_ERROR", "Invalid message"),
    ]
    async with aiohttp.ClientSession() as http, await _ws(url, http) as ws:
        for raw, code, words in cases:
            await ws.send_str(raw)
            frame = await ws.receive()
            assert frame.type == aiohttp.WSMsgType.TEXT, (raw[:80], frame)
            assert len(frame.data) < 10_000, "an error frame quotes a message cut, never whole"
            msg = strict_json(frame.data)
            assert msg["type"] == "error" and msg["data"]["code"] == code, (raw[:80], msg)
            assert words in json.dumps(msg["data"]), (raw[:80], msg)
        assert msg["data"]["errors"][0]["type"] == "string_too_long", msg
        assert len(srv.sessions) == 1
        await ws.send_json({"type": "reset", "data": {"seed": 1}})
        assert (await ws.receive_json())["type"] == "observation", "the socket still plays after the errors"


@pytest.fixture
def live_session(server):
    """A session in mid-episode (reset), deleted afterwards."""
    url, _ = server
    status, opened, _ = call("POST", url + "/sessions", {})
    assert status == 201, opened
    sid = opened["session_id"]
    assert call("POST", f"{url}/sessions/{sid}/reset", {"seed": 0})[0] == 200
    yield sid
    call("DELETE", f"{url}/sessions/{sid}")


BAD_BATCH_ITEMS = [
    # (item, words in its reason); {sid} is a live session in mid-episode
    ({"session_id": "{sid}", "action": {"message": "x"}, "mood": 1}, "Extra inputs"),
    (7, "object"),
    (["{sid}", {"message": "x"}], "object"),
    ({"session_id": 7, "action": {"message": "x"}}, "valid string"),
]


@pytest.mark.parametrize(("item", "words"), BAD_BATCH_ITEMS, ids=[repr(i)[:40] for i, _ in BAD_BATCH_ITEMS])
def test_a_malformed_batch_item_gets_a_422_with_a_reason_and_fails_alone(server, live_session, item, words):
    url, sid = server[0], live_session
    bad = json.loads(json.dumps(item).replace("{sid}", sid))
    good = {"session_id": sid, "action": {"message": "<think> x </think> <python>print(6 * 7)</python>"}}
    status, answer, _ = call("POST", url + "/sessions/step", {"steps": [bad, good]})
    assert status == 200, answer
    failed, stepped = answer["results"]
    assert failed["error"]["status"] == 422 and words in str(failed["error"]["detail"]), failed
    assert "error" not in stepped and "42" in stepped["observation"]["text"], stepped
