"""Agent programs as the rollout: `rollout_source: agent` in a learner's config.

For every sample of a step (each prompt draw, `group_size` times) the learner starts
`agent.command`, a program of any kind that talks to an OpenAI-compatible endpoint, pointed at
a session of the learner's own gateway (`algorithms.gateway.server`, serving the policy being
trained, on a free port of 127.0.0.1 while the step collects). When the program exits, the
session's stitched tokens become the sample's trajectory, its final answer (the session's last
assistant message, or with `agent.answer: stdout` what the program printed) is graded by the
env's own grader, and the step trains GRPO or DAPO groups on them as on env rollouts.

    agent-envs train --algo grpo model=tiny rollout_source=agent agent.command='python my_agent.py'

What a run is given (docs/interop.md, "Training an agent program"):

    >>> env = agent_environ("http://127.0.0.1:8201/s/agent-0-1-0-ab12/v1", "agent-0-1-0-ab12", "tiny",
    ...                     "What is 2+3?", "/tmp/run/task.json", "/tmp/run/scratch")
    >>> sorted(env)
    ['AGENT_ENVS_MODEL', 'AGENT_ENVS_TASK', 'AGENT_ENVS_TASK_FILE', 'OPENAI_API_KEY', 'OPENAI_BASE_URL', 'TMPDIR']

A run that exits non-zero, outlives `agent.timeout_s`, never calls the model or (answer: stdout)
prints no usable answer is a failed sample: reward `agent.failure_reward`, its cause in the
trajectory's `end_reason` and `agent_error` component (the run viewer shows both) and in the log,
and the step goes on. Every run is its own process group, killed whole when the run ends (its
children and grandchildren too), and its scratch folder is removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_envs.server.serving import InThread
from algorithms.gateway.server import Gateway
from algorithms.gateway.sessions import Session, to_trajectories
from algorithms.gateway.training import Gate

log = logging.getLogger(__name__)

_TAIL = 4096  # bytes of stderr kept per run: the cause of a crash is near its end
_SHORT = 80  # characters of a failure's cause in its trajectory
_GRACE_S = 2.0  # between SIGTERM and SIGKILL of a run that timed out

# end_reason of a failed run
CRASHED, TIMEOUT, NO_CALLS, BAD_OUTPUT = "agent_crashed", "agent_timeout", "agent_no_model_calls", "agent_bad_output"


def agent_environ(base_url: str, session: str, model: str, question: str, task_file: str,
                  scratch: str) -> dict[str, str]:
    """The variables a run gets on top of the learner's environment."""
    return {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": session, "AGENT_ENVS_MODEL": model,
            "AGENT_ENVS_TASK": question, "AGENT_ENVS_TASK_FILE": task_file, "TMPDIR": scratch}


def parse_command(command: str) -> list[str]:
    """`agent.command` as an argument list whose program exists; errors name the field."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"config field 'agent.command': cannot split {command!r} into arguments ({exc})") from None
    if not argv:
        raise ValueError("config field 'agent.command': names no program; give e.g. 'python my_agent.py'")
    found = shutil.which(argv[0])
    if found is None:
        raise ValueError(f"config field 'agent.command': {argv[0]!r} is neither an executable file nor a program "
                         "on PATH")
    # absolute (runs may start elsewhere) but not resolved: a venv's python is a link that must stay one
    return [os.path.abspath(found) if os.sep in argv[0] else argv[0], *argv[1:]]


class _Capture(threading.Thread):
    """Drains one pipe of a run: keeps its first `head` bytes and its last `_TAIL`, counts the rest
    (a program printing without end neither blocks on a full pipe nor fills memory)."""

    def __init__(self, stream: Any, head: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.limit = stream, head
        self.head, self.tail, self.total = bytearray(), bytearray(), 0
        self.start()

    def run(self) -> None:
        with self.stream:
            while chunk := self.stream.read1(65536):
                self.total += len(chunk)
                if len(self.head) < self.limit:
                    self.head += chunk[: self.limit - len(self.head)]
                self.tail = (self.tail + chunk)[-_TAIL:]


@dataclass
class AgentRun:
    """One program run on one sample: how it ended and what it printed."""

    session: str
    index: int  # the env's task index
    group_id: int
    sample: int
    returncode: int | None = None
    failure: str = ""  # an end_reason above, "" when the run succeeded
    cause: str = ""  # the failure in a line, for the log and the viewer
    stdout: bytes = b""
    stdout_bytes: int = 0
    stderr_tail: str = ""
    seconds: float = 0.0
    env: Any = None  # the sample's env, reset on its task: it grades the answer
    task: dict[str, Any] = field(default_factory=dict)  # what the program is told (task.json)
    prompt_ids: list[int] = field(default_factory=list)


def _end_group(proc: subprocess.Popen, grace_s: float) -> None:
    """Stop every process of the run's group: politely when the leader still runs, then for sure."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    with contextlib.suppress(ProcessLookupError):  # children it left behind, a leader that ignored SIGTERM
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class AgentSource:
    """Runs `agent.command` per sample against the learner's own gateway and turns the runs into
    trajectories (the learner's `rollout` with `rollout_source: agent`)."""

    def __init__(self, engine: Any, env_factory: Callable[[], Any], tokenizer: Any, agent: Any, *,
                 env_id: str = "", model_name: str = "policy", max_response_tokens: int | None = None) -> None:
        self.cfg = agent
        self.argv = parse_command(agent.command)
        self.env_factory, self.env_id, self.tokenizer, self.model_name = env_factory, env_id, tokenizer, model_name
        self._next_traj_id = 0
        self.url = ""  # the gateway of the last step (closed when the step's runs are done)
        self.gateway = Gateway(engine, model_name=model_name, max_response_tokens=max_response_tokens)
        self.gateway.gate = self.gate = Gate()
        self.last_failures: dict[str, int] = {}

    def rollout(self, draws: Sequence[Any], group_size: int) -> list[Any]:
        """A trajectory per (draw, sample), in draw order, `group_size` per draw."""
        tag = uuid.uuid4().hex[:6]
        runs = [AgentRun(f"agent-{tag}-{d.group_id}-{k}", d.index, d.group_id, k)
                for d in draws for k in range(group_size)]
        for run in runs:  # here, not in the runs' threads: the tokenizer is shared
            self._prepare(run)
        # the gateway listens only while runs may call it: between steps no port is held, and no
        # call can reach the weights while they update
        served = InThread(self.gateway, "127.0.0.1", 0, name="agent-envs-agent-gateway")
        self.url = served.url
        try:
            self.gate.open()
            try:
                with ThreadPoolExecutor(self.cfg.concurrency, thread_name_prefix="agent-run") as pool:
                    list(pool.map(lambda run: self._play(run, served.url), runs))
            finally:
                self.gate.close()  # every call made so far is recorded in its session
        finally:
            served.close()
        try:
            trajs = [self._trajectory(run) for run in runs]
        finally:
            for run in runs:
                if run.env is not None:
                    run.env.close()
        self.last_failures = {}
        for run in runs:
            if run.failure:
                self.last_failures[run.failure] = self.last_failures.get(run.failure, 0) + 1
        if self.last_failures:
            log.warning("agent runs: %d of %d failed (%s)", sum(self.last_failures.values()), len(runs),
                        ", ".join(f"{n} {why}" for why, n in sorted(self.last_failures.items())))
        return trajs

    # -- one run --------------------------------------------------------------------------------

    def _prepare(self, run: AgentRun) -> None:
        """The sample's env, reset on its task, and the task as the program will read it."""
        env = run.env = self.env_factory()
        _, info = env.reset(seed=run.group_id, options={"index": run.index})
        run.prompt_ids = list(info.get("prompt_token_ids") or [])
        messages = [dict(m) for m in info["messages"]]
        run.task = {"env": self.env_id, "index": run.index, "task_id": info.get("task_id"), "group": run.group_id,
                    "sample": run.sample,
                    "question": env.state.task.question, "messages": messages,
                    "system": next((m["content"] for m in messages if m.get("role") == "system"), ""),
                    "stop": list(info.get("stop_sequences") or []), "session": run.session,
                    "model": self.model_name}

    def _play(self, run: AgentRun, url: str) -> None:
        """Start the program on its task, wait for it (or kill it), and keep what it printed."""
        base_url = f"{url}/s/{run.session}/v1"
        question = run.task["question"]
        folder = Path(tempfile.mkdtemp(prefix="agent-envs-run-"))
        try:
            scratch = folder / "scratch"
            scratch.mkdir()
            task_file = folder / "task.json"
            task_file.write_text(json.dumps({**run.task, "base_url": base_url}, indent=1))
            (folder / "stdin.txt").write_text(question)
            environ = {**os.environ, **{str(k): str(v) for k, v in self.cfg.env.items()},
                       **agent_environ(base_url, run.session, self.model_name, question, str(task_file),
                                       str(scratch))}
            self._wait(run, folder / "stdin.txt", environ)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _wait(self, run: AgentRun, stdin_file: Path, environ: dict[str, str]) -> None:
        start = time.monotonic()
        try:
            with open(stdin_file, "rb") as stdin:
                # its own session and process group: one killpg reaches everything it started
                proc = subprocess.Popen(self.argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env=environ, start_new_session=True)
        except OSError as exc:  # not executable, a task too long for the environment (E2BIG), ...
            run.failure, run.cause = CRASHED, f"could not start: {exc}"
            return
        out = _Capture(proc.stdout, self.cfg.max_output_bytes)
        err = _Capture(proc.stderr, 0)
        try:
            run.returncode = proc.wait(self.cfg.timeout_s)
        except subprocess.TimeoutExpired:
            run.failure, run.cause = TIMEOUT, f"still running after {self.cfg.timeout_s:g} s; killed"
        finally:
            _end_group(proc, _GRACE_S)
            out.join(10)
            err.join(10)
        run.seconds = time.monotonic() - start
        run.stdout, run.stdout_bytes = bytes(out.head), out.total
        run.stderr_tail = err.tail.decode("utf-8", "replace")
        if not run.failure and run.returncode != 0:
            rc = run.returncode
            how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with {rc}"
            last = next((ln.strip() for ln in reversed(run.stderr_tail.splitlines()) if ln.strip()), "")
            run.failure, run.cause = CRASHED, f"{how}: {last}" if last else how

    # -- its trajectory -------------------------------------------------------------------------

    def _answer(self, run: AgentRun, session: Session) -> str | None:
        """The run's final answer, or None with the run marked failed."""
        if self.cfg.answer == "message":
            traj = session.trajectories[-1]
            start = traj.segment_starts[-1] if traj.segment_starts else 0
            return self.tokenizer.decode(traj.response_ids[start:], skip_special_tokens=True)
        if run.stdout_bytes > self.cfg.max_output_bytes:
            why = f"printed {run.stdout_bytes} bytes, more than agent.max_output_bytes={self.cfg.max_output_bytes}"
        else:
            try:
                text = run.stdout.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                why = f"printed bytes that are not UTF-8 text (at byte {exc.start})"
            else:
                if text and "\x00" not in text:
                    return text
                why = "printed no answer" if not text else "printed NUL bytes"
        run.failure, run.cause = BAD_OUTPUT, why
        return None

    def _trajectory(self, run: AgentRun) -> Any:
        from algorithms.rollout.trajectory import Trajectory

        session = self.gateway.forget(run.session)
        calls = session.calls if session is not None else 0
        if not run.failure and calls == 0:
            run.failure, run.cause = NO_CALLS, "exited without calling the model"
        answer = None if run.failure or session is None else self._answer(run, session)
        if session is not None and calls:
            [*_, traj] = to_trajectories([session])  # its last branch: the one that ends in the answer
            branches, drift = len(session.trajectories), len(session.drift)
        else:  # nothing sampled: the task's prompt and one observed token, no token to train
            eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
            traj = Trajectory(prompt_ids=run.prompt_ids, response_ids=[eos], loss_mask=[0], logprobs=[0.0])
            branches = drift = 0
        if answer is not None:
            _, reward, terminated, truncated, info = run.env.step(answer)
            components = {k: v for k, v in info.items() if isinstance(v, (int, float, str, bool)) or v is None}
            cut = bool(truncated) or traj.finish_reason == "length"  # the env's limits, or the session's budget
            traj.end_reason, traj.terminated, traj.truncated = "agent_answer", bool(terminated) and not cut, cut
        else:
            # the viewer's table shows short strings: the whole cause is in the log
            short = run.cause if len(run.cause) <= _SHORT else run.cause[: _SHORT - 3] + "..."
            reward, components = self.cfg.failure_reward, {"agent_error": short}
            traj.end_reason, traj.terminated, traj.truncated = run.failure, False, False
            log.warning("agent run %s (task %d, sample %d) failed: %s%s", run.session, run.index, run.sample,
                        run.cause, f"\n--- its stderr, last lines ---\n{run.stderr_tail}" if run.stderr_tail else "")
        traj.reward, traj.components, traj.group_id = float(reward), components, run.group_id
        traj.task_id, traj.traj_id = str(run.task.get("task_id") or run.index), self._next_traj_id
        self._next_traj_id += 1
        traj.response_text = self.tokenizer.decode(traj.response_ids, skip_special_tokens=False)
        traj.lineage = {"session": run.session, "sample": run.sample, "agent_exit": run.returncode,
                        "agent_seconds": round(run.seconds, 3), "calls": calls, "branches": branches,
                        "drift": drift}
        return traj


__all__ = ["AgentRun", "AgentSource", "agent_environ", "parse_command"]
