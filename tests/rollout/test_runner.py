"""The multi-turn runner with real engines and real ToolEnvs: token-in / token-out without drift,
masks, budgets, concurrency of tool calls, forks, and trajectory JSONL."""

from __future__ import annotations

import asyncio

import pytest
from rollout_helpers import CalcTool, make_env

from algorithms.rollout import SamplingParams, Trajectory, run_episodes
from algorithms.rollout.runner import EpisodeBranch, encode, run_branches, start_group
from algorithms.rollout.trajectory import read_jsonl, write_jsonl


class RecordingEngine:
    """Wraps a real engine and keeps every segment it returned, to compare with the trajectories."""

    def __init__(self, engine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.calls: list[tuple[list[list[int]], list]] = []

    async def agenerate(self, prompts, params):
        segs = await self.engine.agenerate(prompts, params)
        self.calls.append(([list(p) for p in prompts], params, segs))
        return segs

    def generate(self, prompts, params):  # pragma: no cover - the runner is async
        return self.engine.generate(prompts, params)

    def sync_weights(self, model):  # pragma: no cover
        self.engine.sync_weights(model)


def _check_no_drift(trajs: list[Trajectory], rec: RecordingEngine, budget: int) -> int:
    """Replay the recorded engine calls: each trajectory must be prompt ‖ gen ‖ obs ‖ gen ‖ …"""
    tok = rec.tokenizer
    special = set(tok.all_special_ids)
    by_input: dict[tuple[int, ...], list] = {}
    for prompts, _, segs in rec.calls:
        for p, s in zip(prompts, segs, strict=True):
            by_input.setdefault(tuple(p), []).append(s)
    multi_turn = 0
    for t in trajs:
        t.validate()
        assert len(t.response_ids) <= budget
        assert len(t.loss_mask) == len(t.logprobs) == len(t.response_ids)
        pos = 0
        n_obs = 0
        for k, start in enumerate(t.segment_starts):
            assert start == pos
            seg = by_input[tuple(t.prompt_ids + t.response_ids[:start])].pop(0)
            end = start + len(seg.token_ids)
            # generated ids are stored exactly as the engine returned them, with mask 1
            assert t.response_ids[start:end] == seg.token_ids
            assert t.loss_mask[start:end] == [1] * len(seg.token_ids)
            assert t.logprobs[start:end] == seg.logprobs
            nxt = t.segment_starts[k + 1] if k + 1 < len(t.segment_starts) else len(t.response_ids)
            obs_ids = t.response_ids[end:nxt]
            if obs_ids:
                n_obs += 1
                assert t.loss_mask[end:nxt] == [0] * len(obs_ids)
                assert t.logprobs[end:nxt] == [0.0] * len(obs_ids)
                # nothing special (BOS, EOS, ChatML markers) is ever inserted: special tokens in
                # a response can only be ones the model sampled
                assert not special & set(obs_ids)
            pos = nxt
        assert pos == len(t.response_ids)
        # the observations are exactly the env's inserted texts, each encoded on its own
        env_texts = [text for text, by_model in t.components["_segments"] if not by_model]
        inserted = [i for i, m in enumerate(t.loss_mask) if m == 0]
        expected = [x for text in env_texts[:n_obs] for x in encode(tok, text)]
        assert [t.response_ids[i] for i in inserted] == expected
        multi_turn += n_obs > 0
    return multi_turn


async def _run(engine, budget=256, group_size=4, n_prompts=4, tool=None, params=None, **gather):
    rec = RecordingEngine(engine)
    tool = tool or CalcTool()
    envs = []

    def factory():
        env = make_env(engine.tokenizer, tool, max_response_tokens=budget)
        envs.append(env)
        return env

    params = params or SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=budget, seed=11)
    trajs = await run_episodes(
        rec, factory, params, n_prompts=n_prompts, group_size=group_size, max_response_tokens=budget, **gather
    )
    return trajs, rec, tool


def _attach_env_segments(trajs, paths_envs):
    for t, env in zip(trajs, paths_envs, strict=True):
        t.components["_segments"] = list(env.state.segments)


async def _run_with_envs(engine, **kw):
    """Like _run, but keeps each branch's env so the test can read what the env inserted."""
    rec = RecordingEngine(engine)
    tool = kw.pop("tool", None) or CalcTool()
    budget = kw.pop("budget", 256)
    params = kw.pop("params", None) or SamplingParams(temperature=1.0, max_tokens=budget, seed=11)
    branches: list[EpisodeBranch] = []
    for g in range(kw.pop("n_prompts", 4)):
        env = make_env(engine.tokenizer, tool, max_response_tokens=budget)
        branches += start_group(env, engine.tokenizer, g, kw.get("group_size", 4), len(branches), seed=g)
    await run_branches(rec, branches, params, budget)
    trajs = [p.to_trajectory() for p in branches]
    _attach_env_segments(trajs, [p.env for p in branches])
    return trajs, rec, tool


@pytest.mark.parametrize("engine_name", ["hf_engine", "vllm_engine"])
async def test_no_retokenization_drift(engine_name, request):
    engine = request.getfixturevalue(engine_name)
    trajs, rec, tool = await _run_with_envs(engine, n_prompts=4, group_size=4)
    multi_turn = _check_no_drift(trajs, rec, 256)
    assert multi_turn >= 4, f"only {multi_turn} of {len(trajs)} episodes called the tool"
    assert tool.calls > 0  # some observations are real tool results (others: invalid-call messages)
    # the group shares one prompt and one group id; trajectories keep prompt-major order
    for g in range(4):
        group = trajs[4 * g : 4 * g + 4]
        assert {t.group_id for t in group} == {g}
        assert len({tuple(t.prompt_ids) for t in group}) == 1
    assert [t.traj_id for t in trajs] == list(range(16))


async def test_run_episodes_rewards_end_states_and_budget(vllm_engine):
    trajs, rec, tool = await _run(vllm_engine, budget=96, n_prompts=4, group_size=4)
    assert len(trajs) == 16
    for t in trajs:
        t.validate()
        assert len(t.response_ids) <= 96
        assert t.terminated != t.truncated
        assert t.end_reason
        assert "tool_calls" in t.components and t.tool_calls == t.components["tool_calls"]
        assert isinstance(t.reward, float)
    # every engine request asked for at most the branch's remaining budget
    for prompts, params, _ in rec.calls:
        for p, sp in zip(prompts, params, strict=True):
            prompt_len = len(trajs[0].prompt_ids)
            assert sp.max_tokens <= 96 - (len(p) - prompt_len)
            assert "</python>" in sp.stop and sp.n == 1


async def test_tiny_budget_truncates_instead_of_overflowing(hf_engine):
    trajs, _, _ = await _run(hf_engine, budget=12, n_prompts=2, group_size=2)
    for t in trajs:
        assert len(t.response_ids) <= 12
        t.validate()
    assert any(t.truncated for t in trajs)


async def test_tool_calls_run_concurrently_with_each_other(hf_engine):
    tool = CalcTool(delay_s=0.2)
    trajs, _, _ = await _run(hf_engine, n_prompts=4, group_size=4, tool=tool)
    assert tool.calls >= 4
    assert tool.max_in_flight >= 2, "tool calls of different episodes overlapped"


async def test_generation_overlaps_slow_tool_calls(hf_engine):
    """While one episode's tool sleeps, the engine keeps generating for the others."""
    tool = CalcTool(delay_s=0.5)
    rec = RecordingEngine(hf_engine)
    started: list[float] = []
    inner = rec.agenerate

    async def timed(prompts, params):
        started.append((asyncio.get_running_loop().time(), tool.in_flight))
        return await inner(prompts, params)

    rec.agenerate = timed
    branches = []
    for g in range(4):
        env = make_env(hf_engine.tokenizer, tool)
        branches += start_group(env, hf_engine.tokenizer, g, 4, len(branches), seed=g)
    await run_branches(rec, branches, SamplingParams(max_tokens=256, seed=5), 256)
    assert any(in_flight > 0 for _, in_flight in started), "some generation started while tools were running"


async def test_fork_at_boundary_continues_independently(hf_engine):
    env = make_env(hf_engine.tokenizer)
    [branch] = start_group(env, hf_engine.tokenizer, 0, 1, 0, seed=0)
    params = SamplingParams(temperature=0, max_tokens=128)
    # drive until the first tool result is appended
    from algorithms.rollout.runner import apply_segment, generate_segments

    for _ in range(3):
        segs = await generate_segments(hf_engine, [branch], params, 256)
        await apply_segment(branch, segs[0], hf_engine.tokenizer, 256)
        if not branch.active or branch.boundary_offset:
            break
    if not branch.boundary_offset:
        pytest.fail("greedy episode made no tool call; the warmed tiny model should call <python>")
    at = branch.boundary_offset
    fork = branch.fork(traj_id=99, at_boundary=True)
    assert fork.response_ids == branch.response_ids[:at] and fork.branch_offset == at
    assert fork.parent_id == branch.traj_id and fork.lineage["depth"] == 1
    assert fork.env is not branch.env and fork.env.get_state() is branch.boundary_state
    await run_branches(hf_engine, [fork], SamplingParams(temperature=1.0, seed=3, max_tokens=256), 256)
    t = fork.to_trajectory()
    t.validate()
    assert t.response_ids[:at] == branch.response_ids[:at] and not fork.active


def test_trajectory_jsonl_round_trip_and_errors(tmp_path):
    t = Trajectory(
        prompt_ids=[1, 2],
        response_ids=[3, 4, 5],
        loss_mask=[1, 0, 1],
        logprobs=[-0.1, 0.0, -2.0],
        entropy=[0.5, 0.0, 0.7],
        reward=1.0,
        components={"f1": 0.5, "calls_per_tool": {"python": 1}},
        group_id=3,
        task_id="x",
        lineage={"root_id": 0},
    )
    path = write_jsonl([t, t], tmp_path / "t.jsonl")
    back = read_jsonl(path)
    assert back == [t, t]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_jsonl(bad)
    bad.write_text('{"prompt_ids": [1], "response_ids": [2, 3], "loss_mask": [1], "logprobs": [0.0, 0.0]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: .*len\(loss_mask\)=1"):
        read_jsonl(bad)
    with pytest.raises(ValueError, match="logprobs must be 0.0 where loss_mask is 0"):
        Trajectory([1], [2], [0], [-1.0]).validate()


class QueuedTool(CalcTool):
    """Answers one call at a time, each taking `delay_s`: like a sandbox with a single worker, so
    results land one after another rather than together."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.queue_delay_s = delay_s
        self._one_at_a_time = asyncio.Lock()

    async def call(self, arg):
        async with self._one_at_a_time:
            await asyncio.sleep(self.queue_delay_s)
            return await super().call(arg)


async def test_tool_results_landing_in_a_stream_share_one_engine_call(hf_engine):
    tool = QueuedTool(delay_s=0.005)
    # results land 5 ms apart; the gathering window is wide so that a loaded machine's scheduling
    # delays do not split the stream (the default 20 ms is tuned for speed, not for such a test)
    trajs, rec, _ = await _run(hf_engine, tool=tool, params=SamplingParams(temperature=0, max_tokens=256),
                               batch_wait_s=0.2, batch_max_wait_s=5.0)
    first_prompts, _, first_segs = rec.calls[0]
    called = sum(seg.finish_reason == "stop" for seg in first_segs)
    assert called >= 4, "the warmed tiny model writes <python> calls for most prompts"
    # every branch whose first tool call was answered continues in the second engine call, not in
    # a call of its own started as soon as the first result came back
    assert len(rec.calls[1][0]) >= called - 1, [len(c[0]) for c in rec.calls]
    assert len(first_prompts) == len(trajs)


def test_every_lazy_export_of_the_package_exists():
    """`algorithms.rollout` exports its engines and the runner lazily, by name: a renamed class must
    not leave its old name behind (the runner's `Path` outlived its rename to `EpisodeBranch`)."""
    import importlib

    import algorithms.rollout as rollout

    missing = [f"{module}.{name}" for name, module in rollout._LAZY.items()
               if not hasattr(importlib.import_module(module), name)]  # fmt: skip
    assert not missing, f"algorithms.rollout exports names its modules do not define: {missing}"
    assert rollout.EpisodeBranch is EpisodeBranch
