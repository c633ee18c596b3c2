"""An agent on the plain `openai` client and the standard library, knowing nothing of agent-envs
but the task file's layout (docs/interop.md, "Training an agent program").

It keeps a tag-protocol response going: sample until a stop string, run the `<python>` code
itself, append the result and continue the same assistant message (vLLM's
`continue_final_message`, which the gateway speaks), for at most three calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from openai import OpenAI


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=10)
    return (done.stdout or done.stderr).strip()


def main() -> None:
    with open(os.environ["AGENT_ENVS_TASK_FILE"]) as fh:
        task = json.load(fh)
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY name the learner's gateway session
    response = ""
    for _ in range(3):
        extra = {"continue_final_message": True, "add_generation_prompt": False} if response else {}
        messages = task["messages"] + ([{"role": "assistant", "content": response}] if response else [])
        reply = client.chat.completions.create(model=task["model"], messages=messages, stop=task["stop"],
                                               temperature=1.0, extra_body=extra)
        response += reply.choices[0].message.content
        if not response.rstrip().endswith("</python>"):
            break
        code = response.rsplit("<python>", 1)[-1].rsplit("</python>", 1)[0]
        response += f" <result>\n{run_python(code)}\n</result>"
    print(response)


if __name__ == "__main__":
    main()
