"""Search against a failing retrieval server, inside real episodes.

The server is the real one (`RetrieverServer` over the shared multi-hop corpus, or the
`agent-envs serve-retriever` subprocess, SIGKILLed mid-episode). The faults it cannot produce on
demand come from `FaultProxy`, a test double of a misbehaving server placed in front of it.
Each fault must leave the episode running with an observation that names the cause, spend a
bounded number of requests (counted at the server), end within the tool's budget (wall time
measured), and be counted in the env's tool metrics.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import gymnasium as gym
import pytest
from reliability_support import CORPUS, FAULTS, FaultProxy, retriever_process

import agent_envs  # noqa: F401  (registers AgentQA-v0)
from agent_envs import Task, ToolEnv
from agent_envs.retrieval import HttpBackend
from agent_envs.server.retriever import RetrieverServer
from agent_envs.tools import SearchTool

TASK = Task(
    id="kiss-and-tell",
    question="What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?",
    answers=["Chief of Protocol"],
)
SEARCH = "<think>look it up</think><search>Shirley Temple Chief of Protocol</search>"
SEARCH_AGAIN = "<think>once more</think><search>Shirley Temple government position</search>"
ANSWER = "<think>found it</think><answer>\\boxed{Chief of Protocol}</answer>"
GOLD_DOC = "hotpotqa-000002"  # Shirley Temple's passage in the corpus

BUDGET_S = 2.0  # the tool's timeout: the whole call, retries included
MAX_RETRIES = 2


def _episode(url: str) -> ToolEnv:
    backend = HttpBackend(f"{url}/retrieve", timeout_s=1.0, max_retries=MAX_RETRIES, backoff_s=0.05)
    return ToolEnv([TASK], [SearchTool(backend, topk=3, timeout_s=BUDGET_S)], max_tool_calls=4)


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_a_fault_is_an_observation_and_the_episode_goes_on(proxy: FaultProxy, fault: str) -> None:
    kind, says, retried = FAULTS[fault]
    env = _episode(proxy.url)
    try:
        env.reset(options={"index": 0})
        proxy.always(fault)
        start = time.monotonic()
        obs, reward, terminated, truncated, info = await env.astep(SEARCH)
        elapsed = time.monotonic() - start
        failed_hits = proxy.hits
        print(f"\n{fault}: {failed_hits} requests, {elapsed:.2f} s, observation: {obs.strip()}")

        assert (reward, terminated, truncated) == (0.0, False, False)  # the episode goes on
        assert "<result>\nSearch failed: " in obs and says in obs, obs
        assert info["tool_result"]["ok"] is False and info["tool_result"]["error"] == kind
        assert elapsed < BUDGET_S + 0.3, f"{fault}: the call took {elapsed:.2f} s, budget {BUDGET_S} s"
        if fault == "slow":  # 1 s per attempt: the second attempt is cut at the 2 s budget
            assert failed_hits == 2 and f"timeout after {BUDGET_S:g} s" in obs
        else:
            assert failed_hits == (MAX_RETRIES + 1 if retried else 1)  # bounded, and only transient ones
        assert info["tool_result"]["retries"] == failed_hits - 1

        proxy.always("pass")  # the server recovers: the same episode searches again
        obs, *_, info = await env.astep(SEARCH_AGAIN)
        assert info["tool_result"]["ok"] and "Doc 1(Title: Shirley Temple)" in obs, obs
        _, reward, terminated, _, info = await env.astep(ANSWER)
        assert terminated and reward == 1.0
        assert info["tool_errors"] == 1 and info["tool_calls"] == 2
        m = env.metrics
        assert (m.calls["search"], m.failures["search"], dict(m.errors)) == (2, 1, {kind: 1})
        assert m.retries == failed_hits - 1 and m.timeouts == (kind == "timeout")
    finally:
        await env.aclose()


async def test_the_retrieval_server_killed_between_two_searches(shared_data: Path, index_dir: Path, wiki) -> None:
    # the env as users make it (gym.make, default retry policy and 30 s timeout), against the
    # real server process, which dies by SIGKILL after the first search and comes back later
    server = retriever_process(shared_data / CORPUS, index_dir)
    await asyncio.to_thread(server.start)
    env = gym.make("AgentQA-v0", tasks=[TASK], retriever_url=f"{server.url}/retrieve").unwrapped
    try:
        env.reset(options={"index": 0})
        obs, *_, info = await env.astep(SEARCH)
        assert info["tool_result"]["ok"] and "Shirley Temple" in obs, obs

        server.kill()
        start = time.monotonic()
        obs, reward, terminated, truncated, info = await env.astep(SEARCH_AGAIN)
        elapsed = time.monotonic() - start
        print(f"\nkilled server: reported after {elapsed:.2f} s, retries {info['tool_result']['retries']}: {obs.strip()}")
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert f"connection refused by 127.0.0.1:{server.port} (is the server running?)" in obs, obs
        assert info["tool_result"]["error"] == "refused" and elapsed < 2.5

        await asyncio.to_thread(server.start)  # back on the same port: the episode's next search works
        obs, *_, info = await env.astep("<think>again</think><search>Kiss and Tell 1945 film</search>")
        assert info["tool_result"]["ok"] and "<result>\nDoc 1(" in obs, obs
        _, reward, terminated, _, info = await env.astep(ANSWER)
        assert terminated and reward == 1.0 and info["tool_errors"] == 1
        assert dict(env.metrics.errors) == {"refused": 1} and env.metrics.failures["search"] == 1
    finally:
        await env.aclose()
        server.stop()


async def test_a_server_that_fails_then_recovers_costs_retries_not_errors(proxy: FaultProxy) -> None:
    env = _episode(proxy.url)
    try:
        env.reset(options={"index": 0})
        proxy.schedule("http_500", "reset")  # two bad answers, then the real server's
        obs, *_, info = await env.astep(SEARCH)
        assert info["tool_result"]["ok"] and info["tool_result"]["retries"] == 2 and proxy.hits == 3
        assert "Doc 1(Title: Shirley Temple)" in obs
        assert env.metrics.retries == 2 and not env.metrics.failures["search"]
    finally:
        await env.aclose()


async def test_back_off_that_would_overrun_the_budget_is_not_started(proxy: FaultProxy) -> None:
    # SkyRL's policy (10 retries, 1 s steps) against a server that always answers 500: without a
    # budget the call would run 55 s; with a 2 s budget it stops early and still names the 500
    tool = SearchTool(HttpBackend(f"{proxy.url}/retrieve"), timeout_s=BUDGET_S)
    proxy.always("http_500")
    try:
        res = await tool("Shirley Temple")
    finally:
        await tool.aclose()
    print(f"\npersistent 500: {proxy.hits} requests in {res.latency_s:.2f} s: {res.text}")
    assert not res.ok and res.error == "http_500" and "HTTP 500 from" in res.text
    assert " s of the budget left, back-off 2 s)" in res.text  # about 1 s left after the 1 s back-off
    assert proxy.hits == 2 and res.retries == 1 and res.latency_s < BUDGET_S  # tries at 0 s and 1 s


async def _fault_storm(proxy: FaultProxy, retriever: RetrieverServer, episodes: int, seed: int) -> None:
    """Many concurrent episodes over one shared tool while a third of the requests fail.

    Clients, proxy and server share this test's event loop (and 2 busy CPUs), so at 200 episodes
    the loop itself lags: the budget is 5 s, attempts 2.5 s, and a call may end up to 1 s late
    (then the env's deadline, a second past the tool's, still ends it). A timer fires as late as
    the loop lags, so the bound on a call adds the worst lag seen while it ran, for each of the
    three wake-ups between the deadline and the caller (the deadline's timer, the cancelled
    call, the caller): on a loaded machine the lag, not the budget, is what varies.
    """
    budget_s, grace_s = 5.0, 1.0  # grace: the env's deadline is the tool's timeout plus a second
    rng = random.Random(seed)
    kinds = sorted(FAULTS)
    plan = [rng.choice(kinds) if rng.random() < 1 / 3 else "pass" for _ in range(episodes * 8)]
    proxy.schedule(*plan)
    # no queue in the client (pool and concurrency above the episode count)
    backend = HttpBackend(
        f"{proxy.url}/retrieve", timeout_s=2.5, max_retries=MAX_RETRIES, backoff_s=0.05, pool_size=2 * episodes
    )
    tool = SearchTool(backend, timeout_s=budget_s, concurrency=2 * episodes)
    envs = [ToolEnv([TASK], [tool], max_tool_calls=4) for _ in range(episodes)]

    async def play(env: ToolEnv) -> list[float]:
        env.reset(options={"index": 0})
        times = []
        for action in (SEARCH, SEARCH_AGAIN):
            start = time.monotonic()
            obs, _, terminated, _, info = await env.astep(action)
            times.append(time.monotonic() - start)
            assert not terminated and "<result>\n" in obs
            assert info["tool_result"]["ok"] or "<result>\nSearch failed: " in obs
        _, reward, terminated, _, _ = await env.astep(ANSWER)
        assert terminated and reward == 1.0  # every episode ends and is graded
        return times

    lags = [0.0]

    async def watch_the_loop() -> None:  # how late the loop wakes a sleeper
        while True:
            asleep = time.monotonic()
            await asyncio.sleep(0.02)
            lags.append(time.monotonic() - asleep - 0.02)

    watcher = asyncio.create_task(watch_the_loop())
    start = time.monotonic()
    try:
        times = [t for ts in await asyncio.gather(*(play(env) for env in envs)) for t in ts]
    finally:
        watcher.cancel()
        await tool.aclose()
    wall = time.monotonic() - start
    failed = sum(sum(env.metrics.failures.values()) for env in envs)
    errors = sum((env.metrics.errors for env in envs), start=type(envs[0].metrics.errors)())
    retries = sum(env.metrics.retries for env in envs)
    print(
        f"\nfault storm: {episodes} episodes, {2 * episodes} searches in {wall:.1f} s; proxy saw "
        f"{proxy.hits} requests {dict(proxy.seen)}; failed searches {failed} {dict(errors)}, retries "
        f"{retries}; slowest call {max(times):.2f} s (budget {budget_s:g} s, loop lag up to "
        f"{max(lags):.2f} s); server {retriever.stats}"
    )
    assert max(times) < budget_s + grace_s + 3 * max(lags), (max(times), max(lags))
    # every search reached the server, and none more than 1 + MAX_RETRIES times (the exact count
    # per fault is checked above; here a lagging loop can cut a call before its retries are
    # reported, so only the bounds hold)
    assert 2 * episodes <= proxy.hits <= 2 * episodes * (1 + MAX_RETRIES)
    assert failed == sum(env.state.failed_calls for env in envs) and failed == sum(errors.values())


async def test_fault_storm_small(proxy: FaultProxy, retriever: RetrieverServer) -> None:
    await _fault_storm(proxy, retriever, episodes=20, seed=0)


@pytest.mark.stress
async def test_fault_storm_200_episodes(proxy: FaultProxy, retriever: RetrieverServer) -> None:
    await _fault_storm(proxy, retriever, episodes=200, seed=1)

