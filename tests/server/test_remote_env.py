"""`AgentRemote-v0` against a real server: Gymnasium's env checker, trajectories equal to the
local env's for the same seeds and actions, forks and rewinds, session expiry, and the rollout
runner's loop over remote envs."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import pytest
from env_server_helpers import serving
from gymnasium.utils.env_checker import check_env

from agent_envs.remote.env_client import EnvServerError, RemoteEnv


def _comparable(info: dict) -> dict:
    """`info` without the one thing that differs between two runs of a tool call: its latency."""
    out = dict(info)
    if "tool_result" in out:
        out["tool_result"] = {k: v for k, v in out["tool_result"].items() if k != "latency_s"}
    return out


def _actions(env) -> list[str]:
    """The gold trace with a bad call and a repeated call first: every kind of step is compared."""
    gold = list(env.unwrapped.task.gold_trace)
    return ["<python> </python>", *gold[:-1], *gold[:-1], gold[-1]]


@pytest.mark.parametrize(("env_id", "env_kwargs"), [("AgentMath-v0", {}), ("AgentQA-v0", {"max_tool_calls": 2}),
                                                   ("AgentSearch-v0", {})])
def test_remote_trajectories_equal_local_ones(env_id, env_kwargs):
    with serving(env_id) as (url, _):
        remote = gym.make("AgentRemote-v0", url=url, env_id=env_id, env_kwargs=env_kwargs)
        local = gym.make(env_id, **env_kwargs)
        for seed in range(4):
            assert remote.reset(seed=seed) == local.reset(seed=seed)
            for action in _actions(local):
                got, want = remote.step(action), local.step(action)
                assert got[:4] == want[:4], action
                assert _comparable(got[4]) == _comparable(want[4]), action
                if want[2] or want[3]:
                    break
            assert want[2] or want[3], "each episode is played to its end"
        remote.close()


def test_gymnasium_env_checker_passes():
    with serving("AgentMath-v0") as (url, _):
        env = gym.make("AgentRemote-v0", url=url, env_id="AgentMath-v0")
        check_env(env.unwrapped, skip_render_check=True)
        env.close()


def test_fork_and_set_state_through_the_server():
    with serving("AgentMath-v0") as (url, srv):
        env = RemoteEnv(url)
        env.reset(seed=2)
        gold = gym.make("AgentMath-v0").unwrapped
        gold.reset(seed=2)
        call_tool, answer = gold.task.gold_trace[0], gold.task.gold_trace[-1]
        env.step(call_tool)
        boundary = env.get_state()
        twin = env.fork()
        assert env.step("<answer> \\boxed{-1} </answer>")[1:3] == (0.0, True)
        assert twin.step(answer)[1:3] == (1.0, True)
        # ARPO's branch at a tool result: fork the finished path, set it back to the boundary
        branch = env.fork()
        branch.set_state(boundary)
        assert branch.get_state() == boundary and branch.step(answer)[1:3] == (1.0, True)
        assert len(srv.sessions) == 3
        for e in (env, twin, branch):
            e.close()
        assert srv.sessions == {}


def test_a_session_freed_while_idle_is_reopened_by_reset():
    import time

    with serving("AgentMath-v0", idle_timeout_s=0.2) as (url, srv):
        env = RemoteEnv(url)
        env.reset(seed=0)
        first = env.session_id
        deadline = time.monotonic() + 10
        while srv.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(EnvServerError, match=r"unknown session .*closed after 0.2 s without a request"):
            env.step("<answer> 1 </answer>")
        prompt, info = env.reset(seed=0)
        assert env.session_id != first and info["task_id"]


def test_wrong_env_id_is_one_clear_line():
    with serving("AgentMath-v0") as (url, _), pytest.raises(EnvServerError) as err:
        RemoteEnv(url, env_id="AgentQA-v0")
    message = str(err.value)
    assert "\n" not in message and url in message and "serve-env AgentQA-v0" in message


class _CharTokenizer:
    """One token per character: enough for the runner, which only encodes env text and never
    needs a vocabulary (a stand-in for a model's tokenizer; the engine below is scripted)."""

    eos_token_id = 0
    all_special_ids = [0]

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids)


class _GoldEngine:
    """A scripted `RolloutEngine` that writes each task's gold trace, one action per call: it
    reads the prompt to know the task and counts its own earlier actions in the response."""

    def __init__(self, traces: dict[str, list[str]]) -> None:
        self.tokenizer = _CharTokenizer()
        self.traces = traces

    async def agenerate(self, prompts, params):
        from algorithms.rollout.engine import Segment, per_request

        out = []
        for ids, p in zip(prompts, per_request(prompts, params), strict=True):
            text = self.tokenizer.decode(ids)
            question = next(q for q in self.traces if q in text)
            done = sum(text.count(a) for a in set(self.traces[question]))
            action = self.traces[question][done]
            stop = next((s for s in p.stop if action.endswith(s)), None)
            out.append(Segment(token_ids=[ord(c) for c in action], logprobs=[-0.1] * len(action),
                               finish_reason="stop" if stop else "eos", stop_str=stop, text=action))
        return out

    def generate(self, prompts, params):  # pragma: no cover - the runner is async
        return asyncio.run(self.agenerate(prompts, params))

    def sync_weights(self, model):  # pragma: no cover
        pass


async def test_the_rollout_runner_plays_remote_envs():
    pytest.importorskip("algorithms.rollout.runner")
    from algorithms.rollout import SamplingParams, run_episodes

    n_prompts, group = 3, 2
    traces = {}
    for i in range(n_prompts):
        local = gym.make("AgentMath-v0").unwrapped
        local.reset(seed=100 + i)
        traces[local.task.question] = list(local.task.gold_trace)
    with serving("AgentMath-v0") as (url, srv):
        envs = [RemoteEnv(url, "AgentMath-v0") for _ in range(n_prompts)]
        engine = _GoldEngine(traces)
        trajs = await run_episodes(engine, envs, SamplingParams(max_tokens=2048), group_size=group, seed=100)
        assert len(trajs) == n_prompts * group and len(srv.sessions) == n_prompts * group, "groups are forks"
        assert [t.reward for t in trajs] == [1.0] * len(trajs)
        assert all(t.terminated and t.tool_calls >= 1 for t in trajs)
        # the tool results the runner appended (mask 0) are exactly the server's observations
        for t in trajs:
            inserted = "".join(chr(i) for i, m in zip(t.response_ids, t.loss_mask, strict=True) if m == 0)
            assert "<result>" in inserted
        for env in envs:
            await env.aclose()
    # the same loop over local envs gives the same trajectories, token for token
    local = [gym.make("AgentMath-v0").unwrapped for _ in range(n_prompts)]
    want = await run_episodes(engine, local, SamplingParams(max_tokens=2048), group_size=group, seed=100)
    for got, ref in zip(trajs, want, strict=True):
        assert (got.prompt_ids, got.response_ids, got.loss_mask) == (ref.prompt_ids, ref.response_ids, ref.loss_mask)
        assert (got.reward, got.end_reason) == (ref.reward, ref.end_reason)
        assert _comparable(got.components) == _comparable(ref.components)


def test_truncate_scores_the_partial_response_as_the_local_env_does():
    with serving("AgentMath-v0") as (url, _):
        remote, local = RemoteEnv(url), gym.make("AgentMath-v0").unwrapped
        for env in (remote, local):
            env.reset(seed=3)
        call_tool = local.task.gold_trace[0]
        assert _comparable(remote.step(call_tool)[4]) == _comparable(local.step(call_tool)[4])
        got, want = remote.truncate("response_budget"), local.truncate("response_budget")
        assert got[0] == want[0] and _comparable(got[1]) == _comparable(want[1])
        assert remote.get_state().done
        with pytest.raises(EnvServerError, match="409.*reset"):
            remote.step(call_tool)
        remote.close()
