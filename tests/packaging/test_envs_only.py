"""The environments need only the core dependencies: no torch, no transformers.

`pip install agent-envs` without extras must give working envs. This environment has every extra
installed, and a second one with the core dependencies alone would take minutes to build (and the
network), so the check runs in a subprocess whose first act is to put a finder at the front of
`sys.meta_path` that refuses the learner-side packages: any import of them, however indirect,
fails there as it would where they are not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BLOCKED = ("torch", "transformers", "accelerate", "vllm", "trl", "peft", "datasets")

CODE = """
import importlib.abc, json, sys

BLOCKED = set(sys.argv[1].split(","))
refused = []


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            refused.append(name)
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: core dependencies only)", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())

import gymnasium as gym
import agent_envs
from agent_envs.envs import FAMILY_ENVS

results = {}
for env_id, _, _ in FAMILY_ENVS.values():  # every id with a procedural world of its own
    env = gym.make(env_id)
    prompt, info = env.reset(seed=0)
    done = False
    for action in env.unwrapped.task.gold_trace:
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        if done:
            break
    results[env_id] = {"done": done, "terminated": terminated, "reward": reward, "prompt": bool(prompt),
                       "tool_calls": info["tool_calls"]}
    env.close()
loaded = sorted({m.split(".")[0] for m in sys.modules} & (BLOCKED | {"algorithms", "baselines"}))
print(json.dumps({"results": results, "loaded": loaded, "refused": sorted(set(refused))}))
"""


def test_every_world_env_plays_its_gold_trace_without_learner_packages(tmp_path):
    out = subprocess.run([sys.executable, "-c", CODE, ",".join(BLOCKED)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(report["results"]) >= {"AgentMath-v0", "AgentQA-v0", "AgentSearch-v0"}
    for env_id, r in report["results"].items():
        assert r["prompt"] and r["done"] and r["terminated"], (env_id, r)
        assert r["reward"] > 0 and r["tool_calls"] >= 1, (env_id, r)  # the gold trace uses the tools and wins
    assert report["loaded"] == [], report  # nothing learner-side was imported, not even by a fallback
