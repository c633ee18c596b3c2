"""Training never draws the tasks evaluations score on: the env's last `eval_episodes` tasks are
held out of every prompt draw, with validation on or off, and `compare` and `evaluate` pick
exactly that tail. Everything runs on a 20-task data file and the untrained tiny model.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from algorithms.core.evaluation import held_out_tasks
from algorithms.core.learner import Learner
from algorithms.core.learner_config import LearnerConfig
from algorithms.rollout.trajectory import read_jsonl

# the untrained tiny model makes no tool calls; the learner rightly warns (docs/algorithms.md D23)
pytestmark = pytest.mark.filterwarnings("ignore:no tool calls")
TASKS, HELD_OUT = 20, 5
IDS = [f"sum-{i:02d}" for i in range(TASKS)]
TRAINED_IDS = set(IDS[: TASKS - HELD_OUT])


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    """20 tasks in the JSONL format AgentMath-v0 reads through `data_files`."""
    path = tmp_path_factory.mktemp("data") / "sums.jsonl"
    rows = [{"id": IDS[i], "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(TASKS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _cfg(task_file: str, out, **kw) -> LearnerConfig:
    base = dict(model="tiny", env="AgentMath-v0", env_kwargs={"data_files": task_file}, output_dir=str(out),
                total_steps=2, prompts_per_step=8, group_size=2, max_response_tokens=8, lr=1e-3, threads=1,
                eval_every=0, eval_episodes=HELD_OUT, save_trajectories=True, progress=False, tensorboard=False,
                export_model=False)  # fmt: skip
    base.update(kw)
    return LearnerConfig(**base)


@pytest.fixture(scope="module")
def trained(task_file, tmp_path_factory):
    """A 2-step run of 8 prompts a step: 16 draws, more than the 15 trainable tasks, so a sampler
    over all 20 tasks would have to draw from the tail."""
    out = tmp_path_factory.mktemp("run")
    learner = Learner(_cfg(task_file, out, export_model=True))
    learner.train()
    return learner, out


def _trained_ids(out) -> list[str]:
    return [t.task_id for p in sorted((out / "trajectories").glob("*.jsonl")) for t in read_jsonl(p)]


def test_the_tail_is_held_out_with_validation_off():
    cfg = SimpleNamespace(eval_every=0, eval_episodes=HELD_OUT, env="AgentMath-v0")
    assert held_out_tasks(TASKS, cfg) == [15, 16, 17, 18, 19]
    assert held_out_tasks(TASKS, SimpleNamespace(eval_every=0, eval_episodes=0, env="AgentMath-v0")) == []
    with pytest.raises(ValueError, match="'eval_episodes': env AgentMath-v0 has 20 tasks, too few to hold out 20"):
        held_out_tasks(TASKS, SimpleNamespace(eval_every=0, eval_episodes=TASKS, env="AgentMath-v0"))
    with pytest.raises(ValueError, match="'eval_episodes': must be >= 1 when validation is on"):
        LearnerConfig(eval_every=2, eval_episodes=0).validate()
    with pytest.raises(ValueError, match="'eval_episodes': must be >= 0"):
        LearnerConfig(eval_episodes=-1).validate()
    LearnerConfig(eval_every=0, eval_episodes=0).validate()  # holding nothing out is allowed


def test_the_learners_sampler_never_draws_the_tail(trained):
    learner, _ = trained
    assert learner.eval_tasks == [15, 16, 17, 18, 19]
    # the draws of many steps (every rank draws the same global prompts), and DAPO-sized rounds
    drawn = [d.index for step in range(2, 200) for d in learner.step_draws(step)]
    drawn += [d.index for d in learner.draw_prompts(step=200, count=97, first_group=0)]
    assert set(drawn) == set(range(TASKS - HELD_OUT)), "every trainable task is drawn, no held-out one"


def test_a_training_run_records_only_the_first_15_tasks(trained):
    _, out = trained
    ids = _trained_ids(out)
    assert len(ids) == 2 * 8 * 2 and set(ids) == TRAINED_IDS
    assert json.loads((out / "config.json").read_text())["eval_episodes"] == HELD_OUT


def test_asynchronous_rollouts_draw_from_the_same_tasks(task_file, tmp_path):
    Learner(_cfg(task_file, tmp_path, max_staleness=1, rollout_is="tis")).train()
    ids = _trained_ids(tmp_path)
    assert len(ids) == 2 * 8 * 2 and set(ids) == TRAINED_IDS


def test_evaluate_on_the_run_folder_scores_the_runs_tail(trained):
    from baselines.evaluation.evaluate import EvalConfig, resolve

    _, out = trained
    cfg, probe, lines = resolve(EvalConfig(model=str(out / "final_model"), engine="hf"))
    assert (cfg.first_task, cfg.limit) == (15, 5) and len(probe.tasks) == TASKS
    assert lines[2] == ("tasks 15-19: the last 5 of 20 (the run's held-out tasks: eval_episodes=5) "
                        f"(run {out / 'config.json'})")
    cfg, _, _ = resolve(EvalConfig(model=str(out / "final_model"), engine="hf", limit=2))
    assert (cfg.first_task, cfg.limit) == (18, 2)
    cfg, _, lines = resolve(EvalConfig(model=str(out / "final_model"), engine="hf", first_task=0, limit=3))
    assert (cfg.first_task, cfg.limit) == (0, 3) and "(command line)" in lines[2]


def test_compare_holds_out_exactly_its_evaluation_tasks(task_file, tmp_path, capsys):
    from agent_envs.base.config import UserError
    from baselines.comparison.compare import RunSpec, run_compare, spec_config

    overrides = ["model=tiny", f"env_kwargs.data_files={task_file}"]
    for algo in ("grpo", "arpo"):
        spec = RunSpec(algo, 0, "{algo}_tiny.yaml", overrides, str(tmp_path / algo), eval_tasks=HELD_OUT)
        assert spec_config(spec).eval_episodes == HELD_OUT
    # refused before anything trains: a different hold-out, or no task left to train on
    with pytest.raises(UserError, match="override 'eval_episodes=3': every run holds out exactly its evaluation"):
        run_compare(["grpo"], [0], str(tmp_path / "cmp"), "{algo}_tiny.yaml", [*overrides, "eval_episodes=3"],
                    eval_tasks=HELD_OUT)
    with pytest.raises(SystemExit, match="has 20 tasks, too few to hold out 20 for evaluation.*lower --eval-tasks"):
        run_compare(["grpo"], [0], str(tmp_path / "cmp"), "{algo}_tiny.yaml", overrides, eval_tasks=TASKS)
    assert not (tmp_path / "cmp" / "compare.json").exists() and not any((tmp_path / "cmp").glob("*/*"))


def test_compare_warns_when_the_models_sft_trained_on_the_evaluation_tasks(task_file, tmp_path):
    from baselines.comparison.compare import RunSpec, sft_warning, spec_config

    sft = tmp_path / "sft"
    (sft / "final_model").mkdir(parents=True)
    sft_config = {"algo": "sft", "env": "AgentMath-v0", "env_kwargs": {"data_files": task_file},
                  "num_examples": 18, "eval_episodes": 0}  # fmt: skip
    (sft / "config.json").write_text(json.dumps(sft_config))
    spec = RunSpec("grpo", 0, "{algo}_tiny.yaml", [f"model={sft / 'final_model'}",
                   f"env_kwargs.data_files={task_file}"], str(tmp_path / "run"), eval_tasks=HELD_OUT)  # fmt: skip
    cfg = spec_config(spec)
    warning = sft_warning(cfg, TASKS, HELD_OUT)
    assert warning == (f"the model's SFT run {sft / 'config.json'}: SFT trained on tasks 0-17, which reach the "
                       "evaluation tasks 15-19; lower its num_examples to 15, or lower --eval-tasks")
    assert sft_warning(cfg, TASKS, 2) is None  # tasks 18-19 are beyond its 18 examples
    (sft / "config.json").write_text(json.dumps({**sft_config, "eval_episodes": 5}))
    assert sft_warning(cfg, TASKS, HELD_OUT) is None  # SFT held the same tail out
    (sft / "config.json").write_text(json.dumps({**sft_config, "env_kwargs": {"world": {"seed": 1}}}))
    assert sft_warning(cfg, TASKS, HELD_OUT) is None  # other tasks: a world's, not the file's
