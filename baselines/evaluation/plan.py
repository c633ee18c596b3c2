"""What an evaluation runs, and where each setting comes from: the command line, the training run
that made the model, or the defaults.

A run's model folder (`<output_dir>/final_model`) sits beside the run's resolved `config.json`
(written by the learner and by SFT). Evaluating that model means evaluating it where it was
trained: the run's env, its `env_kwargs` (system prompt, world settings, tool limits) and its
sampling setup (temperature, top_p, top_k, response budget) are taken from there unless the
command line sets them. Tasks default to held-out ones: when the run's config has `eval_episodes`,
the run's own held-out tail (its last `eval_episodes` tasks, which the learner never draws and SFT's
first tasks never reach), for worlds and files alike; without a run, the last `limit` tasks of a
procedural world, while a benchmark or data file is its own evaluation set and starts at its first
task.

    >>> import json, pathlib, tempfile
    >>> run = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (run / "config.json").write_text(json.dumps({"algo": "grpo", "env": "AgentMath-v0",
    ...     "env_kwargs": {"max_tool_calls": 2}, "temperature": 0.8, "top_p": 1.0, "top_k": -1,
    ...     "max_response_tokens": 96}))
    >>> (run / "final_model").mkdir()
    >>> settings, sources = run_settings(str(run / "final_model"))
    >>> settings["env"], settings["temperature"], sources["temperature"].startswith("run ")
    ('AgentMath-v0', 0.8, True)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_envs.base.config import UserError

# without a run to take them from: the reference evaluation's sampling (greedy when n == 1)
DEFAULT_SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_response_tokens": 1024}
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_response_tokens")
RUN_CONFIG = "config.json"  # what the learner and SFT write into their output_dir


def find_run_config(model: str | None) -> Path | None:
    """The resolved config of the run that made `model`: `<run>/config.json` beside
    `<run>/final_model` (or inside `model` when it is the run folder itself); None otherwise."""
    if not model:
        return None
    path = Path(model).expanduser()
    for candidate in (path.parent / RUN_CONFIG, path / RUN_CONFIG):
        if candidate.is_file() and _is_run_config(candidate):
            return candidate
    return None


def _is_run_config(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    # a Hugging Face model's config.json has model_type; ours names the algorithm and the env
    return isinstance(data, dict) and "algo" in data and "env" in data


def run_model(model: str) -> str:
    """The model folder that `model` names: itself, or when it is a run's folder the run's final
    model, `<run>/final_model`; a folder of runs (the quickstart's) names its one RL run's model.

        >>> import pathlib, tempfile
        >>> qs = pathlib.Path(tempfile.mkdtemp())
        >>> for name, algo in (("sft", "sft"), ("grpo", "grpo")):
        ...     (qs / name / "final_model").mkdir(parents=True)
        ...     _ = (qs / name / RUN_CONFIG).write_text(json.dumps({"algo": algo, "env": "AgentMath-v0"}))
        >>> run_model(str(qs)) == str(qs / "grpo" / "final_model")
        True
        >>> run_model("tiny")
        'tiny'
    """
    path = Path(model).expanduser()
    if not path.is_dir() or _is_model_folder(path):
        return model
    if (path / "final_model").is_dir():
        return str(path / "final_model")
    runs = {}  # run folder -> its algorithm, for the runs inside `path` that saved a final model
    for sub in sorted(p for p in path.iterdir() if (p / "final_model").is_dir() and _is_run_config(p / RUN_CONFIG)):
        runs[sub] = json.loads((sub / RUN_CONFIG).read_text())["algo"]
    rl = [sub for sub, algo in runs.items() if algo != "sft"] or list(runs)
    if len(rl) == 1:
        return str(rl[0] / "final_model")
    if not rl:
        raise UserError(f"{model}: no final_model of a run in it (a run writes <output_dir>/final_model when it "
                        "ends); give a model folder, or finish the run with --resume")
    names = ", ".join(p.name for p in rl)
    raise UserError(f"{model} holds {len(rl)} runs ({names}); name one, e.g. {rl[0]}")


def _is_model_folder(path: Path) -> bool:
    """A Hugging Face checkpoint: config.json that is not a run's."""
    return (path / RUN_CONFIG).is_file() and not _is_run_config(path / RUN_CONFIG)


def run_settings(model: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """(settings, source of each) that the run behind `model` fixes: env, env_kwargs, sampling, its
    engine (and a vLLM run's `engine_kwargs`), and `eval_episodes`, the count of the env's last
    tasks it held out of training.

    SFT runs have no sampling setup; their greedy evaluation budget is kept as the response
    budget. Empty when `model` is not a run's model."""
    path = find_run_config(model)
    if path is None:
        return {}, {}
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise UserError(f"{path}: not valid JSON ({exc}); it should be the config a training run wrote") from None
    where = f"run {path}"
    settings: dict[str, Any] = {"env": data["env"], "env_kwargs": dict(data.get("env_kwargs") or {})}
    for key in SAMPLING_KEYS:
        if key in data:
            settings[key] = data[key]
    if "max_response_tokens" not in settings and "eval_max_response_tokens" in data:
        settings["max_response_tokens"] = data["eval_max_response_tokens"]  # SFT
    # the engine the run sampled with (a served one's model loads in-process); SFT's evaluation is hf
    settings["engine"] = {"hf": "hf", "vllm": "vllm", "vllm-server": "vllm"}.get(data.get("engine", "hf"), "hf")
    if data.get("engine") == "vllm" and data.get("engine_kwargs"):
        settings["engine_kwargs"] = dict(data["engine_kwargs"])
    held_out = data.get("eval_episodes")
    if held_out is not None:
        if not isinstance(held_out, int) or isinstance(held_out, bool) or held_out < 0:
            raise UserError(f"{path}: field 'eval_episodes' = {held_out!r} is not a task count >= 0; "
                            "fix it or pass --first-task")
        settings["eval_episodes"] = held_out
    return settings, dict.fromkeys(settings, where)


def held_out_range(tasks: Any, limit: int | None, first_task: int | None,
                   run_held_out: int | None = None) -> tuple[int, int, str]:
    """(first index, count, why) of the tasks to evaluate.

    Without `first_task`: the last `run_held_out` tasks when the model's run held that many out
    of training (at most `limit` of them, from the end); else a procedural world's last `limit`
    tasks (held out from training), or a benchmark's / data file's first `limit` tasks (the file is
    the evaluation set).

        >>> from agent_envs.worlds import make_world
        >>> held_out_range(make_world("arithmetic", size=1000), 100, None)
        (900, 100, 'the last 100 of 1000 (held out: training draws start at task 0)')
        >>> held_out_range(range(30), 100, None)
        (0, 30, 'the first 30 of 30 (a benchmark or data file: the evaluation set itself)')
        >>> held_out_range(range(20), 100, None, run_held_out=5)
        (15, 5, "the last 5 of 20 (the run's held-out tasks: eval_episodes=5)")
        >>> held_out_range(range(10), None, 4)
        (4, 6, 'from task 4 (command line)')
    """
    from agent_envs.worlds.base import World

    total = len(tasks)
    if first_task is not None:
        if total - first_task <= 0:
            raise UserError(f"the env has {total} tasks; first_task={first_task} leaves none to evaluate")
        count = total - first_task if limit is None else min(limit, total - first_task)
        return first_task, count, f"from task {first_task} (command line)"
    if run_held_out:
        count = min(run_held_out, total) if limit is None else min(limit, run_held_out, total)
        return total - count, count, (f"the last {count} of {total} (the run's held-out tasks: "
                                      f"eval_episodes={run_held_out})")
    count = total if limit is None else min(limit, total)
    if isinstance(tasks, World):
        if count == total:
            return 0, count, f"all {total} (none held out: SFT trains on the first tasks)"
        return total - count, count, f"the last {count} of {total} (held out: training draws start at task 0)"
    return 0, count, f"the first {count} of {total} (a benchmark or data file: the evaluation set itself)"


def sft_overlap(run: dict[str, Any], num_tasks: int, first_eval: int) -> str | None:
    """What is wrong when an SFT config's gold-trace tasks (0..n-1, n = min(num_examples,
    tasks - eval_episodes)) reach the evaluation tasks `first_eval`..; None when they do not.

        >>> sft_overlap({"algo": "sft", "num_examples": 4000, "eval_episodes": 0}, 100000, 99936) is None
        True
        >>> sft_overlap({"algo": "sft", "num_examples": 18, "eval_episodes": 0}, 20, 15)
        'SFT trained on tasks 0-17, which reach the evaluation tasks 15-19; lower its num_examples to 15'
    """
    if run.get("algo") != "sft" or run.get("data"):  # an episodes file is no env task
        return None
    trained = min(int(run.get("num_examples", 0)), num_tasks - int(run.get("eval_episodes") or 0))
    if trained <= first_eval:
        return None
    return (f"SFT trained on tasks 0-{trained - 1}, which reach the evaluation tasks {first_eval}-{num_tasks - 1}; "
            f"lower its num_examples to {first_eval}")


__all__ = ["DEFAULT_SAMPLING", "RUN_CONFIG", "SAMPLING_KEYS", "find_run_config", "held_out_range", "run_model",
           "run_settings", "sft_overlap"]
