"""`compare`: the statistics on hand-computed cases, and a tiny real comparison whose table,
summary and plots hold the runs' own numbers and can be rebuilt from the output folder."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from statistics import mean

import pytest

from agent_envs.base.config import UserError
from agent_envs.cli import main
from baselines.comparison.compare import plan_parallelism
from baselines.comparison.report import PAIRED, format_ci, format_value
from baselines.comparison.stats import mean_ci, paired_t_test, regularized_beta, t_cdf, t_quantile

# two-sided 95% critical values of Student's t (any printed t table)
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 9: 2.262, 30: 2.042, 120: 1.980}


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantile_matches_the_table(df):
    assert t_quantile(0.975, df) == pytest.approx(T_TABLE[df], abs=6e-4)
    assert t_quantile(0.025, df) == pytest.approx(-T_TABLE[df], abs=6e-4)


def test_t_cdf_closed_forms():
    # df = 1 is the Cauchy distribution: F(t) = 1/2 + atan(t)/π
    for t in (-3.0, -0.4, 0.0, 1.0, 7.5):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    # df = 2: F(t) = 1/2 + t / (2·sqrt(t² + 2))
    for t in (-2.0, 0.3, 5.0):
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(t * t + 2)), abs=1e-12)
    # I_x(a, 1) = x^a and I_x(1, b) = 1 − (1 − x)^b
    assert regularized_beta(3.0, 1.0, 0.7) == pytest.approx(0.7**3, abs=1e-12)
    assert regularized_beta(1.0, 2.5, 0.2) == pytest.approx(1 - 0.8**2.5, abs=1e-12)


def test_mean_ci_by_hand():
    # [1, 2, 3]: mean 2, s = 1, half width t(0.975, 2)·1/√3 = 4.3027·0.57735 = 2.4841
    m, lo, hi = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and hi - m == pytest.approx(2.4841, abs=1e-4) and m - lo == pytest.approx(hi - m)
    # five values, s = sqrt(0.025) = 0.15811, t(0.975, 4) = 2.7764: half width 0.19632
    m, lo, hi = mean_ci([0.1, 0.2, 0.3, 0.4, 0.5])
    assert m == pytest.approx(0.3) and hi - m == pytest.approx(0.19632, abs=1e-4)
    m, lo, hi = mean_ci([0.7])
    assert m == 0.7 and math.isnan(lo) and math.isnan(hi)


def test_paired_t_test_by_hand():
    # differences 0.1, 0.2, 0.2: mean 1/6, s = 0.057735, t = (1/6)/(s/√3) = 5.0 with 2 degrees of
    # freedom; two-sided p = 1 − 5/sqrt(27) = 0.037750 (the df = 2 closed form above)
    r = paired_t_test([0.5, 0.6, 0.7], [0.6, 0.8, 0.9])
    assert r.n == 3 and r.mean_diff == pytest.approx(1 / 6)
    assert r.t == pytest.approx(5.0) and r.p_value == pytest.approx(1 - 5 / math.sqrt(27), abs=1e-9)
    assert r.ci_high - r.mean_diff == pytest.approx(4.3027 * 0.057735 / math.sqrt(3), abs=1e-4)
    # pairing matters: the same values, matched differently, give differences 0.4, 0.2, −0.1 with
    # the same mean but s = 0.25166, so t = 1.1471 and p = 1 − t/sqrt(t² + 2) = 0.37006
    swapped = paired_t_test([0.5, 0.6, 0.7], [0.9, 0.8, 0.6])
    assert swapped.mean_diff == pytest.approx(1 / 6) and swapped.t == pytest.approx(1.1471, abs=1e-4)
    assert swapped.p_value == pytest.approx(0.37006, abs=1e-4)
    # one degree of freedom: p = 1 − 2·atan(|t|)/π
    r = paired_t_test([0.0, 0.0], [0.1, 0.3])
    assert r.t == pytest.approx(2.0) and r.p_value == pytest.approx(1 - 2 * math.atan(2.0) / math.pi)
    assert paired_t_test([1, 2], [1, 2]).p_value == 1.0 and paired_t_test([1, 2], [2, 3]).p_value == 0.0
    with pytest.raises(ValueError, match="same number"):
        paired_t_test([1.0], [1.0, 2.0])


def test_formatting():
    assert format_ci(0.5, 0.25, 0.75) == "0.500 [0.250, 0.750]" and format_ci(0.5, math.nan, math.nan) == "0.500"
    assert format_value(None) == "–" and format_value(1234.4) == "1234"


def test_parallelism_shares_the_cores():
    assert plan_parallelism(runs=8, jobs=None, cores=2) == (2, 1)
    assert plan_parallelism(runs=1, jobs=None, cores=16) == (1, 16)  # one run gets every core
    assert plan_parallelism(runs=12, jobs=4, cores=16) == (4, 4)
    assert plan_parallelism(runs=3, jobs=8, cores=2) == (3, 1)  # asked for more jobs than cores
    # the user's count wins: two comparisons side by side on 2 cores, one thread each
    assert plan_parallelism(runs=3, jobs=1, cores=2, overrides=["lr=1e-4", "threads=1"]) == (1, 1)
    assert plan_parallelism(runs=3, jobs=1, cores=2, overrides=["threads=auto"]) == (1, 2)
    with pytest.raises(UserError, match="threads=0"):
        plan_parallelism(runs=3, jobs=1, cores=2, overrides=["threads=0"])


DRIVER = textwrap.dedent("""
    import os, sys, time
    from baselines.comparison.compare import run_pool

    def pid_after(seconds):
        time.sleep(seconds)
        return os.getpid()

    if __name__ == "__main__":
        with run_pool(2, 1) as pool:
            pids = list(pool.map(pid_after, [1.0, 1.0]))  # both busy at once: one pid each
            print(*pids, flush=True)
            pool.map(time.sleep, [600, 600])
            time.sleep(600)
""")


def test_parallel_runs_end_with_the_compare_process(tmp_path):
    # compare killed (by `timeout`, `kill -9`, the OOM killer): its runs must not go on training unseen
    (tmp_path / "driver.py").write_text(DRIVER)
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py")], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(repo)})
    try:
        workers = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(set(workers)) == 2 and all(_alive(pid) for pid in workers)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_compare_two_algorithms_two_seeds(tmp_path, capsys):
    from algorithms.models.tiny import build_tiny_model

    # warmed up, the tiny model writes the tag protocol, so tool calls and answers vary between runs
    model = build_tiny_model(warmup_steps=150)
    out = tmp_path / "cmp"
    args = ["compare", "--algos", "grpo,arpo", "--seeds", "0,1", "--out", str(out), "--eval-tasks", "3",
            "--eval-samples", "2", "--jobs", "2", f"model={model}", "total_steps=2",
            "prompts_per_step=2", "group_size=8", "max_response_tokens=32", "temperature=0.7", "top_p=1.0", "top_k=-1",
            "progress=false", "tensorboard=false"]  # fmt: skip
    assert main(args) == 0
    # seed-major: a comparison stopped early has every algorithm's first seed
    done = re.findall(r"  (\w+) seed (\d): trained in", capsys.readouterr().out)
    assert done == [("grpo", "0"), ("arpo", "0"), ("grpo", "1"), ("arpo", "1")]
    runs = {(a, s): json.loads((out / f"{a}-{s}" / "result.json").read_text()) for a in ("grpo", "arpo") for s in (0, 1)}
    for (algo, seed), r in runs.items():
        assert (out / f"{algo}-{seed}" / "log.txt").stat().st_size > 0  # parallel runs log to their folder
        assert [c["step"] for c in r["curve"]] == [1, 2] and "env_reward_mean" in r["curve"][0]
        assert r["budget"] == {"trajectories_per_step": 16, "steps": 2, "trajectories": 32,
                               "trained_trajectories": 32.0, "generated_trajectories": 32.0}  # fmt: skip
        metrics = [json.loads(line) for line in (out / f"{algo}-{seed}" / "metrics.jsonl").read_text().splitlines()]
        executed = [m.get("rollout/tool_calls_per_traj", m["tool_calls_mean"]) for m in metrics if "step" in m]
        assert r["rollout_tool_calls"] == pytest.approx(sum(executed) / len(executed))
        forked = [m["rollout/branch_entropy"] for m in metrics if m.get("rollout/forks_per_prompt", 0) > 0]
        assert r["branch_entropy"] == (pytest.approx(sum(forked) / len(forked)) if forked else None)
        assert algo == "arpo" or r["branch_entropy"] is None
        # evaluated at the preset's own training sampling setup, not at a fixed T = 1
        assert r["sampling"] == {"temperature": 0.7, "top_p": 1.0, "top_k": -1}
        summary = json.loads((out / f"{algo}-{seed}" / "eval_sampled" / "summary.json").read_text())
        assert summary["sampling"]["temperature"] == 0.7 and summary["metrics"]["samples_per_task"] == 2
        assert r["threads"] == plan_parallelism(4, 2)[1]

    summary = json.loads((out / "results.json").read_text())
    text = (out / "results.md").read_text()
    for row in summary["per_run"]:  # the table's per-run rows are the runs' own numbers
        r = runs[(row["algo"], row["seed"])]
        assert row["train_s"] == r["train_s"] and row["tool_calls"] == r["sampled"]["tool_calls"]
        assert row["sampled_pass@1"] == r["sampled"]["pass@1"] and row["greedy_pass@1"] == r["greedy"]["pass@1"]
        assert row["generated"] == r["budget"]["generated_trajectories"]
        assert row["rollout_tool_calls"] == r["rollout_tool_calls"]
        columns = ["sampled_pass@1", "greedy_pass@1", "generated", "tool_calls", "rollout_tool_calls",
                   "tokens_per_solved", "train_s"]
        if any(r["branch_entropy"] is not None for r in runs.values()):  # a column only when a run forked
            columns.append("branch_entropy")
        assert row["branch_entropy"] == runs[(row["algo"], row["seed"])]["branch_entropy"]
        cells = [format_value(row[k]) for k in columns]
        assert f"| {row['algo']} | {row['seed']} | 32 | " + " | ".join(cells) + " |" in text
    for entry in summary["per_algo"]:
        vals = [runs[(entry["algo"], s)]["train_s"] for s in (0, 1)]
        m, lo, hi = mean_ci(vals)
        assert entry["train_s"]["mean"] == pytest.approx(mean(vals)) and entry["train_s"]["ci95"] == pytest.approx([lo, hi])
        assert f"{format_value(m)} [{format_value(lo)}, {format_value(hi)}]" in text
        assert entry["budget"]["trajectories"] == 32  # equal sample budget, stated in the table
        assert f"| {entry['algo']} | 2 | 16 x 2 = 32 | 0.7 / 1.0 / -1 |" in text
    # grpo never forks: no branch-point entropy to pair
    assert {(p["algo"], p["metric"]) for p in summary["paired"]} == {("arpo", m) for m in PAIRED if m != "branch_entropy"}
    test = next(p for p in summary["paired"] if p["metric"] == "tool_calls")
    want = paired_t_test([runs[("grpo", s)]["sampled"]["tool_calls"] for s in (0, 1)],
                         [runs[("arpo", s)]["sampled"]["tool_calls"] for s in (0, 1)])
    assert test["n"] == 2 and test["mean_diff"] == pytest.approx(want.mean_diff)
    assert test["p_value"] == (None if math.isnan(want.p_value) else pytest.approx(want.p_value))
    assert "## Against grpo" in text
    for png in ("pass_at_1.png", "reward_curves.png"):
        assert (out / png).stat().st_size > 0

    # the report is rebuilt from the folder alone, without training
    (out / "results.md").unlink()
    assert main(["compare", "--report-only", str(out)]) == 0
    assert (out / "results.md").read_text() == text
    (out / "arpo-1" / "result.json").unlink()
    capsys.readouterr()
    assert main(["compare", "--report-only", str(out)]) == 2  # a user error: one line, exit status 2
    assert "arpo-1" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_keeps_finished_runs_and_continues_the_others(tmp_path, capsys):
    from algorithms.models.tiny import build_tiny_model

    out = tmp_path / "cmp"
    args = ["compare", "--algos", "grpo", "--seeds", "0,1", "--out", str(out), "--eval-tasks", "2",
            "--eval-samples", "1", "--jobs", "1", f"model={build_tiny_model(warmup_steps=150)}",
            "prompts_per_step=2", "group_size=2", "max_response_tokens=16", "save_every=1",
            "progress=false", "tensorboard=false"]  # fmt: skip
    assert main([*args, "total_steps=1"]) == 0
    kept = (out / "grpo-0" / "result.json").read_text()
    # seed 1 stopped after its first checkpoint, before its evaluation wrote a result
    (out / "grpo-1" / "result.json").unlink()
    capsys.readouterr()
    assert main([*args, "total_steps=2", "--resume", "true"]) == 0
    assert capsys.readouterr().out.count("resumed from") == 1
    assert (out / "grpo-0" / "result.json").read_text() == kept  # finished: not trained again
    resumed = json.loads((out / "grpo-1" / "result.json").read_text())
    assert [c["step"] for c in resumed["curve"]] == [1, 2]  # step 1 from the first call, step 2 resumed
    steps = [json.loads(line) for line in (out / "grpo-1" / "metrics.jsonl").read_text().splitlines()]
    assert resumed["train_s"] == pytest.approx(sum(m["time_step_s"] for m in steps if "step" in m))
    assert (out / "grpo-1" / "checkpoints" / "step_00000002").is_dir()
    summary = json.loads((out / "results.json").read_text())
    assert sorted(r["seed"] for r in summary["per_run"]) == [0, 1]


@pytest.mark.slow
def test_a_vllm_run_is_evaluated_on_vllm_with_its_engine_settings(tmp_path):
    """The SmolLM2 presets roll out with vLLM; their evaluation loads the same engine with the
    run's engine_kwargs, so it decodes as fast as training did."""
    from algorithms.models.tiny import build_tiny_model

    out = tmp_path / "cmp"
    args = ["compare", "--algos", "grpo", "--seeds", "0", "--out", str(out), "--eval-tasks", "2",
            "--eval-samples", "1", "--jobs", "1", f"model={build_tiny_model(warmup_steps=150)}",
            "prompts_per_step=2", "group_size=2", "max_response_tokens=16", "total_steps=1", "save_every=0",
            "progress=false", "tensorboard=false", "engine=vllm", "engine_kwargs.enforce_eager=true",
            "engine_kwargs.max_model_len=1536"]  # fmt: skip
    assert main(args) == 0
    for kind in ("greedy", "sampled"):
        summary = json.loads((out / "grpo-0" / f"eval_{kind}" / "summary.json").read_text())
        assert summary["config"]["engine"] == "vllm"
    from types import SimpleNamespace

    from baselines.evaluation.evaluate import EvalConfig, load_engine, run_engine

    run = SimpleNamespace(engine="vllm", engine_kwargs={"enforce_eager": True, "max_model_len": 1536})
    kind, engine = run_engine(run, str(out / "grpo-0" / "final_model"), seed=0)
    assert kind == "vllm" and engine.max_model_len == 1536
    assert engine.llm.llm_engine.vllm_config.model_config.enforce_eager
    del engine
    # `agent-envs evaluate RUN` reads them from the run's config.json
    engine = load_engine(EvalConfig(model=str(out / "grpo-0" / "final_model"), engine="vllm"))
    assert engine.max_model_len == 1536
    del engine
    kind, engine = run_engine(SimpleNamespace(engine="vllm-server", engine_kwargs={"base_url": "http://x"}),
                              str(out / "grpo-0" / "final_model"), seed=0)
    assert kind == "hf"  # a served engine's address is not where the run's model is
