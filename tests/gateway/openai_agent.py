"""An agent harness that knows nothing of agent-envs: the `openai` client and the standard library.

It stands for a user's existing agent: it runs Python itself and keeps a tag-protocol response
going with vLLM's `continue_final_message`, or talks in plain chat turns with `--chat-turns`.

    python openai_agent.py URL TASKS.json OUT.json [--chat-turns]

TASKS.json: [{"session", "system", "question", "max_turns", "reward"?}]; OUT.json gets each
session's final text. With "reward", the harness posts the session's reward when it ends: a
number, "length" (the final text's length mod 7, over 6: varied rewards for a training test) or
an env grader spec such as {"env": "AgentMath-v0", "index": 3}.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from openai import OpenAI


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=10)
    return (done.stdout or done.stderr).strip()


def continued_episode(client: OpenAI, task: dict) -> str:
    """One assistant message grown in place: sample, run the code, append the result, go on."""
    messages = [{"role": "system", "content": task["system"]}, {"role": "user", "content": task["question"]}]
    response = ""
    for _ in range(task["max_turns"]):
        extra = {"continue_final_message": True, "add_generation_prompt": False} if response else {}
        msgs = messages + ([{"role": "assistant", "content": response}] if response else [])
        reply = client.chat.completions.create(model="policy", messages=msgs, max_tokens=task.get("max_tokens", 64),
                                               temperature=task.get("temperature", 0.0), stop=["</python>"],
                                               extra_body=extra)
        response += reply.choices[0].message.content
        if not response.rstrip().endswith("</python>"):
            break
        code = response.rsplit("<python>", 1)[-1].rsplit("</python>", 1)[0]
        response += f" <result>\n{run_python(code)}\n</result>"
    return response


def chat_turn_episode(client: OpenAI, task: dict) -> str:
    """Tool results as new user turns: each call's prompt re-renders the earlier assistant turns."""
    messages = [{"role": "system", "content": task["system"]}, {"role": "user", "content": task["question"]}]
    text = ""
    for _ in range(task["max_turns"]):
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=task.get("max_tokens", 48),
                                               temperature=0.0, stop=["</python>"])
        text = reply.choices[0].message.content
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": "<result>\n1\n</result>"})
    return text


def main() -> None:
    url, tasks_file, out_file = sys.argv[1:4]
    chat_turns = "--chat-turns" in sys.argv
    finals = {}
    with open(tasks_file) as fh:
        tasks = json.load(fh)
    for task in tasks:
        client = OpenAI(base_url=f"{url}/s/{task['session']}/v1", api_key="unused")
        final = (chat_turn_episode if chat_turns else continued_episode)(client, task)
        finals[task["session"]] = final
        if "reward" in task:
            reward = task["reward"]
            body = {"reward": (len(final) % 7) / 6} if reward == "length" else (
                reward if isinstance(reward, dict) else {"reward": reward})
            post = urllib.request.Request(f"{url}/sessions/{task['session']}/reward", json.dumps(body).encode(),
                                          {"Content-Type": "application/json"})
            urllib.request.urlopen(post, timeout=60).close()
    with open(out_file, "w") as fh:
        json.dump(finals, fh)


if __name__ == "__main__":
    main()
