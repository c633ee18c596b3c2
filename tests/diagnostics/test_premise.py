"""`agent-envs analyze --premise` on hand-built evaluation folders whose numbers are worked out by
hand: the after / before / episode windows, means over tasks with Student-t intervals, the split
of the high-entropy tokens, the row order, the figure, and the error for runs without entropies."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from algorithms.rollout.trajectory import Trajectory, write_jsonl
from baselines.diagnostics import analyze
from baselines.diagnostics.premise import premise, windows

T_975_1DF = 12.706204736  # Student-t quantile, 1 degree of freedom (two tasks)


def traj(task: str, mask: str, entropy: list[float] | None, correct: float = 0.0) -> Trajectory:
    """A trajectory from a mask string ("1" model token, "0" tool-result token)."""
    m = [int(c) for c in mask]
    return Trajectory(prompt_ids=[1], response_ids=list(range(10, 10 + len(m))), loss_mask=m,
                      logprobs=[0.0] * len(m), entropy=entropy, task_id=task,
                      components={"correct": correct})  # fmt: skip


def write_eval(folder: Path, env: str, world: dict, trajs: list[Trajectory]) -> Path:
    """An `evaluate --out` folder as evaluate writes it (summary.json, samples.jsonl, trajectories.jsonl)."""
    folder.mkdir(parents=True)
    config = {"env": env, "env_kwargs": {"world": world} if world else {}}
    (folder / "summary.json").write_text(json.dumps({"metrics": {}, "config": config, "env": {"id": env}}))
    (folder / "samples.jsonl").write_text("".join(json.dumps({"task_id": t.task_id}) + "\n" for t in trajs))
    write_jsonl(trajs, folder / "trajectories.jsonl")
    return folder


# task t1: one episode with a result (before [1, 2], after [3, 4], episode mean 2.5) and one
# without (episode mean 6); task t2: before [0.5], after [1.5], episode mean 1.0
QA_HALF = [traj("t1", "11011", [1.0, 2.0, 0.0, 3.0, 4.0], correct=1.0),
           traj("t1", "111", [6.0, 6.0, 6.0]),
           traj("t2", "101", [0.5, 0.0, 1.5])]  # fmt: skip


def test_windows_clip_at_the_ends_and_overlap_between_close_calls():
    # results end before model ranks 2 and 5; model ranks 0..11 at response positions skipping 2 and 6
    t = traj("t", "1101110111111111", [0.0] * 16)
    w = windows(t)
    model = [i for i, c in enumerate("1101110111111111") if c == "1"]
    assert sorted(w["episode"]) == model
    assert sorted(w["before"]) == model[:5]  # rank 0-1 before the first; 0-4 before the second
    assert sorted(w["after"]) == model[2:13]  # ranks 2-9 after the first, 5-12 after the second
    assert w["after"] & w["before"] == {model[2], model[3], model[4]}


def test_premise_numbers_by_hand(tmp_path):
    run = write_eval(tmp_path / "qa_half", "AgentQA-v0", {"ambiguity": 0.5, "min_hops": 2}, QA_HALF)
    [row] = premise([run], tmp_path / "out")
    assert (row["env"], row["ambiguity"], row["tasks"], row["episodes"], row["tool_results"]) == (
        "AgentQA-v0", 0.5, 2, 3, 2)
    assert row["accuracy"] == pytest.approx(1 / 3)
    # means over tasks; two tasks: half-width = t(0.975, 1) * stdev / sqrt(2) = t * |a - b| / 2
    for name, (a, b) in {"after": (3.5, 1.5), "before": (1.5, 0.5), "episode": ((2.5 + 6) / 2, 1.0)}.items():
        m, half = (a + b) / 2, T_975_1DF * abs(a - b) / 2
        assert row[name] == pytest.approx([m, m - half, m + half]), name
    # 9 model tokens: the top 5 % is one token, an entropy-6 token before any result
    assert row["top_share"] == {"after": 0.0, "before": 0.0, "later": 0.0, "opening": 1.0}
    third = 1 / 3
    assert row["token_share"] == pytest.approx({"after": third, "before": third, "later": 0.0, "opening": third})
    curve = json.loads((tmp_path / "out" / "premise.json").read_text())
    lo = curve["curve_offsets"][0]
    assert curve["rows"][0]["curve"][0 - lo][0] == pytest.approx((3.0 + 1.5) / 2)  # offset 0
    assert curve["rows"][0]["curve"][-1 - lo][0] == pytest.approx((2.0 + 0.5) / 2)  # offset -1
    assert curve["rows"][0]["curve"][5 - lo] is None  # no episode reaches 6 tokens past a result
    table = (tmp_path / "out" / "premise.md").read_text()
    assert "| AgentQA-v0 | 0.5 | 2 | 3 | 2 | 0.333 | 2.625 [" in table
    assert (tmp_path / "out" / "premise.png").stat().st_size > 1000


def test_rows_by_world_then_level_through_the_cli(tmp_path, capsys):
    qa_half = write_eval(tmp_path / "a", "AgentQA-v0", {"ambiguity": 0.5}, QA_HALF)
    web = write_eval(tmp_path / "b", "AgentSearch-v0", {}, [traj("w", "1101", [0.1, 0.2, 0.0, 0.3])])
    qa_zero = write_eval(tmp_path / "c", "AgentQA-v0", {"min_hops": 2}, [traj("q", "101", [0.2, 0.0, 0.4])])
    parser = argparse.ArgumentParser()
    analyze.add_cli(parser.add_subparsers())
    argv = ["analyze", "--premise", str(qa_half), str(web), str(qa_zero), "--out", str(tmp_path / "o")]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    rows = [line.split(" | ")[:2] for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [["| AgentQA-v0", "0"], ["| AgentQA-v0", "0.5"], ["| AgentSearch-v0", "0"]]


def test_a_run_without_entropies_is_named(tmp_path, capsys):
    run = write_eval(tmp_path / "no_h", "AgentQA-v0", {}, [traj("t", "101", None)])
    with pytest.raises(ValueError, match="no_h: no trajectory recorded token entropies"):
        premise([run], tmp_path / "out")
    parser = argparse.ArgumentParser()
    analyze.add_cli(parser.add_subparsers())
    args = parser.parse_args(["analyze", "--premise", str(run), "--out", str(tmp_path / "out")])
    assert args.func(args) == 2
    assert "recorded token entropies" in capsys.readouterr().err
