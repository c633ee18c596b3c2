"""Training on gateway sessions: `rollout_source: gateway` in a learner's config.

The learner serves its own rollout engine through the gateway (so sessions are sampled from the
policy being trained, weights always current) and, at each step, waits for enough rewarded
sessions instead of rolling out envs itself. Sessions that share their first prompt form a GRPO
group; everything after collection (advantages, loss, update, sync) is the learner's usual step.

    agent-envs train --algo grpo model=tiny rollout_source=gateway gateway_port=8200
    # then point the agent at http://127.0.0.1:8200/s/<session>/v1 and post rewards
"""

from __future__ import annotations

import threading
from typing import Any

from agent_envs.server.serving import InThread
from algorithms.gateway.server import Gateway
from algorithms.gateway.sessions import to_trajectories


class Gate:
    """Lets model calls through only while the learner collects: an update never runs beside a
    generation on the same weights, and every session is sampled by one policy version."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open, self._busy = False, 0

    def enter(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._open)
            self._busy += 1

    def leave(self) -> None:
        with self._cond:
            self._busy -= 1
            self._cond.notify_all()

    def open(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def close(self) -> None:
        """Hold new calls and wait for those in flight."""
        with self._cond:
            self._open = False
            self._cond.wait_for(lambda: self._busy == 0)


class GatewaySource:
    """A gateway on a background event loop, handing rewarded sessions to the learner."""

    def __init__(self, engine: Any, *, host: str = "127.0.0.1", port: int = 8200, model_name: str = "policy",
                 timeout_s: float | None = None, max_response_tokens: int | None = None) -> None:
        self.gateway = Gateway(engine, model_name=model_name, max_response_tokens=max_response_tokens)
        self.gateway.gate = self.gate = Gate()
        self.timeout_s = timeout_s
        self._served = InThread(self.gateway, host, port, name="agent-envs-gateway")
        self.url = self._served.url
        self._next_traj_id = 0

    def trajectories(self, sessions: int) -> tuple[list[Any], dict[str, float]]:
        """The next `sessions` rewarded sessions as trajectories, and what they cost in drift."""
        self.gate.open()
        try:
            taken = self.gateway.sessions.take(sessions, self.timeout_s)
        finally:
            self.gate.close()  # until the next collection: the policy is about to change
        trajs = to_trajectories(taken, self._next_traj_id)
        self._next_traj_id += len(trajs)
        drift = sum(len(s.drift) for s in taken)
        return trajs, {"gateway/sessions": float(len(taken)), "gateway/branches": float(len(trajs)),
                       "gateway/drift_calls": float(drift)}

    def close(self) -> None:
        self._served.close()


__all__ = ["GatewaySource"]
