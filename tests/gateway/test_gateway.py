"""The training gateway, driven by an agent that only speaks the `openai` client (a subprocess).

The engine is the real HF engine on the locally built tiny model; the agent harness
(`openai_agent.py`) imports nothing of this project.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agent_envs.server.serving import InThread
from algorithms.gateway.server import Gateway
from algorithms.gateway.sessions import SessionLog, to_trajectories
from algorithms.models.tiny import WARMUP_SYSTEM_PROMPT, build_tiny_model

AGENT = Path(__file__).with_name("openai_agent.py")


class RecordingEngine:
    """The real engine, with every request and what it sampled kept for comparison."""

    def __init__(self, engine):
        self.engine, self.tokenizer, self.calls = engine, engine.tokenizer, []

    async def agenerate(self, prompts, params):
        segments = await self.engine.agenerate(prompts, params)
        self.calls += [(list(p), list(s.token_ids)) for p, s in zip(prompts, segments, strict=True)]
        return segments


@pytest.fixture(scope="module")
def engine():
    import torch

    from algorithms.rollout.hf import HFEngine

    torch.set_num_threads(1)
    return HFEngine(build_tiny_model(seed=0, warmup_steps=150), seed=0)


def post(url: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def run_agent(url: str, tasks: list[dict], tmp_path: Path, *extra: str) -> dict:
    (tmp_path / "tasks.json").write_text(json.dumps(tasks))
    out = tmp_path / "finals.json"
    done = subprocess.run([sys.executable, str(AGENT), url, str(tmp_path / "tasks.json"), str(out), *extra],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def math_tasks(n: int, prefix: str = "s") -> tuple[list[dict], list[int]]:
    import gymnasium as gym

    import agent_envs  # noqa: F401

    env = gym.make("AgentMath-v0")
    tasks, indices = [], []
    for i in range(n):
        env.reset(seed=i, options={"index": i})
        tasks.append({"session": f"{prefix}{i}", "system": WARMUP_SYSTEM_PROMPT,
                      "question": env.unwrapped.task.question, "max_turns": 3})
        indices.append(i)
    return tasks, indices


@pytest.mark.slow
def test_stitched_trajectories_hold_exactly_the_engines_tokens(engine, tmp_path):
    recorder = RecordingEngine(engine)
    running = InThread(Gateway(recorder))
    try:
        tasks, indices = math_tasks(3)
        run_agent(running.url, tasks, tmp_path)
        for task, index in zip(tasks, indices, strict=True):
            status, graded = post(f"{running.url}/sessions/{task['session']}/reward",
                                  {"env": "AgentMath-v0", "index": index})
            assert status == 200 and "correct" in graded["components"]
        sessions = running.server.sessions
        assert sessions.drift_report() == []
        multi_call = 0
        for task in tasks:
            session = sessions.get(task["session"])
            [traj] = session.trajectories  # continuing one assistant message never breaks the prefix
            multi_call += traj.calls > 1
            mine = [(p, s) for p, s in recorder.calls if p[: len(traj.prompt_ids)] == traj.prompt_ids]
            assert len(mine) == traj.calls
            for (prompt, sampled), start in zip(mine, traj.segment_starts, strict=True):
                assert prompt == traj.ids[: len(traj.prompt_ids) + start]  # generated from the stitched ids
                assert traj.response_ids[start : start + len(sampled)] == sampled  # kept as sampled
                assert traj.loss_mask[start : start + len(sampled)] == [1] * len(sampled)
            observed = [i for i, m in enumerate(traj.loss_mask) if m == 0]
            text = engine.tokenizer.decode([traj.response_ids[i] for i in observed])
            assert ("<result>" in text) == (traj.calls > 1)
        assert multi_call, "no episode called the tool: the test saw no stitching"
        trajs = to_trajectories([sessions.get(t["session"]) for t in tasks])
        for t, task in zip(trajs, tasks, strict=True):
            t.validate()
            [traj] = sessions.get(task["session"]).trajectories
            observed = engine.tokenizer.decode([i for i, m in zip(t.response_ids, t.loss_mask, strict=True) if not m])
            assert t.tool_calls == traj.calls - 1 == observed.count("<result>")  # each result fed back once
        assert len({t.group_id for t in trajs}) == 3  # three different prompts: three groups
    finally:
        running.close()


def strip_think(template: str) -> str:
    """The tiny template, changed the way Qwen3's is: earlier assistant turns lose their <think>."""
    plain = "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    assert plain in template
    stripped = ("{%- if message['role'] == 'assistant' and not loop.last %}"
                "{{- '<|im_start|>assistant\\n' + message['content'].split('</think>')[-1].lstrip() + '<|im_end|>\\n' }}"
                "{%- else %}" + plain + "{%- endif %}")
    return template.replace(plain, stripped)


@pytest.mark.parametrize("strips", [False, True], ids=["prefix-keeping", "think-stripping"])
def test_drift_report_catches_a_template_that_breaks_the_prefix(engine, tmp_path, strips):
    import copy

    recorder = RecordingEngine(engine)
    if strips:
        recorder.tokenizer = copy.copy(engine.tokenizer)
        recorder.tokenizer.chat_template = strip_think(engine.tokenizer.chat_template)
    running = InThread(Gateway(recorder))
    try:
        tasks, _ = math_tasks(2, prefix="chat")
        finals = run_agent(running.url, tasks, tmp_path, "--chat-turns")
        assert all("<think>" in f for f in finals.values()), "the model wrote no <think>: nothing to strip"
        drift = running.server.sessions.drift_report()
        if strips:
            assert drift and all(d["session"].startswith("chat") for d in drift)
            # the texts part where the earlier turn lost its reasoning
            assert any("</think>" in d["expected"] and "</think>" not in d["got"][:20] for d in drift), drift
        else:
            assert drift == []
    finally:
        running.close()


def test_bad_requests_get_a_reason_and_the_gateway_keeps_serving(engine):
    running = InThread(Gateway(engine))
    try:
        base = running.url + "/s/x/v1/chat/completions"
        assert post(base, b"{not json")[0] == 400
        status, body = post(base, {"messages": [{"role": "user", "content": "hi"}], "n": 2})
        assert status == 400 and "n must be 1" in body["error"]["message"]
        assert post(base, {"messages": "hi"})[0] == 400
        status, body = post(running.url + "/sessions/nobody/reward", {"reward": 1})
        assert status == 404 and "nobody" in body["error"]["message"]
        status, body = post(base, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert status == 200 and len(body["choices"][0]["token_ids"]) <= 2
        status, body = post(running.url + "/sessions/x/reward", {"reward": "high"})
        assert status == 400
    finally:
        running.close()


def test_take_waits_for_rewarded_sessions_and_groups_by_prompt():
    log = SessionLog()
    for name, prompt in [("a", "p1"), ("b", "p1"), ("c", "p2")]:
        s = log.session(name)
        traj, ids = s.prompt_ids(prompt, lambda t: [ord(c) for c in t])
        s.record(traj, ids, [7], [-0.5], "x")
    with pytest.raises(TimeoutError, match="0 of 2 sessions rewarded"):
        log.take(2, timeout_s=0.05)
    threading.Timer(0.05, lambda: [log.set_reward(n, r) for n, r in (("a", 1.0), ("b", 0.0), ("c", 1.0))]).start()
    taken = log.take(3, timeout_s=5)
    trajs = to_trajectories(taken)
    assert [t.group_id for t in trajs] == [0, 0, 1] and [t.reward for t in trajs] == [1.0, 0.0, 1.0]
    assert log.names() == []


@pytest.mark.slow
def test_the_gateway_command_serves_an_openai_client(tmp_path):
    import os
    import signal
    import time

    from tests.servers import REPO, free_port

    port = free_port()
    log = tmp_path / "gateway.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "agent_envs.cli", "gateway", "--model", "tiny", "--engine", "hf",
                                 "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.3)
        from openai import OpenAI

        client = OpenAI(base_url=url + "/v1", api_key="session-7")  # the key names the session
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert reply.choices[0].finish_reason in ("stop", "length")
        with urllib.request.urlopen(url + "/sessions/session-7", timeout=10) as r:
            assert json.load(r)["calls"] == 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_text_between_calls_is_masked_as_observation():
    """Two calls of one chat, the tool result fed back between them: the sampled ids stay as
    sampled with mask 1, the text the agent added (rendered by the real chat template) is
    tokenized once with mask 0 and log-prob 0, and the learner's trajectory keeps that mask."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_model(seed=0))

    def tokenize(text):
        return tok.encode(text, add_special_tokens=False)

    def render(messages):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    chat = [{"role": "system", "content": WARMUP_SYSTEM_PROMPT}, {"role": "user", "content": "What is 6*7?"}]
    session = SessionLog().session("agent")
    first = "<think> compute </think> <python>print(6*7)</python>"
    traj, ids = session.prompt_ids(render(chat), tokenize)
    sampled_1 = tokenize(first)
    session.record(traj, ids, sampled_1, [-0.5] * len(sampled_1), first)
    chat += [{"role": "assistant", "content": first}, {"role": "user", "content": "<result>42</result>"}]
    rendered = render(chat)
    between = rendered[len(traj.full_text):]
    assert "<result>42</result>" in between and between.startswith("<|im_end|>")
    again, ids = session.prompt_ids(rendered, tokenize)
    assert again is traj and ids == traj.prompt_ids + sampled_1 + tokenize(between)  # the next call's prompt
    sampled_2 = tokenize("<answer> \\boxed{42} </answer>")
    session.record(traj, ids, sampled_2, [-0.25] * len(sampled_2), "<answer> \\boxed{42} </answer>")

    observed = tokenize(between)
    assert traj.response_ids == sampled_1 + observed + sampled_2
    assert traj.loss_mask == [1] * len(sampled_1) + [0] * len(observed) + [1] * len(sampled_2)
    assert traj.logprobs == [-0.5] * len(sampled_1) + [0.0] * len(observed) + [-0.25] * len(sampled_2)
    assert traj.segment_starts == [0, len(sampled_1) + len(observed)]
    assert (traj.calls, traj.observations, session.drift) == (2, 1, [])
    session.reward = 1.0
    [learner_traj] = to_trajectories([session])
    learner_traj.validate()
    assert learner_traj.loss_mask == traj.loss_mask and learner_traj.tool_calls == 1
