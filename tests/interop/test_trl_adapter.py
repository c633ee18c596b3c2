"""The TRL adapter without TRL: its tool methods, the schema TRL reads from them, and gold episodes
played through them, locally and against a real env server."""

from __future__ import annotations

import inspect
import re

import gymnasium as gym
import pytest
from transformers.utils import get_json_schema

import agent_envs  # noqa: F401  (registers the env ids)
from agent_envs.interop.trl import ENDED, TrlEnv, answer, env_reward, trl_environment
from agent_envs.remote.env_client import EnvServerError
from tests.server.env_server_helpers import serving


def gold(env_id: str, seed: int) -> tuple[str, list[str], str]:
    """The task's question, the code of its gold trace's python calls, and its gold answer text."""
    env = gym.make(env_id)
    env.reset(seed=seed)
    task = env.unwrapped.task
    env.close()
    trace = "".join(task.gold_trace)
    answer = re.search(r"<answer>(.*?)</answer>", trace, re.S).group(1)
    return task.question, re.findall(r"<python>(.*?)</python>", trace, re.S), answer


def test_each_tool_is_a_typed_documented_method_trl_can_read():
    cls = trl_environment("AgentMath-v0")
    assert issubclass(cls, TrlEnv) and cls.env_id == "AgentMath-v0"
    public = {n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction) if not n.startswith("_")}
    assert public == {"reset", "python"}, "TRL offers every public method but reset as a tool"
    env = cls()
    assert str(inspect.signature(env.python)) == "(code: str) -> str"
    schema = get_json_schema(env.python)["function"]  # what TRL renders into the prompt
    assert schema["name"] == "python" and schema["description"].startswith("Runs Python code")
    assert schema["parameters"]["properties"] == {"code": {"type": "string", "description": "the code to give the python tool."}}
    assert schema["parameters"]["required"] == ["code"]
    env.env.close()


def test_search_world_gets_search_and_browse_methods():
    env = trl_environment("AgentSearch-v0")()
    for name, argument in (("search", "query"), ("browse", "url")):
        assert str(inspect.signature(getattr(env, name))) == f"({argument}: str) -> str"
        assert get_json_schema(getattr(env, name))["function"]["parameters"]["required"] == [argument]
    env.env.close()


def test_a_gold_episode_played_through_the_methods_earns_reward_1():
    question, code, gold_answer = gold("AgentMath-v0", seed=3)
    envs = [trl_environment("AgentMath-v0")() for _ in range(2)]
    for env in envs:
        assert env.reset(seed=3).endswith(question)
        assert "\\boxed{}" in env.reset(seed=3)
        outputs = [env.python(code=c) for c in code]
        assert outputs and all(o.strip() and "<tool_response>" not in o for o in outputs), outputs
        assert env.tool_calls == len(code)
    completions = [[{"role": "assistant", "content": gold_answer}], [{"role": "assistant", "content": "\\boxed{-1}"}]]
    assert env_reward(completions=completions, environments=envs) == [1.0, 0.0]
    assert envs[0].info["correct"] == 1.0
    assert envs[0].python(code="print(1)") == ENDED and answer(envs[0], "again") == 1.0, "graded once"
    for env in envs:
        env.env.close()


def test_the_row_s_index_picks_the_task_and_a_message_with_no_answer_scores_as_cut_off():
    env = trl_environment("AgentMath-v0", max_tool_calls=1)()
    tasks = gym.make("AgentMath-v0").unwrapped.tasks
    assert env.reset(index=5, prompt=[]).endswith(tasks[5].question)
    assert env.python(code="print(2)").strip() == "2"
    assert answer(env, "no idea") <= 0.0 and env.info["correct"] == 0.0
    env.env.close()


def test_the_same_gold_episode_against_serve_env_earns_reward_1():
    question, code, gold_answer = gold("AgentMath-v0", seed=3)
    with serving("AgentMath-v0") as (url, server):
        cls = trl_environment("AgentMath-v0", url=url)
        env = cls()
        assert env.reset(seed=3).endswith(question)
        assert [env.python(code=c) for c in code] == _local_outputs(code), "the tools run on the server alike"
        assert env_reward(completions=[gold_answer], environments=[env]) == [1.0]
        env.env.close()
    with pytest.raises(EnvServerError, match="serves AgentQA-v0, not AgentMath-v0"), serving("AgentQA-v0") as (url, _):
        trl_environment("AgentMath-v0", url=url)


def _local_outputs(code: list[str]) -> list[str]:
    env = trl_environment("AgentMath-v0")()
    env.reset(seed=3)
    outputs = [env.python(code=c) for c in code]
    env.env.close()
    return outputs
