"""An agent written with the OpenAI Agents SDK (`openai-agents`, pinned in test_agent_source.py),
as a user would write it; it knows nothing of agent-envs but the task file's layout.

`rollout_source: agent` runs it once per sample: the SDK's `AsyncOpenAI` client finds the
learner's gateway session in OPENAI_BASE_URL and OPENAI_API_KEY, the task is in the JSON file
named by AGENT_ENVS_TASK_FILE, and its final output goes to stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI


@function_tool
def python(code: str) -> str:
    """Run a Python program and return what it prints.

    Args:
        code: the program's source.
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=10)
    return (done.stdout or done.stderr).strip()


def main() -> None:
    with open(os.environ["AGENT_ENVS_TASK_FILE"]) as fh:
        task = json.load(fh)
    set_tracing_disabled(True)  # nothing leaves the machine
    model = OpenAIChatCompletionsModel(model=os.environ["AGENT_ENVS_MODEL"], openai_client=AsyncOpenAI())
    agent = Agent(name="solver", instructions=task["system"], tools=[python], model=model,
                  model_settings=ModelSettings(temperature=1.0))
    result = Runner.run_sync(agent, task["question"], max_turns=3)
    print(result.final_output)


if __name__ == "__main__":
    main()
