"""The sandbox under faults and load, in-process and as a service: a worker killed mid-call, many
concurrent episodes, a restart while calls run, a full queue, a service that is down.

Every check looks at real worker processes (killed with a real SIGKILL from outside) and at what
each call printed; counts are printed (`pytest -s`). Long variants are `stress`-marked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from sandbox_support import REPO, children_by_parent, sandbox_service, worker_pids

from agent_envs.tools import PythonTool
from agent_envs.tools.sandbox import worker


@pytest.fixture(scope="module")
def service():
    """(process id, base URL) of a running sandbox service."""
    with sandbox_service("--workers", "4", "--timeout", "5", "--preamble", "hashlib") as (proc, url):
        yield proc.pid, url


@pytest.fixture(scope="module")
def service_url(service):
    return service[1]


def make_tool(backend: str, url: str | None, **options) -> PythonTool:
    if backend == "service":
        return PythonTool(backend="service", service_url=url, **options)
    return PythonTool(preamble=("hashlib",), **options)


def serving_process(wrapper: int) -> int:
    """The worker's pid-1 process (the fork server itself) under the process its parent started."""
    (init,) = children_by_parent()[wrapper]
    return init


@pytest.mark.parametrize("target", ["worker", "fork server"])
def test_worker_killed_mid_call_is_an_error_observation_and_replaced(target):
    tool = PythonTool(timeout_s=20, pool_size=1)
    try:
        tool.run("1")
        (wrapper,) = worker_pids(tool)
        victim = wrapper if target == "worker" else serving_process(wrapper)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            start = time.monotonic()
            pending = pool.submit(tool.run, "import time\nprint('started', flush=True)\ntime.sleep(15)")
            time.sleep(0.5)  # the call is running (its child sleeps)
            os.kill(victim, signal.SIGKILL)
            res = pending.result(timeout=10)
            elapsed = time.monotonic() - start
        print(f"\n[killed {target} {victim}] {elapsed:.2f} s: {res.text!r}")
        assert (res.ok, res.error) == (False, "sandbox")
        assert "killed by SIGKILL" in res.text  # the observation names the cause
        assert elapsed < 5  # answered when the worker died, not at the 20 s deadline
        assert not os.path.exists(f"/proc/{wrapper}")  # the dead worker was reaped
        assert tool.run("print(6 * 7)").text == "42"  # the pool replaced it
        assert worker_pids(tool) != [wrapper]
    finally:
        tool.close()


@pytest.mark.slow  # starts the module's service (~9 s under load), which only slow tests then share
def test_service_worker_killed_mid_call(service):
    service_pid, url = service
    tool = make_tool("service", url, timeout_s=5)
    try:
        tool.run("1")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(tool.run, "import time\ntime.sleep(4)")
            time.sleep(0.5)
            idle = set(worker_pids(tool))
            busy = [pid for pid in children_by_parent().get(service_pid, []) if pid not in idle]
            assert len(busy) == 1, busy  # the one worker lent out to this call
            os.kill(busy[0], signal.SIGKILL)
            res = pending.result(timeout=10)
        print(f"\n[service: killed worker {busy[0]}] {res.text!r}")
        assert res.error == "sandbox" and "killed by SIGKILL" in res.text
        assert tool.run("print(6 * 7)").text == "42"
        assert busy[0] not in worker_pids(tool)
    finally:
        tool.close()


def episode_code(episode: int, turn: int) -> str:
    """Code whose output only this (episode, turn) can produce."""
    return f"token = hashlib.sha256(b'{episode}:{turn}').hexdigest()\nprint({episode}, {turn}, token)"


def expected(episode: int, turn: int) -> str:
    return f"{episode} {turn} {hashlib.sha256(f'{episode}:{turn}'.encode()).hexdigest()}"


async def run_episodes(tool: PythonTool, episodes: int, turns: int, think_s: float) -> list[str]:
    """Episodes that interleave "generation" (a random pause) with sandbox calls, as rollouts do."""
    rng = random.Random(0)
    pauses = [[rng.uniform(0, think_s) for _ in range(turns)] for _ in range(episodes)]

    async def episode(e: int) -> list[str]:
        texts = []
        for t in range(turns):
            await asyncio.sleep(pauses[e][t])
            texts.append((await tool(episode_code(e, t))).text)
        return texts

    return [text for texts in await asyncio.gather(*(episode(e) for e in range(episodes))) for text in texts]


def check_episodes(texts: list[str], episodes: int, turns: int, label: str) -> None:
    want = [expected(e, t) for e in range(episodes) for t in range(turns)]
    lost = sum(1 for text in texts if not text.strip())
    wrong = sum(1 for got, exp in zip(texts, want, strict=True) if got != exp)
    print(f"\n[{label}] {episodes} episodes x {turns} calls: {len(texts)} answered, {lost} lost, {wrong} cross-wired")
    assert texts == want


@pytest.mark.parametrize("backend", ["local", pytest.param("service", marks=pytest.mark.slow)])
async def test_64_concurrent_episodes_each_get_their_own_results(backend, request):
    url = request.getfixturevalue("service_url") if backend == "service" else None  # local: no service to start
    tool = make_tool(backend, url, timeout_s=10, pool_size=4)
    try:
        texts = await run_episodes(tool, episodes=64, turns=2, think_s=0.02)
        check_episodes(texts, 64, 2, backend)
    finally:
        await tool.aclose()


@pytest.mark.stress
@pytest.mark.parametrize("backend", ["local", "service"])
async def test_64_concurrent_episodes_long_with_timeouts_and_crashes(backend, service_url):
    # 64 episodes x 20 calls, and among them calls that time out or crash their own child: those
    # fail alone, every other call still gets exactly its own output.
    tool = make_tool(backend, service_url, timeout_s=1.0, pool_size=4)
    bad = {(e, 7): "while True: pass" for e in range(0, 64, 9)}
    bad |= {(e, 13): "import ctypes\nctypes.string_at(0)" for e in range(3, 64, 11)}  # SIGSEGV

    async def episode(e: int) -> list[tuple[str, str | None]]:
        out = []
        for t in range(20):
            await asyncio.sleep(random.Random(e * 100 + t).uniform(0, 0.05))
            res = await tool(bad.get((e, t), episode_code(e, t)))
            out.append((res.text, res.error))
        return out

    try:
        results = await asyncio.gather(*(episode(e) for e in range(64)))
    finally:
        await tool.aclose()
    good = wrong = failed_as_expected = 0
    for e, rows in enumerate(results):
        for t, (text, error) in enumerate(rows):
            if (e, t) in bad:
                failed_as_expected += error == "timeout" or "SIGSEGV" in text
            elif text == expected(e, t):
                good += 1
            else:
                wrong += 1
    print(f"\n[{backend} stress] {good} right, {wrong} wrong, {failed_as_expected}/{len(bad)} bad calls failed alone")
    assert wrong == 0 and good == 64 * 20 - len(bad) and failed_as_expected == len(bad)


def _post(url: str, body: dict, timeout: float = 30) -> tuple[int, dict]:
    request = urllib.request.Request(url + "/execute", json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_service_restart_finishes_calls_in_flight_and_swaps_workers():
    with sandbox_service("--workers", "2", "--timeout", "5") as (proc, url):
        assert _health(url)["status"] == "ok" and len(_health(url)["worker_pids"]) == 2  # started eagerly
        old = set(_health(url)["worker_pids"])
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            slow = pool.submit(_post, url, {"code": "import time\ntime.sleep(1.5)\nprint('slow done')"})
            time.sleep(0.3)
            proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 30
            while _health(url)["generation"] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            after = _post(url, {"code": "print('new')"})
            status, body = slow.result(timeout=10)
        assert (status, body["stdout"]) == (200, "slow done\n")  # the call in flight was not dropped
        assert body["metadata"]["generation"] == 0  # it ran on the pool it started on
        assert after[1]["stdout"] == "new\n" and after[1]["metadata"]["generation"] == 1
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{pid}") for pid in old) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(os.path.exists(f"/proc/{pid}") for pid in old)  # the old workers are gone
        assert not old & set(_health(url)["worker_pids"])
        print(f"\n[restart] old workers {sorted(old)} -> {_health(url)['worker_pids']}")


@pytest.mark.slow
def test_service_bounds_its_queue_and_stops_gracefully():
    with sandbox_service("--workers", "1", "--max-queue", "1", "--timeout", "5") as (proc, url):
        slow = {"code": "import time\ntime.sleep(1.0)\nprint('done')"}
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            calls = [pool.submit(_post, url, slow)]
            time.sleep(0.3)
            calls += [pool.submit(_post, url, slow) for _ in range(3)]
            results = [c.result(timeout=30) for c in calls]
        statuses = sorted(status for status, _ in results)
        print(f"\n[queue] 1 worker, queue 1, 4 calls: statuses {statuses}")
        assert statuses == [200, 200, 503, 503]  # one runs, one waits, the rest are told at once
        assert all("busy" in body["error"] for status, body in results if status == 503)
        assert _health(url)["rejected"] == 2
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(_post, url, slow)
            time.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            status, body = running.result(timeout=30)
        assert (status, body["stdout"]) == (200, "done\n")  # SIGTERM let the call in flight finish
        assert proc.wait(timeout=30) == 0


@pytest.mark.slow  # the module's service: see test_service_worker_killed_mid_call
def test_service_rejects_malformed_requests_with_the_reason(service_url):
    assert _post(service_url, {"cod": "1"}) == (400, {"error": "request body must be a JSON object with 'code' (string)"})
    status, body = _post(service_url, {"code": "1", "timeout_s": -1})
    assert status == 400 and "timeout_s" in body["error"]


def test_unreachable_service_is_an_error_observation():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tool = PythonTool(backend="service", service_url=f"http://127.0.0.1:{port}")
    res = tool.run("print(1)")
    assert (res.ok, res.error) == (False, "sandbox")
    assert f"127.0.0.1:{port} is unreachable" in res.text and "ConnectionRefusedError" in res.text
    tool.close()
    with pytest.raises(ValueError, match="service_url"):
        PythonTool(backend="service")


def test_service_that_cannot_start_its_workers_says_why():
    proc = subprocess.run(
        [sys.executable, "-m", "agent_envs.cli", "serve-sandbox", "--port", "0", "--preamble", "no_such_module"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 2
    assert "the workers did not start: preamble import failed: ModuleNotFoundError" in proc.stderr


# A call's code that would outlive its reply: after reporting its status the call's process waits
# (worker.LINGER_S) to be killed; this code turns that wait into a minute, so only the worker's
# kill right after the reply ends it.
OUTLIVE_THE_REPLY = "import select, time\nselect.select = lambda *args: time.sleep(60)\nprint(1)"


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_children_for_the_next_calls_are_prepared_while_idle():
    tool = PythonTool(timeout_s=5, pool_size=1)
    try:
        tool.run("print(1)")  # starts the worker; its call's process lives LINGER_S at most, killed or not
        (wrapper,) = worker_pids(tool)
        init = serving_process(wrapper)

        def children() -> set[int]:
            return set(children_by_parent().get(init, []))

        time.sleep(worker.LINGER_S + 0.5)
        assert wait_for(lambda: len(children()) >= worker.PREPARED_CHILDREN)
        for _ in range(3):
            # counted only once the answered call has exited: until then it is a child of the
            # fork server too (alive, or dead and not yet reaped), beside the prepared ones
            before = children()
            assert len(before) == worker.PREPARED_CHILDREN, before
            assert tool.run(OUTLIVE_THE_REPLY).text == "1"  # run by one of `before`, the oldest
            assert wait_for(lambda before=before: before - children()), "the answered call was not killed after its reply"
            assert wait_for(lambda: len(children()) >= worker.PREPARED_CHILDREN)
            prepared = children()
            assert len(prepared) == worker.PREPARED_CHILDREN, prepared
            for pid in prepared:  # each waits, alone, as pid 1 of its own pid namespace
                nspid = Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].split("\n")[0].split()
                assert nspid[-1] == "1" and not children_by_parent().get(pid)
    finally:
        tool.close()


@pytest.mark.slow
def test_service_refuses_a_call_that_waited_a_whole_timeout():
    with sandbox_service("--workers", "1", "--max-queue", "4", "--timeout", "2") as (_, url):
        slow = {"code": "import time\ntime.sleep(1.2)\nprint('done')"}
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            calls = []
            for _ in range(3):  # A runs, B waits ~1.2 s (< 2) and runs, C would wait ~2.4 s
                calls.append(pool.submit(_post, url, slow))
                time.sleep(0.05)
            (a, b, c) = [call.result(timeout=30) for call in calls]
        print(f"\n[queue wait] statuses {a[0]}, {b[0]}, {c[0]}: {c[1]}")
        assert (a, b) == ((200, a[1]), (200, b[1])) and a[1]["stdout"] == b[1]["stdout"] == "done\n"
        assert c == (503, {"error": "the sandbox service is busy (waited 2 s for a worker)"})
