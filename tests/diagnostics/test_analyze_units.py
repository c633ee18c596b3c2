"""`agent-envs analyze` on hand-built runs whose numbers are known: the entropy curve around tool
results, phases, forks and depths, the PCA, and the reader's errors and runs still being written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from algorithms.rollout.trajectory import Trajectory, write_jsonl
from baselines.diagnostics.analyze import analyze, entropy_by_offset, tfidf_pca
from baselines.diagnostics.runs import find_runs, load_run


def traj(mask: str, entropy: list[float] | None, **kw) -> Trajectory:
    """A trajectory from a mask string ("1" model token, "0" tool-result token)."""
    m = [int(c) for c in mask]
    return Trajectory(prompt_ids=[1], response_ids=list(range(10, 10 + len(m))), loss_mask=m,
                      logprobs=[0.0] * len(m), entropy=entropy, **kw)  # fmt: skip


def write_run(folder: Path, algo: str, steps: dict[int, list[Trajectory]]) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"algo": algo}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in steps))
    for step, trajs in steps.items():
        write_jsonl(trajs, folder / "trajectories" / f"step_{step:06d}.jsonl")
    return folder


# model tokens carry entropy 10 + their rank among model tokens; tool-result tokens 0 (as the runner writes)
A_MASK = "111001110011"  # model ranks 0 1 2 | 3 4 5 | 6 7; tool results end before ranks 3 and 6
A_ENTROPY = [10.0, 11.0, 12.0, 0.0, 0.0, 13.0, 14.0, 15.0, 0.0, 0.0, 16.0, 17.0]
B_MASK = "10111"  # one tool result, ending before model rank 1
B_ENTROPY = [1.0, 0.0, 5.0, 6.0, 7.0]


def test_entropy_curve_of_hand_built_trajectories(tmp_path):
    # window -2..+2 in model tokens; expected by hand:
    #   A, result 1 (rank 3): -2->11 -1->12  0->13 +1->14 +2->15
    #   A, result 2 (rank 6): -2->14 -1->15  0->16 +1->17 (+2 past the end)
    #   B, result   (rank 1):        -1->1   0->5  +1->6  +2->7
    expected = {-2: (11 + 14) / 2, -1: (12 + 15 + 1) / 3, 0: (13 + 16 + 5) / 3, 1: (14 + 17 + 6) / 3, 2: (15 + 7) / 2}
    a, b = traj(A_MASK, A_ENTROPY, reward=1.0), traj(B_MASK, B_ENTROPY, reward=0.0)
    no_entropy = traj("1101", None)  # an engine that records none: not in the entropy numbers
    run = write_run(tmp_path / "run", "grpo", {1: [a, b, no_entropy]})
    summary = analyze([run], tmp_path / "out", window=(-2, 2))
    curve = summary["entropy_by_offset"]["grpo"]["all"]
    assert curve["entropy"] == pytest.approx([expected[d] for d in range(-2, 3)])
    assert curve["tokens"] == [2, 3, 3, 3, 2]
    [row] = summary["runs"]
    assert row["entropy_at_0"] == pytest.approx(expected[0]) and row["tool_results"] == 3
    model_h = [h for h, m in zip(A_ENTROPY + B_ENTROPY, A_MASK + B_MASK, strict=True) if m == "1"]
    assert row["entropy_mean"] == pytest.approx(sum(model_h) / len(model_h))
    assert row["trajectories"] == 3 and row["reward"] == pytest.approx(1 / 3)
    assert "| grpo | all | 3 |" in (tmp_path / "out" / "summary.md").read_text()


def test_entropy_by_offset_counts_model_tokens_only():
    # a 5-token tool result between two model tokens: offset -1 is the token before it
    sums, counts = entropy_by_offset(traj("1000001", [2.0, 0, 0, 0, 0, 0, 3.0]), (-1, 0))
    assert sums.tolist() == [2.0, 3.0] and counts.tolist() == [1, 1]
    assert entropy_by_offset(traj("0011", [0, 0, 1.0, 1.0]), (0, 0))[1].tolist() == [1]  # a result first
    assert entropy_by_offset(traj("1111", [1.0] * 4), (-2, 2))[1].sum() == 0  # no tool result, no point


def test_phases_forks_depths_and_series(tmp_path):
    def tree(group: int) -> list[Trajectory]:
        root = traj("11011", [1.0, 1.0, 0.0, 4.0, 1.0], group_id=group, traj_id=0, lineage={"depth": 0})
        fork = traj("11011", [1.0, 1.0, 0.0, 2.0, 1.0], group_id=group, traj_id=1, parent_id=0, branch_offset=3,
                    lineage={"depth": 1})  # fmt: skip
        deeper = traj("11011", [1.0, 1.0, 0.0, 2.0, 1.0], group_id=group, traj_id=2, parent_id=1,
                      branch_offset=3, lineage={"depth": 2})  # fmt: skip
        return [root, fork, deeper] if group == 0 else [root, traj("1111", None, group_id=group)]

    arpo = write_run(tmp_path / "cmp" / "arpo-0", "arpo", {1: tree(0) + tree(1), 2: tree(0), 3: tree(0), 4: tree(1)})
    # an evaluate output inside the learner run: a series of its own, named after the folder
    ev = arpo / "eval_greedy"
    ev.mkdir()
    (ev / "summary.json").write_text(json.dumps({"config": {"model": "m"}, "metrics": {}}))
    (ev / "samples.jsonl").write_text(json.dumps({"task_id": "t", "correct": 1.0}) + "\n")
    write_jsonl([traj("1011", [1.0, 0.0, 8.0, 1.0], components={"correct": 1.0})], ev / "trajectories.jsonl")
    summary = analyze([tmp_path / "cmp"], tmp_path / "out", window=(0, 0))
    runs = {r["run"]: r for r in summary["runs"]}
    assert set(runs) == {"arpo-0", "arpo-0/eval_greedy"}
    learner = runs["arpo-0"]
    # prompts: step 1 has 2 (forks 2 and 0), steps 2, 3 one each with 2 forks, step 4 one with 0
    assert learner["forks_per_prompt"] == pytest.approx((2 + 0 + 2 + 2 + 0) / 5)
    assert summary["series"]["arpo"]["forks_per_prompt"] == {"0": 2, "2": 3}
    assert summary["series"]["arpo"]["depth"] == {"0": 7, "1": 3, "2": 3}
    assert learner["max_depth"] == 2
    # steps 1, 2 early; 3, 4 late; entropy at offset 0: 4 in roots, 2 in forks
    phases = summary["entropy_by_offset"]["arpo"]
    assert phases["early"]["entropy"] == pytest.approx([(4 + 2 + 2 + 4 + 4 + 2 + 2) / 7])
    assert phases["late"]["entropy"] == pytest.approx([(4 + 2 + 2 + 4) / 4])
    assert summary["entropy_by_offset"]["arpo eval_greedy"]["eval"]["entropy"] == [8.0]
    assert runs["arpo-0/eval_greedy"]["tokens_per_solved"] == 3.0
    assert summary["reward_components"]["arpo-0"]["reward"] == [[1, 0.0], [2, 0.0], [3, 0.0], [4, 0.0]]
    for name in summary["figures"]:
        assert (tmp_path / "out" / name).stat().st_size > 1000


def test_pca_separates_two_kinds_of_trajectories():
    bags = [[1, 2, 1, 2, 3]] * 5 + [[7, 8, 9, 9]] * 5
    xy, share = tfidf_pca(bags)
    assert share[0] == pytest.approx(1.0)  # identical bags within a kind: one axis holds everything
    assert len({round(float(x), 6) for x in xy[:5, 0]}) == 1 and xy[0, 0] * xy[5, 0] < 0


def test_reader_errors_and_fields_of_newer_versions(tmp_path):
    with pytest.raises(ValueError, match="not a run folder"):
        load_run(tmp_path)
    with pytest.raises(ValueError, match="no learner run"):
        find_runs(tmp_path)
    run = write_run(tmp_path / "r", "dapo", {1: [traj("11", [0.5, 0.5])]})
    path = run / "trajectories" / "step_000001.jsonl"
    row = json.loads(path.read_text())
    newer = {**row, "a_field_of_a_newer_version": 1}
    path.write_text(json.dumps(newer) + "\n{broken\n")
    r = load_run(run)
    with pytest.raises(ValueError, match=r"step_000001.jsonl:2"):
        r.trajectories(1)
    path.write_text(json.dumps(newer) + "\n")
    assert len(r.trajectories(1)) == 1 and r.dropped_fields == {"a_field_of_a_newer_version"}
    with pytest.raises(KeyError, match=r"saved steps: \[1\]"):
        r.trajectories(7)
    empty = write_run(tmp_path / "empty", "grpo", {})
    with pytest.raises(ValueError, match="save_trajectories=true"):
        analyze([empty], tmp_path / "out")


def test_half_written_last_lines_of_a_run_still_training_are_skipped_by_analyze_and_view(tmp_path):
    from baselines.diagnostics.view.server import prompt_rows, run_rows

    run = write_run(tmp_path / "live", "grpo", {1: [traj("101", [1.0, 0.0, 2.0], reward=1.0)] * 2})
    step, metrics = run / "trajectories" / "step_000001.jsonl", run / "metrics.jsonl"
    whole_step, whole_metrics = step.read_text(), metrics.read_text()
    step.write_text(whole_step + whole_step.splitlines()[0][:25])  # the writers are mid-line
    metrics.write_text(whole_metrics + '{"step": 2, "rew')
    [found] = find_runs(run)
    assert len(found.trajectories(1)) == 2 and found.metrics == [{"step": 1}]
    [row] = analyze([run], tmp_path / "out")["runs"]
    assert (row["trajectories"], row["reward"]) == (2, 1.0)
    [shown] = run_rows({found.name: found})
    assert (shown["steps"], shown["errors"]) == ([1], [])
    assert [p["trajectories"] for p in prompt_rows({found.name: found}, {})] == [2]
    # the same line with its newline is malformed, not in progress: both say where
    step.write_text(whole_step + "{broken\n")
    with pytest.raises(ValueError, match=r"step_000001.jsonl:3: not valid JSON"):
        analyze([run], tmp_path / "out")
    [shown] = run_rows({found.name: found})
    assert len(shown["errors"]) == 1 and f"{step}:3: not valid JSON" in shown["errors"][0]
    assert [p["trajectories"] for p in prompt_rows({found.name: found}, {})] == [2]  # the rows before it


def test_cli_reports_a_folder_without_runs(tmp_path, capsys):
    from agent_envs.cli import main

    assert main(["analyze", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert f"agent-envs analyze: {tmp_path}: no learner run" in capsys.readouterr().err


def test_health_fields_are_optional(tmp_path):
    # a learner with health checks logs `health/<check>` counts; one without logs none
    run = write_run(tmp_path / "r", "grpo", {1: [traj("101", [1.0, 0.0, 2.0])], 2: [traj("11", [1.0, 1.0])]})
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "health/loss_mask": 2}) + "\n"
                                       + json.dumps({"step": 2, "health/loss_mask": 1, "health/reward": 0}) + "\n")
    plain = write_run(tmp_path / "p", "dapo", {1: [traj("11", [1.0, 1.0])]})
    summary = analyze([run, plain], tmp_path / "out")
    rows = {r["run"]: r for r in summary["runs"]}
    assert rows["r"]["health_counts"] == {"health/loss_mask": 3.0, "health/reward": 0.0}
    # None where Trajectory has no `health` field, 0 where it has one and nothing was flagged
    assert rows["p"]["health_counts"] == {} and rows["p"]["health_flagged"] in (None, 0)
    assert "- r: health/loss_mask 3" in (tmp_path / "out" / "summary.md").read_text()
