"""`compare --report-only A,B --out C`: comparisons trained apart, tabled and paired by seed in one
report, with paired tests against each of `--baselines`. The runs' result files are written by hand
here (their numbers chosen so the paired differences are known); the real runs that write them are
tested in test_compare.py."""

from __future__ import annotations

import json

import pytest

from agent_envs.cli import main
from baselines.comparison.stats import paired_t_test

SHARED = ["model=runs/sft/final_model", "env_kwargs.world.ambiguity=1"]
# (folder, algo) -> per seed: sampled pass@1, greedy pass@1, branch entropy (None: no tree rollout)
RUNS = {
    ("plain", "grpo"): [(0.30, 0.50, None), (0.28, 0.47, None), (0.33, 0.52, None)],
    ("plain", "arpo"): [(0.36, 0.50, 0.14), (0.31, 0.47, 0.15), (0.35, 0.55, 0.13)],
    ("turn", "arpo"): [(0.34, 0.48, 0.09), (0.29, 0.50, 0.10), (0.30, 0.45, 0.08)],
}


def _result(algo: str, seed: int, sampled: float, greedy: float, entropy: float | None, samples: int = 4) -> dict:
    return {"algo": algo, "seed": seed,
            "sampled": {"pass@1": sampled, "tool_calls": 2.0, "response_tokens": 100.0},
            "greedy": {"pass@1": greedy}, "eval": {"tasks": 64, "first_task": 936, "samples_per_task": samples},
            "budget": {"trajectories": 160, "trajectories_per_step": 16, "steps": 10, "generated_trajectories": 160},
            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1}, "tokens_per_solved": 300.0,
            "rollout_tool_calls": 1.4, "train_s": 1200.0, "branch_entropy": entropy,
            "curve": [{"step": 1, "env_reward_mean": 0.3}, {"step": 2, "env_reward_mean": 0.4}]}  # fmt: skip


def _folders(root, samples: int = 4) -> dict[str, str]:
    folders = {}
    for name, own in (("plain", []), ("turn", ["tree.branch_rule=turn"])):
        folder = root / name
        algos = [a for (f, a) in RUNS if f == name]
        manifest = {"algos": algos, "seeds": [0, 1, 2], "config": "configs/{algo}_smollm2_qa.yaml",
                    "overrides": SHARED + own, "eval_tasks": 64, "eval_samples": 4 if name == "plain" else samples}
        folder.mkdir()
        (folder / "compare.json").write_text(json.dumps(manifest))
        for algo in algos:
            for seed, values in enumerate(RUNS[(name, algo)]):
                (folder / f"{algo}-{seed}").mkdir()
                (folder / f"{algo}-{seed}" / "result.json").write_text(json.dumps(_result(algo, seed, *values)))
        folders[name] = str(folder)
    return folders


def test_two_folders_make_one_report_paired_against_each_baseline(tmp_path, capsys):
    f = _folders(tmp_path)
    out = tmp_path / "rules"
    assert main(["compare", "--report-only", f"{f['plain']},{f['turn']}", "--out", str(out),
                 "--baselines", "grpo,arpo"]) == 0
    summary = json.loads((out / "results.json").read_text())
    turn = "arpo tree.branch_rule=turn"  # named by the override its folder does not share
    assert [a["algo"] for a in summary["per_algo"]] == ["grpo", "arpo", turn]
    assert summary["manifest"]["overrides"] == SHARED
    tests = {(p["baseline"], p["algo"], p["metric"]): p for p in summary["paired"]}
    for base, algo in (("grpo", "arpo"), ("grpo", turn), ("arpo", "grpo"), ("arpo", turn)):
        folder_of = {"grpo": ("plain", "grpo"), "arpo": ("plain", "arpo"), turn: ("turn", "arpo")}
        a = [v[0] for v in RUNS[folder_of[base]]]
        b = [v[0] for v in RUNS[folder_of[algo]]]
        want = paired_t_test(a, b)
        got = tests[(base, algo, "sampled_pass@1")]
        assert got["n"] == 3 and got["mean_diff"] == pytest.approx(want.mean_diff)
        assert got["ci95"] == pytest.approx([want.ci_low, want.ci_high])
    # by hand: turn - arpo sampled = (-0.02 - 0.02 - 0.05) / 3
    assert tests[("arpo", turn, "sampled_pass@1")]["mean_diff"] == pytest.approx(-0.03)
    # the branch-point entropy pairs only runs that forked: turn against arpo, never against grpo
    assert tests[("arpo", turn, "branch_entropy")]["mean_diff"] == pytest.approx(-0.05)
    assert ("grpo", turn, "branch_entropy") not in tests and ("arpo", "grpo", "branch_entropy") not in tests
    text = (out / "results.md").read_text()
    assert "## Against grpo" in text and "## Against arpo" in text and "entropy where it forked" in text
    assert f"- `{f['turn']}` (preset `configs/{{algo}}_smollm2_qa.yaml`; its own overrides " \
           f"`tree.branch_rule=turn`): {turn}" in text
    assert f"| {turn} | 3 | 16 x 10 = 160 |" in text
    assert (out / "pass_at_1.png").stat().st_size > 0 and (out / "reward_curves.png").stat().st_size > 0
    assert capsys.readouterr().out.startswith("# Comparison")


def test_one_folder_takes_other_baselines(tmp_path):
    f = _folders(tmp_path)
    assert main(["compare", "--report-only", f["plain"], "--baselines", "arpo"]) == 0
    summary = json.loads((tmp_path / "plain" / "results.json").read_text())
    assert {(p["baseline"], p["algo"]) for p in summary["paired"]} == {("arpo", "grpo")}


@pytest.mark.parametrize("case", ["samples", "out_is_input", "out_is_a_comparison", "baseline"])
def test_what_cannot_be_merged_is_a_one_line_error(tmp_path, capsys, case):
    f = _folders(tmp_path, samples=2 if case == "samples" else 4)
    out = {"out_is_input": f["plain"], "out_is_a_comparison": f["turn"]}.get(case, str(tmp_path / "merged"))
    if case == "out_is_a_comparison":
        (tmp_path / "other").mkdir()
        out = str(tmp_path / "other")
        (tmp_path / "other" / "compare.json").write_text("{}")
    args = ["compare", "--report-only", f"{f['plain']},{f['turn']}", "--out", out]
    if case == "baseline":
        args += ["--baselines", "dapo"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    want = {"samples": "eval_samples=2", "out_is_input": "name a new folder", "out_is_a_comparison": "name a new folder",
            "baseline": "'baselines': 'dapo'"}[case]
    assert want in err
    assert not (tmp_path / "merged").exists()


def test_a_baseline_outside_the_algorithms_stops_before_training(tmp_path, capsys):
    assert main(["compare", "--algos", "grpo,arpo", "--baselines", "dapo", "--out", str(tmp_path / "c")]) == 2
    assert "'baselines'" in capsys.readouterr().err and not (tmp_path / "c").exists()
