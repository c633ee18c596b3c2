"""Sessions of the training gateway: every model call recorded in tokens, stitched into trajectories.

An agent talks to the gateway with the plain `openai` client; each call's prompt arrives as chat
messages, rendered to text by the chat template. The gateway never re-tokenizes what the model
sampled. It keeps, per trajectory, the exact text and token ids seen so far; a call whose rendered
prompt starts with that text continues the trajectory: only the new text (tool results, user
turns) is tokenized, masked as observation, and the model generates from exactly the stitched
ids. A call that does not extend any trajectory of its session (a template that strips earlier
`<think>` blocks, say) starts a new branch from a fresh tokenization and is counted in the drift
report, with where the texts part.

    >>> log = SessionLog()
    >>> s = log.session("agent-1")
    >>> t, ids = s.prompt_ids("<u>hi</u><a>", lambda text: [ord(c) for c in text])
    >>> s.record(t, ids, completion_ids=[111, 107], logprobs=[-0.1, -0.2], completion_text="ok")
    >>> t, ids = s.prompt_ids("<u>hi</u><a>ok<t>5</t><a>", lambda text: [ord(c) for c in text])
    >>> s.record(t, ids, completion_ids=[33], logprobs=[-0.3], completion_text="!")
    >>> [traj] = s.trajectories
    >>> traj.loss_mask, s.drift  # sampled, the 11 characters of "<t>5</t><a>" observed, sampled
    ([1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], [])
    >>> traj.calls, traj.observations
    (2, 1)
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Tokenize = Callable[[str], list[int]]


@dataclass
class StitchedTrajectory:
    """One branch of a session: the first prompt, then alternating observation and sampled tokens."""

    prompt_text: str
    prompt_ids: list[int]
    text: str = ""  # everything after the prompt, as the model saw it
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segment_starts: list[int] = field(default_factory=list)
    calls: int = 0
    observations: int = 0  # times the agent fed text back before calling again: its tool results
    finish_reason: str = ""

    @property
    def full_text(self) -> str:
        return self.prompt_text + self.text

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids


@dataclass(frozen=True)
class Drift:
    """A call that broke its session's prefix: where its rendered prompt left the closest branch."""

    session: str
    call: int
    offset: int  # characters of the closest branch's text the new prompt kept
    expected: str  # the branch's text from there (a short window)
    got: str  # the new prompt's text from there

    def as_dict(self) -> dict[str, Any]:
        return {"session": self.session, "call": self.call, "offset": self.offset,
                "expected": self.expected, "got": self.got}


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Session:
    """The calls of one agent episode (one API key or URL path), stitched into branches."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.trajectories: list[StitchedTrajectory] = []
        self.drift: list[Drift] = []
        self.calls = 0
        self.reward: float | None = None
        self.components: dict[str, Any] = {}
        self.group: str | None = None
        self.lock = threading.Lock()

    def prompt_ids(self, rendered: str, tokenize: Tokenize) -> tuple[StitchedTrajectory, list[int]]:
        """The branch a call continues (or a new one) and the exact ids to generate from."""
        for traj in reversed(self.trajectories):
            full = traj.full_text
            if rendered.startswith(full):
                new = rendered[len(full):]
                new_ids = tokenize(new) if new else []
                if new and traj.calls:
                    traj.observations += 1
                traj.text += new
                traj.response_ids += new_ids
                traj.loss_mask += [0] * len(new_ids)
                traj.logprobs += [0.0] * len(new_ids)
                return traj, traj.ids
        if self.trajectories:  # a continuation that kept no branch's prefix: a drift, never re-tokenized silently
            closest = max(self.trajectories, key=lambda t: _common_prefix(t.full_text, rendered))
            at = _common_prefix(closest.full_text, rendered)
            self.drift.append(Drift(self.name, self.calls, at, closest.full_text[at:at + 80], rendered[at:at + 80]))
        traj = StitchedTrajectory(prompt_text=rendered, prompt_ids=tokenize(rendered))
        self.trajectories.append(traj)
        return traj, traj.ids

    def record(self, traj: StitchedTrajectory, prompt_ids: Sequence[int], completion_ids: Sequence[int],
               logprobs: Sequence[float], completion_text: str, finish_reason: str = "stop") -> None:
        """Append what the engine sampled for `prompt_ids`, exactly as sampled."""
        if list(prompt_ids) != traj.ids:
            raise RuntimeError(f"session {self.name!r}: the branch changed while its call was generating")
        traj.segment_starts.append(len(traj.response_ids))
        traj.response_ids += list(completion_ids)
        traj.loss_mask += [1] * len(completion_ids)
        traj.logprobs += [float(x) for x in logprobs]
        traj.text += completion_text
        traj.calls += 1
        traj.finish_reason = finish_reason
        self.calls += 1

    def summary(self) -> dict[str, Any]:
        return {
            "session": self.name, "calls": self.calls, "branches": len(self.trajectories),
            "reward": self.reward, "group": self.group, "drift": [d.as_dict() for d in self.drift],
            "trajectories": [{"prompt_ids": t.prompt_ids, "response_ids": t.response_ids, "loss_mask": t.loss_mask,
                              "logprobs": t.logprobs, "calls": t.calls, "observations": t.observations}
                             for t in self.trajectories],
        }


class SessionLog:
    """All sessions of a gateway, thread-safe; finished (rewarded) ones are taken for training."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._rewarded = threading.Condition(self._lock)
        self._ids = itertools.count()

    def session(self, name: str) -> Session:
        with self._lock:
            if name not in self._sessions:
                self._sessions[name] = Session(name)
            return self._sessions[name]

    def get(self, name: str) -> Session | None:
        with self._lock:
            return self._sessions.get(name)

    def pop(self, name: str) -> Session | None:
        with self._lock:
            return self._sessions.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    def set_reward(self, name: str, reward: float, components: dict[str, Any] | None = None,
                   group: str | None = None) -> Session:
        with self._rewarded:
            session = self._sessions.get(name)
            if session is None:
                raise KeyError(name)
            session.reward = float(reward)
            session.components = dict(components or {})
            if group is not None:
                session.group = group
            self._rewarded.notify_all()
            return session

    def drift_report(self) -> list[dict[str, Any]]:
        with self._lock:
            return [d.as_dict() for s in self._sessions.values() for d in s.drift]

    def take(self, count: int, timeout_s: float | None = None) -> list[Session]:
        """Remove and return `count` rewarded sessions, waiting for them (oldest first)."""
        with self._rewarded:
            def ready() -> list[str]:
                return [n for n, s in self._sessions.items() if s.reward is not None]

            if not self._rewarded.wait_for(lambda: len(ready()) >= count, timeout_s):
                raise TimeoutError(f"gateway: {len(ready())} of {count} sessions rewarded after {timeout_s} s; "
                                   "post rewards to /sessions/{id}/reward")
            return [self._sessions.pop(n) for n in ready()[:count]]


def to_trajectories(sessions: Sequence[Session], first_traj_id: int = 0) -> list[Any]:
    """Rewarded sessions as learner `Trajectory` records, one per branch.

    Sessions whose first prompt is the same token sequence form one group (GRPO's groups: several
    attempts at one task); a session's `group`, when posted with its reward, overrides that. A
    branch's `tool_calls` counts the times the agent fed text back into it before calling the model
    again: its tool results (a user turn in between counts too; the gateway sees only text).
    """
    from algorithms.rollout.trajectory import Trajectory

    groups: dict[Any, int] = {}
    out = []
    for session in sessions:
        for traj in session.trajectories:
            key = session.group if session.group is not None else tuple(traj.prompt_ids)
            group = groups.setdefault(key, len(groups))
            out.append(Trajectory(
                prompt_ids=list(traj.prompt_ids), response_ids=list(traj.response_ids),
                loss_mask=list(traj.loss_mask), logprobs=list(traj.logprobs),
                reward=float(session.reward or 0.0), components=dict(session.components), group_id=group,
                task_id=session.name, tool_calls=traj.observations, terminated=traj.finish_reason != "length",
                truncated=traj.finish_reason == "length", finish_reason=traj.finish_reason,
                end_reason="length" if traj.finish_reason == "length" else "gateway",
                segment_starts=list(traj.segment_starts), traj_id=first_traj_id + len(out),
                lineage={"session": session.name, "drift": len(session.drift)}))
    return out


__all__ = ["Drift", "Session", "SessionLog", "StitchedTrajectory", "to_trajectories"]
