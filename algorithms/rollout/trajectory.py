"""`Trajectory`: one finished episode in tokens, the record learners train on, and its JSONL form.

    >>> from algorithms.rollout.trajectory import Trajectory, read_jsonl, write_jsonl
    >>> t = Trajectory(prompt_ids=[1, 2], response_ids=[5, 6, 7], loss_mask=[1, 0, 1],
    ...                logprobs=[-0.5, 0.0, -1.2], reward=1.0, task_id="demo-0")
    >>> t.validate(); t.num_generated
    2

Invariants (checked by `validate`): `loss_mask`, `logprobs` and `entropy` (when present) have
the length of `response_ids`; the mask is 1 exactly on tokens the policy sampled and 0 on
tokens the env inserted (tool results, messages); log-probs are 0.0 where the mask is 0.
Tree rollouts record where a trajectory came from in `parent_id`, `branch_offset` and the open
`lineage` dict (root id, depth, whatever a strategy needs). Asynchronous training tags each
generated segment with the `policy_version` that produced it (docs/scaling.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from agent_envs.data.jsonl import iter_json_objects


@dataclass
class Trajectory:
    """One episode: prompt ‖ response tokens with the loss mask, behaviour log-probs and reward."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]  # behaviour (rollout) log-probs; 0.0 where loss_mask is 0
    entropy: list[float] | None = None  # per response token when the engine knows it
    reward: float = 0.0
    components: dict[str, Any] = field(default_factory=dict)  # the env's info at the end
    group_id: int = 0  # trajectories of the same prompt share it (GRPO groups)
    task_id: str = ""
    tool_calls: int = 0
    terminated: bool = False
    truncated: bool = False
    finish_reason: str = ""  # of the last segment: stop | eos | length
    end_reason: str = ""  # why the episode ended: answer, end, max_turns, response_budget, ...
    segment_starts: list[int] = field(default_factory=list)  # response offsets where generated segments start
    # asynchronous training: the policy version (learner step whose weights the engine held) that
    # generated each segment, aligned with segment_starts; empty in the synchronous loop, where
    # every token comes from the version trained on
    policy_version: list[int] = field(default_factory=list)
    response_text: str = ""  # decoded, for reading and reward debugging only; never re-encoded
    traj_id: int = 0
    parent_id: int | None = None
    branch_offset: int | None = None
    lineage: dict[str, Any] = field(default_factory=dict)
    advantage: float | None = None  # set by the learner: mean advantage over the tokens it trained
    health: list[str] = field(default_factory=list)  # rollout health checks it failed (docs/diagnostics.md)

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)

    def validate(self) -> None:
        """Raise ValueError naming the broken invariant."""
        n = len(self.response_ids)
        where = f"trajectory {self.traj_id} (task {self.task_id!r})"
        for name in ("loss_mask", "logprobs"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{where}: len({name})={len(getattr(self, name))} != len(response_ids)={n}")
        if self.entropy is not None and len(self.entropy) != n:
            raise ValueError(f"{where}: len(entropy)={len(self.entropy)} != len(response_ids)={n}")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"{where}: loss_mask must hold only 0 and 1")
        if any(m == 0 and lp != 0.0 for m, lp in zip(self.loss_mask, self.logprobs, strict=True)):
            raise ValueError(f"{where}: logprobs must be 0.0 where loss_mask is 0")
        if self.policy_version and len(self.policy_version) != len(self.segment_starts):
            raise ValueError(
                f"{where}: len(policy_version)={len(self.policy_version)} != "
                f"len(segment_starts)={len(self.segment_starts)} (one version per generated segment)"
            )
        if self.terminated and self.truncated:
            raise ValueError(f"{where}: terminated and truncated are both set")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any], where: str = "row") -> Trajectory:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(row) - names)
        if unknown:
            raise ValueError(f"{where}: unknown Trajectory fields {unknown}")
        missing = sorted(n for n in ("prompt_ids", "response_ids", "loss_mask", "logprobs") if n not in row)
        if missing:
            raise ValueError(f"{where}: missing Trajectory fields {missing}")
        traj = cls(**row)
        try:
            traj.validate()
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        return traj


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def write_jsonl(trajectories: Iterable[Trajectory], path: str | Path, append: bool = False) -> Path:
    """Write one JSON object per trajectory; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w", encoding="utf-8") as fh:
        for t in trajectories:
            fh.write(json.dumps(_jsonable(t.to_dict()), ensure_ascii=False) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[Trajectory]:
    """Read trajectories back; a bad line raises ValueError naming the file and line."""
    return [Trajectory.from_dict(row, where) for where, _, row in iter_json_objects(path, "trajectory file")]


to_jsonl = write_jsonl

__all__ = ["Trajectory", "read_jsonl", "to_jsonl", "write_jsonl"]
