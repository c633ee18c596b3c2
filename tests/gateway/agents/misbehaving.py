"""Agent programs that go wrong, one per mode; the standard library only.

    python misbehaving.py crash|hang|silent|garbage|mixed|half [PID_DIR]

crash: calls the model once, then raises; hang: starts a grandchild (its pid written to
PID_DIR/<session>.pid), calls the model once and sleeps; silent: exits 0 without calling the
model; garbage: calls the model once and prints bytes that are not text; mixed: sample 0 of
each group answers with the model's reply, sample 1 crashes (even groups) or hangs (odd ones);
half: sample 0 answers, sample 1 crashes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request


def call_model() -> str:
    body = {"model": os.environ["AGENT_ENVS_MODEL"], "max_tokens": 8,
            "messages": [{"role": "user", "content": os.environ["AGENT_ENVS_TASK"]}]}
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json",
                                  "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(req, timeout=60) as reply:
        return json.load(reply)["choices"][0]["message"]["content"]


def main() -> None:
    mode = sys.argv[1]
    with open(os.environ["AGENT_ENVS_TASK_FILE"]) as fh:
        task = json.load(fh)
    if mode == "mixed":
        mode = "answer" if task["sample"] == 0 else "crash" if task["group"] % 2 == 0 else "hang"
    if mode == "half":
        mode = "answer" if task["sample"] == 0 else "crash"
    if mode == "silent":
        return
    if mode == "hang":
        pid_file = os.path.join(sys.argv[2], task["session"] + ".pid")
        # a grandchild: the shell's child, in the agent's process group
        subprocess.Popen(["sh", "-c", f"sleep 600 & echo $! > {pid_file}; wait"])
    reply = call_model()
    if mode == "crash":
        raise RuntimeError("the agent's own bug")
    if mode == "hang":
        time.sleep(600)
    if mode == "garbage":
        sys.stdout.buffer.write(b"\xff\xfe\x00garbage\x80")
    if mode == "answer":
        print(reply)


if __name__ == "__main__":
    main()
