"""Our sessions beyond OpenEnv: explicit ids over HTTP, fork and rewind of a live episode, batched
steps, bounded sessions (503 beyond), the idle timeout, and 200 sessions at once."""

from __future__ import annotations

import asyncio
import time

from env_server_helpers import call, gold_episode, serving

from agent_envs.remote.env_client import RemoteEnv


def _open(url: str, **body) -> str:
    status, answer, _ = call("POST", url + "/sessions", body)
    assert status == 201, answer
    return answer["session_id"]


def _step(url: str, sid: str, text: str) -> dict:
    status, answer, _ = call("POST", f"{url}/sessions/{sid}/step", {"action": {"message": text}})
    assert status == 200, answer
    return answer


def test_fork_and_rewind_branch_a_live_episode():
    task_id, gold = gold_episode("AgentMath-v0", seed=4)
    call_tool, answer = gold[0], gold[-1]
    with serving("AgentMath-v0") as (url, srv):
        sid = _open(url)
        status, first, _ = call("POST", f"{url}/sessions/{sid}/reset", {"seed": 4})
        assert status == 200 and first["observation"]["info"]["task_id"] == task_id
        assert "<result>" in _step(url, sid, call_tool)["observation"]["text"]
        status, fork, _ = call("POST", f"{url}/sessions/{sid}/fork", {})
        assert status == 201 and fork["step_count"] == 1 and fork["session_id"] != sid
        # the parent answers wrongly, the fork rightly: neither sees the other's step
        wrong = _step(url, sid, "<answer> \\boxed{-1} </answer>")
        right = _step(url, fork["session_id"], answer)
        assert (wrong["reward"], wrong["done"]) == (0.0, True)
        assert (right["reward"], right["done"]) == (1.0, True)
        # back to right after the tool result: the episode can be answered again
        status, state, _ = call("POST", f"{url}/sessions/{sid}/rewind", {"step_count": 1})
        assert status == 200 and state["step_count"] == 1 and state["done"] is False
        assert _step(url, sid, answer)["reward"] == 1.0
        status, bad, _ = call("POST", f"{url}/sessions/{sid}/rewind", {"step_count": 9})
        assert status == 422 and "0..2" in bad["detail"]
        status, bad, _ = call("POST", f"{url}/sessions/{sid}/rewind", {"step_count": 0, "episode_id": "other"})
        assert status == 409 and "own episode" in bad["detail"]
        assert call("DELETE", f"{url}/sessions/{sid}")[:2] == (200, {"session_id": sid, "closed": True})
        assert set(srv.sessions) == {fork["session_id"]}


def test_batched_step_answers_each_item_on_its_own():
    with serving("AgentMath-v0") as (url, _):
        sids = [_open(url) for _ in range(3)]
        golds = {}
        for k, sid in enumerate(sids):
            call("POST", f"{url}/sessions/{sid}/reset", {"seed": k})
            golds[sid] = gold_episode("AgentMath-v0", seed=k)[1]
        steps = [{"session_id": sid, "action": {"message": golds[sid][0]}} for sid in sids]
        steps += [{"session_id": "gone", "action": {"message": "x"}}, {"session_id": sids[0], "action": {}}]
        status, answer, _ = call("POST", url + "/sessions/step", {"steps": steps})
        assert status == 200
        results = answer["results"]
        assert [r["done"] for r in results[:3]] == [False] * 3
        assert all("<result>" in r["observation"]["text"] for r in results[:3])
        assert results[3]["error"]["status"] == 404 and "unknown session 'gone'" in results[3]["error"]["detail"]
        assert results[4]["error"]["status"] == 422 and results[4]["error"]["detail"][0]["type"] == "missing"


def test_sessions_are_bounded_and_idle_ones_are_freed():
    with serving("AgentMath-v0", max_sessions=2, idle_timeout_s=0.3) as (url, srv):
        a, b = _open(url), _open(url)
        status, answer, headers = call("POST", url + "/sessions", {})
        assert status == 503 and "2/2 sessions" in answer["detail"] and headers["Retry-After"] == "1"
        deadline = time.monotonic() + 10
        while srv.sessions and time.monotonic() < deadline:
            time.sleep(0.1)
        assert srv.sessions == {}, "idle sessions are closed"
        status, answer, _ = call("GET", f"{url}/sessions/{a}/state")
        assert status == 404 and "closed after 0.3 s without a request" in answer["detail"]
        assert _open(url) != b, "freed slots take new sessions"


async def test_200_concurrent_sessions_play_whole_episodes():
    n = 200
    with serving("AgentMath-v0", max_sessions=n) as (url, srv):
        envs = [RemoteEnv(url, "AgentMath-v0") for _ in range(n)]
        golds = [gold_episode("AgentMath-v0", seed=k)[1] for k in range(n)]

        async def play(k: int) -> float:
            await envs[k].areset(seed=k)
            for action in golds[k]:
                _, reward, terminated, truncated, _ = await envs[k].astep(action)
            assert terminated and not truncated
            return reward

        start = time.monotonic()
        async with asyncio.timeout(120):
            rewards = await asyncio.gather(*(play(k) for k in range(n)))
        assert rewards == [1.0] * n
        assert len(srv.sessions) == n and srv.stats["steps"] == sum(map(len, golds))
        status, answer, _ = call("POST", url + "/sessions", {})
        assert status == 503, "no session beyond max_sessions"
        await asyncio.gather(*(env.aclose() for env in envs))
        assert srv.sessions == {}
        print(f"{n} sessions, {srv.stats['steps']} steps in {time.monotonic() - start:.1f} s")


async def test_a_ws_connection_beyond_capacity_is_told_why():
    import aiohttp

    with serving("AgentMath-v0", max_sessions=1) as (url, _):
        _open(url)
        async with aiohttp.ClientSession() as http, http.ws_connect(url.replace("http", "ws") + "/ws") as ws:
            msg = await ws.receive_json()
            assert msg["type"] == "error" and msg["data"]["code"] == "CAPACITY_REACHED"
            assert msg["data"]["max_sessions"] == 1


def test_a_step_past_its_timeout_is_504_and_leaves_the_episode_where_it_was():
    _, gold = gold_episode("AgentMath-v0", seed=1)
    with serving("AgentMath-v0") as (url, _):
        sid = _open(url)
        call("POST", f"{url}/sessions/{sid}/reset", {"seed": 1})
        slow = {"action": {"message": "<python> import time; time.sleep(2) </python>"}, "timeout_s": 0.3}
        start = time.monotonic()
        status, answer, _ = call("POST", f"{url}/sessions/{sid}/step", slow)
        assert status == 504 and "timeout_s=0.3" in answer["detail"] and time.monotonic() - start < 1.5
        status, state, _ = call("GET", f"{url}/sessions/{sid}/state")
        assert (state["step_count"], state["tool_calls"]) == (0, 0)
        for action in gold:
            result = _step(url, sid, action)
        assert result["reward"] == 1.0 and result["observation"]["info"]["tool_calls"] == len(gold) - 1
