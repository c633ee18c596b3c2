"""The registered ids: Gymnasium's env checker, make/make_vec, the CLI's list and play."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agent_envs  # noqa: F401
from agent_envs.core.vector import ToolVectorEnv

IDS = ["AgentMath-v0", "AgentQA-v0", "AgentSearch-v0"]


@pytest.mark.parametrize("env_id", IDS)
def test_env_checker_passes(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("env_id", IDS)
def test_gold_trace_through_make(env_id):
    env = gym.make(env_id)
    for seed in range(3):
        env.reset(seed=seed)
        for action in env.unwrapped.task.gold_trace:
            obs, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated) == (1.0, True, False), info


def test_make_with_module_prefix_needs_no_import():
    code = "import gymnasium as gym; env = gym.make('agent_envs:AgentSearch-v0'); print(env.reset(seed=0)[1]['task_id'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_instances_share_tools_and_worlds():
    a, b = gym.make("AgentQA-v0").unwrapped, gym.make("AgentQA-v0").unwrapped
    assert a.tasks is b.tasks and a.tools["search"] is b.tools["search"]
    c = gym.make("AgentQA-v0", world={"seed": 1}).unwrapped
    assert c.tasks is not a.tasks


def test_make_vec_sync_and_tool_vector_env():
    sync = gym.make_vec("AgentMath-v0", num_envs=3, vectorization_mode="sync")
    sync.reset(seed=0)
    answers = [e.unwrapped.task.gold_trace[0] for e in sync.envs]
    obs, rew, term, trunc, _ = sync.step(answers)
    assert all(o.startswith(" <result>") for o in obs) and not term.any()
    venv = ToolVectorEnv.make("AgentSearch-v0", num_envs=4, autoreset=False)
    venv.reset(seed=0)
    traces = [e.unwrapped.task.gold_trace for e in venv.envs]
    final = [0.0] * 4
    for step in range(max(map(len, traces))):
        # episodes of different lengths: finished ones are skipped with None
        obs, rew, term, trunc, infos = venv.step([t[step] if step < len(t) else None for t in traces])
        for i, t in enumerate(traces):
            if step == len(t) - 1:
                assert term[i] and not trunc[i]
                final[i] = rew[i]
    assert final == [1.0] * 4


def test_cli_list_and_play():
    out = subprocess.run([sys.executable, "-m", "agent_envs.cli", "list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for env_id in IDS:
        assert env_id in out.stdout
    env = gym.make("AgentMath-v0")
    env.reset(seed=4)
    script = "\n\n".join(env.unwrapped.task.gold_trace) + "\n\n"
    out = subprocess.run([sys.executable, "-m", "agent_envs.cli", "play", "AgentMath-v0", "--seed", "4"],
                         input=script, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "<result>" in out.stdout and "[terminated] reward=1" in out.stdout


def test_benchmark_ids_are_listed_and_play_real_data(shared_data):
    from agent_envs.data import BENCHMARKS

    registered = set(gym.registry)
    assert {spec.env_id for spec in BENCHMARKS.values()} <= registered
    env = gym.make("AgentQA-HotpotQA-v0")  # BM25 over the shared multi-hop corpus
    env.reset(options={"index": 0})
    obs, *_ = env.step("<think>x</think><search>Meet Corliss Archer</search>")
    assert "Corliss Archer" in obs
    parity = gym.make("AgentQA-ARPO-RL-v0").unwrapped
    assert sorted(parity.tools) == ["python", "search"] and parity.max_tool_calls == 3


def test_own_data_file_and_clear_errors(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"id": "a", "question": "What is 2+2?", "golden_answers": ["4"]}\n')
    env = gym.make("AgentMath-v0", data_files=str(path))
    env.reset()
    assert env.step("<think>x</think><answer>\\boxed{4}</answer>")[1] == 1.0
    with pytest.raises(FileNotFoundError, match="corpus"):
        gym.make("AgentQA-v0", data_files=str(path), corpus=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="not both"):
        gym.make("AgentMath-v0", data_files=str(path), tasks=[])
