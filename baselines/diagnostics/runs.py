"""The one reader of run folders: learner runs, `evaluate` outputs, and folders of many runs.

    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from algorithms.rollout.trajectory import Trajectory, write_jsonl
    >>> run = Path(tempfile.mkdtemp())
    >>> _ = (run / "config.json").write_text(json.dumps({"algo": "grpo"}))
    >>> _ = (run / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\\n')
    >>> t = Trajectory(prompt_ids=[1], response_ids=[5, 6], loss_mask=[1, 1], logprobs=[-0.1, -0.2])
    >>> _ = write_jsonl([t, t], run / "trajectories" / "step_000001.jsonl")
    >>> r = load_run(run)
    >>> r.kind, r.algorithm, r.steps, len(r.trajectories(1)), r.metrics[0]["reward_mean"]
    ('learner', 'grpo', [1], 2, 0.5)

What a folder holds, by kind:

* **learner** (`agent-envs train`, `quickstart`, each run of `compare`): `config.json` (the
  resolved config; its `algo` names the algorithm; a `config.yaml` is read when there is no
  JSON), `metrics.jsonl` (one line per step) and, with `save_trajectories=true`,
  `trajectories/step_<N>.jsonl`: the `Trajectory` rows of step N.
* **evaluate** (`agent-envs evaluate --out`): `summary.json`, `samples.jsonl` (one row per
  episode) and `trajectories.jsonl` (the same episodes as `Trajectory` rows; outputs written
  before that file existed have none, so token-level analyses skip them). Its trajectories sit at
  step 0.
* **a folder of runs** (a `compare` output, or any folder): every run found below it, in path
  order; a learner run's own `eval_*` folders are evaluate runs of that learner's algorithm.

Files are read on request, never cached: a run that is still training shows its new steps on the
next call, and memory holds one step's trajectories at a time when a caller iterates. The last
line of a JSONL file that a training run is still writing (no newline yet, not valid JSON) is
skipped, not reported; any other malformed line raises ValueError naming the file and line.
Rows may carry fields that this version's `Trajectory` lacks (written by a newer version):
`Run.trajectories` drops them and `Run.dropped_fields` names them; `Run.rows` keeps every field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agent_envs.data.jsonl import iter_json_objects
from algorithms.core.run_log import CONFIG_FILE, METRICS_FILE
from algorithms.rollout.trajectory import Trajectory

TRAJECTORY_DIR = "trajectories"
EVAL_SUMMARY, EVAL_SAMPLES, EVAL_TRAJECTORIES = "summary.json", "samples.jsonl", "trajectories.jsonl"
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")
# folders inside a run that hold no runs: no need to walk them when looking for runs
_NOT_RUNS = {TRAJECTORY_DIR, "checkpoints", "tb", "final_model", "wandb"}
_TRAJECTORY_FIELDS = frozenset(f.name for f in fields(Trajectory))


@dataclass
class Run:
    """One run folder. `steps` are the steps with saved trajectories (learner) or `[0]` (evaluate)."""

    path: Path
    kind: str  # "learner" | "evaluate"
    name: str  # the folder's path relative to what was asked for ("grpo-0", "grpo-0/eval_sampled")
    algorithm: str  # config's `algo`; an evaluate run inside a learner run gets the learner's
    config: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)  # learner: metrics.jsonl rows
    summary: dict[str, Any] = field(default_factory=dict)  # evaluate: summary.json
    dropped_fields: set[str] = field(default_factory=set)  # row fields unknown to Trajectory

    @property
    def steps(self) -> list[int]:
        if self.kind == "evaluate":
            return [0] if (self.path / EVAL_TRAJECTORIES).is_file() else []
        return sorted(self._step_files())

    def _step_files(self) -> dict[int, Path]:
        folder = self.path / TRAJECTORY_DIR
        if not folder.is_dir():
            return {}
        found = (_STEP_FILE.match(p.name) for p in folder.iterdir())
        return {int(m.group(1)): folder / m.group(0) for m in found if m}

    def trajectory_file(self, step: int) -> Path:
        if self.kind == "evaluate":
            if step != 0:
                raise KeyError(f"{self.path}: an evaluate run has its trajectories at step 0, not {step}")
            return self.path / EVAL_TRAJECTORIES
        # the learner's own name: found without listing the folder, once per step of a long run
        written = self.path / TRAJECTORY_DIR / f"step_{step:06d}.jsonl"
        if written.is_file():
            return written
        files = self._step_files()
        if step not in files:
            raise KeyError(f"{self.path}: no trajectories for step {step}; saved steps: {sorted(files)}")
        return files[step]

    def rows(self, step: int) -> Iterator[dict[str, Any]]:
        """The rows of one step as written, every field kept; a malformed line raises after the rows before it."""
        return (row for _, row in _rows(self.trajectory_file(step), "trajectory file"))

    def trajectories(self, step: int) -> list[Trajectory]:
        """The trajectories of one step, in the order they were written."""
        return [self._trajectory(where, row) for where, row in _rows(self.trajectory_file(step), "trajectory file")]

    def samples(self) -> Iterator[dict[str, Any]]:
        """An evaluate run's `samples.jsonl` rows (none for a learner run)."""
        path = self.path / EVAL_SAMPLES
        if self.kind == "evaluate" and path.is_file():
            yield from (row for _, row in _rows(path, "samples file"))

    def _trajectory(self, where: str, row: dict[str, Any]) -> Trajectory:
        unknown = row.keys() - _TRAJECTORY_FIELDS
        if unknown:
            self.dropped_fields |= unknown
            row = {k: v for k, v in row.items() if k in _TRAJECTORY_FIELDS}
        return Trajectory.from_dict(row, where)


def is_learner_run(path: Path) -> bool:
    return (path / METRICS_FILE).is_file() or (path / TRAJECTORY_DIR).is_dir()


def is_evaluate_run(path: Path) -> bool:
    return (path / EVAL_SUMMARY).is_file() and (path / EVAL_SAMPLES).is_file()


def load_run(path: str | Path, name: str | None = None, algorithm: str | None = None) -> Run:
    """Read one run folder (learner or evaluate); ValueError says what a run folder holds."""
    path = Path(path)
    name = name or path.name
    if is_evaluate_run(path):
        summary = _read_json(path / EVAL_SUMMARY)
        return Run(path, "evaluate", name, algorithm or "evaluate", dict(summary.get("config", {})),
                   summary=summary)  # fmt: skip
    if is_learner_run(path):
        config, metrics = _read_config(path), path / METRICS_FILE
        return Run(path, "learner", name, algorithm or str(config.get("algo", "unknown")), config,
                   metrics=[row for _, row in _rows(metrics, "metrics file")] if metrics.is_file() else [])  # fmt: skip
    raise ValueError(
        f"{path}: not a run folder: a learner run holds {METRICS_FILE} or {TRAJECTORY_DIR}/, an evaluate "
        f"output holds {EVAL_SUMMARY} and {EVAL_SAMPLES}"
    )


def find_runs(path: str | Path, max_depth: int = 3) -> list[Run]:
    """Every run at or below `path` (a run, a `compare` output, any folder of runs), in path order.

    Raises ValueError when there is none, so a mistyped folder is not analysed as empty."""
    root = Path(path)
    if not root.exists():
        raise ValueError(f"{root}: no such folder")
    runs: list[Run] = []
    _walk(root, root, max_depth, None, runs)
    if not runs:
        raise ValueError(f"{root}: no learner run ({METRICS_FILE}) or evaluate output ({EVAL_SUMMARY}) "
                         f"found within {max_depth} folder levels")  # fmt: skip
    return runs


def _walk(folder: Path, root: Path, depth: int, parent_algo: str | None, out: list[Run]) -> None:
    name = folder.name if folder == root else folder.relative_to(root).as_posix()
    if is_learner_run(folder) or is_evaluate_run(folder):
        run = load_run(folder, name=name, algorithm=parent_algo if is_evaluate_run(folder) else None)
        out.append(run)
        if run.kind == "learner":
            parent_algo = run.algorithm
    if depth == 0:
        return
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and p.name not in _NOT_RUNS):
        _walk(child, root, depth - 1, parent_algo, out)


def _rows(path: Path, what: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """("path:line", object) per line of a JSONL file that a run may still be writing."""
    return ((where, row) for where, _, row in iter_json_objects(path, what, growing=True))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _read_config(path: Path) -> dict[str, Any]:
    if (path / CONFIG_FILE).is_file():
        return _read_json(path / CONFIG_FILE)
    if (path / "config.yaml").is_file():
        import yaml

        data = yaml.safe_load((path / "config.yaml").read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path / 'config.yaml'}: expected a mapping of config fields")
        return data
    return {}


# ---- the text of a run's trajectories (the viewer and the export cut it the same way) -------------

# a tool result the env inserted right after a call's closing tag (used only without a tokenizer)
INSERTED_RESULT = re.compile(
    r"</(?:python|search|browse|tool_call)>(\s*<(result|tool_response)>.*?</\2>)", re.S
)
# the closing tag a tool call ends with (the tool's name, or `tool_call` in JSON protocols)
CALL_END = re.compile(r"</(?!answer>|think>)([\w-]+)>\s*$")

_tokenizer_cache: dict[Path, Any] = {}


def run_tokenizer(folder: Path, config: dict[str, Any]) -> Any | None:
    """The run's tokenizer (a `tokenizers.Tokenizer`), or None when the run has none here."""
    candidates = [folder / "final_model", folder]
    for key in ("tokenizer", "model"):
        if isinstance(config.get(key), str) and config[key]:
            candidates.append(Path(config[key]))
    for candidate in candidates:
        path = candidate / "tokenizer.json"
        if path in _tokenizer_cache:
            return _tokenizer_cache[path]
        if path.is_file():
            try:
                from tokenizers import Tokenizer
            except ImportError:  # the `train` extra is not installed: shade segments instead
                return None
            _tokenizer_cache[path] = Tokenizer.from_file(str(path))
            return _tokenizer_cache[path]
    return None


__all__ = [
    "CALL_END",
    "INSERTED_RESULT",
    "Run",
    "find_runs",
    "is_evaluate_run",
    "is_learner_run",
    "load_run",
    "run_tokenizer",
]
