"""Browse against a failing web site, inside real episodes.

The site is real: Python's HTTP server over a few HTML pages, as a subprocess that a test can
SIGKILL. `FaultProxy` (a test double of a misbehaving server) sits in front of it for the faults
a healthy server never shows. As for search: the episode goes on with an observation naming the
cause, requests are bounded (counted at the proxy), no call outlives the tool's timeout, and the
env's metrics count the failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from reliability_support import FAULTS, FaultProxy, ServerProcess, site_process

from agent_envs import Task, ToolEnv
from agent_envs.tools import BrowseTool

PAGES = {
    "alpha.html": "<html><title>Alpha Corp</title><body><p>Alpha Corp was founded by Ada Lovelace in London.</p>"
    "<a href='beta.html'>Beta River</a></body></html>",
    "beta.html": "<html><title>Beta River</title><body><p>The Beta River flows through Gamma.</p></body></html>",
}
TASK = Task(id="alpha", question="Who founded Alpha Corp?", answers=["Ada Lovelace"])
ANSWER = "<think>the page says so</think><answer>\\boxed{Ada Lovelace}</answer>"
BUDGET_S = 2.0
MAX_RETRIES = 2
# JSON-shaped faults mean nothing to a browser (a page of junk is still a page)
BROWSE_FAULTS = sorted(set(FAULTS) - {"garbage", "wrong_shape"})


def _browse(url: str) -> str:
    return f"<think>read it</think><browse>{url}</browse>"


@pytest.fixture
def site(tmp_path: Path) -> Iterator[ServerProcess]:
    for name, html in PAGES.items():
        (tmp_path / name).write_text(html, encoding="utf-8")
    server = site_process(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def site_proxy(site: ServerProcess) -> AsyncIterator[FaultProxy]:
    double = FaultProxy(site.url)
    await double.start()
    yield double
    await double.stop()


def _episode() -> ToolEnv:
    tool = BrowseTool(timeout_s=BUDGET_S, max_retries=MAX_RETRIES, backoff_s=0.05)
    return ToolEnv([TASK], [tool], max_tool_calls=4)


@pytest.mark.parametrize("fault", BROWSE_FAULTS)
async def test_a_site_fault_is_an_observation_and_the_episode_goes_on(site_proxy: FaultProxy, fault: str) -> None:
    kind, says, retried = FAULTS[fault]
    env = _episode()
    try:
        env.reset(options={"index": 0})
        site_proxy.always(fault)
        start = time.monotonic()
        obs, reward, terminated, truncated, info = await env.astep(_browse(f"{site_proxy.url}/alpha.html"))
        elapsed = time.monotonic() - start
        hits = site_proxy.hits
        print(f"\n{fault}: {hits} requests, {elapsed:.2f} s, observation: {obs.strip()}")
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert f"Could not open {site_proxy.url}/alpha.html: " in obs and says in obs, obs
        assert info["tool_result"]["error"] == kind and elapsed < BUDGET_S + 0.3
        attempts = MAX_RETRIES + 1 if retried else 1
        if fault == "slow":  # no per-attempt limit: the one attempt has the whole budget
            attempts = 1
            assert f"timeout after {BUDGET_S:g} s" in obs
        # aiohttp itself sends a GET once more when the connection drops before any answer
        # (RFC 9112 section 9.3.1), so the site sees two requests per attempt then
        assert hits == attempts * (2 if fault in ("reset_before", "close_before") else 1)
        assert info["tool_result"]["retries"] == attempts - 1
        assert obs.rstrip().endswith(f"({attempts - 1} retries).\n</result>" if attempts == 3 else ".\n</result>"), obs

        site_proxy.always("pass")
        obs, *_, info = await env.astep(_browse(f"{site_proxy.url}/alpha.html#again"))
        assert info["tool_result"]["ok"] and "founded by Ada Lovelace" in obs, obs
        _, reward, terminated, _, info = await env.astep(ANSWER)
        assert terminated and reward == 1.0 and info["tool_errors"] == 1
        assert dict(env.metrics.errors) == {kind: 1} and env.metrics.retries == attempts - 1
    finally:
        await env.aclose()


async def test_the_site_killed_between_two_pages(site: ServerProcess) -> None:
    env = _episode()
    try:
        env.reset(options={"index": 0})
        obs, *_, info = await env.astep(_browse(f"{site.url}/alpha.html"))
        assert info["tool_result"]["ok"] and f"[1] Beta River: {site.url}/beta.html" in obs, obs

        site.kill()
        start = time.monotonic()
        obs, reward, terminated, _, info = await env.astep(_browse(f"{site.url}/beta.html"))
        elapsed = time.monotonic() - start
        print(f"\nkilled site: reported after {elapsed:.2f} s: {obs.strip()}")
        assert not terminated and f"connection refused by 127.0.0.1:{site.port}" in obs, obs
        assert info["tool_result"]["error"] == "refused" and elapsed < 2.5

        await asyncio.to_thread(site.start)
        obs, *_, info = await env.astep(_browse(f"{site.url}/beta.html"))
        assert info["tool_result"]["ok"] and "flows through Gamma" in obs, obs
        _, reward, terminated, _, info = await env.astep(ANSWER)
        assert terminated and info["tool_errors"] == 1 and dict(env.metrics.errors) == {"refused": 1}
    finally:
        await env.aclose()
