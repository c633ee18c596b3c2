"""An agent written with Hugging Face's `smolagents` (pinned in test_agent_source.py), as a user
would write it; it knows nothing of agent-envs but the task file's layout.

`rollout_source: agent` runs it once per sample: its `OpenAIServerModel` talks to the learner's
gateway session named by OPENAI_BASE_URL and OPENAI_API_KEY; the system prompt is the task's
own (the library's default, with its worked examples, is longer than a small model's context);
one tool-calling step, then the library asks the model for its final answer.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import subprocess
import sys

import yaml
from smolagents import OpenAIServerModel, ToolCallingAgent, tool


@tool
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
    templates = yaml.safe_load(importlib.resources.files("smolagents.prompts").joinpath(
        "toolcalling_agent.yaml").read_text())
    templates["system_prompt"] = task["system"]
    model = OpenAIServerModel(model_id=os.environ["AGENT_ENVS_MODEL"], api_base=os.environ["OPENAI_BASE_URL"],
                              api_key=os.environ["OPENAI_API_KEY"], temperature=1.0)
    agent = ToolCallingAgent(tools=[python], model=model, prompt_templates=templates, max_steps=1,
                             verbosity_level=0)
    print(agent.run(task["question"]))


if __name__ == "__main__":
    main()
