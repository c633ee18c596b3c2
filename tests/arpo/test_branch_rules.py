"""Branch rules (`tree.branch_rule`, docs/algorithms.md §6.10): each rule's decision on hand-computed
cases, every rule at the same budget on tiny-model rollouts, forks of stateful python sessions,
and `agent-envs train` with each rule, tree packing and the branch-tree viewer."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from arpo_helpers import ScriptedEngine, make_env_factory, math_tasks, run

from algorithms.rollout.branch_rules import Anchor, BranchView, get_rule, prefix_nodes
from algorithms.rollout.branch_rules.entropy_value import branch_scores, future_values
from algorithms.rollout.branch_rules.mixed_outcome import outcome_variance
from algorithms.rollout.branching import decide_branch
from algorithms.rollout.engine import SamplingParams
from algorithms.rollout.tree import TreeRollout
from algorithms.rollout.tree_config import TreeConfig

REPO = Path(__file__).resolve().parents[2]
RULES = ["entropy", "turn", "entropy_value", "mixed_outcome"]
PARAMS = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=96)


# -- golden cases -------------------------------------------------------------------------------


def test_entropy_rule_is_arpos_draw():
    # P = clip(0.5 + 0.2·ΔH, 0, 1): 0.7 at ΔH = 1, 0.9 at ΔH = 2; Random(0)'s first u is 0.8444
    rule, cfg = get_rule("entropy"), TreeConfig(branch_probability=0.5, entropy_weight=0.2)
    assert random.Random(0).random() == pytest.approx(0.8444, abs=1e-4)
    assert rule.decide(random.Random(0), 1.0, cfg, 0) is False
    assert rule.decide(random.Random(0), 2.0, cfg, 0) is True
    a, b = random.Random(5), random.Random(5)
    assert [rule.decide(a, 0.3, cfg, 2) for _ in range(200)] == [decide_branch(b, 0.3, cfg, 2) for _ in range(200)]
    assert rule.online and rule.anchors([], 3, a, cfg) == []


def _tree_branches() -> list[BranchView]:
    # tree 0: branch 0 (results end at 4 and 9), its fork 2 at 9 (one more result, ending at 15);
    # tree 1: branch 1, no tool call
    return [
        BranchView(0, None, None, 1.0, [0, 4, 9]),
        BranchView(1, None, None, 0.0, [0]),
        BranchView(2, 0, 9, 0.0, [0, 4, 9, 15]),
    ]


def test_prefix_nodes_come_from_lineage():
    assert prefix_nodes(_tree_branches()) == {(0, 0): [0, 1, 2], (0, 4): [0, 2], (0, 9): [0, 2], (2, 15): [2]}


def test_turn_rule_draws_an_agent_step_uniformly_per_tree():
    rule, branches = get_rule("turn"), _tree_branches()
    steps = [(0, 4), (0, 9), (2, 15)]  # tree 0's nodes after a tool result; tree 1 has none
    assert rule.anchors(branches, 2, random.Random(3), TreeConfig()) == [Anchor(*random.Random(3).choice(steps))]
    n, rng = 6000, random.Random(11)
    counts = {s: 0 for s in steps}
    for _ in range(n):
        [a] = rule.anchors(branches, 1, rng, TreeConfig())
        counts[(a.branch, a.offset)] += 1
    sigma = math.sqrt(n * (1 / 3) * (2 / 3))
    assert all(abs(c - n / 3) <= 4 * sigma for c in counts.values()), counts
    assert rule.wave_size(initial=2, left=5) == 2 and rule.wave_size(initial=4, left=1) == 1


def _appo_branch() -> BranchView:
    # five generated tokens; the last ends the turn, so t = 0..3 are the candidates
    # H = [1, 3, 1, 3] -> z(H) = [-1, 1, -1, 1]
    # γ = 1, log π = [0, -2, 0, 0, -1] -> Ω = [-3, -3, -1, -1] -> z(Ω) = [-1, -1, 1, 1]
    # BS = z(H)·z(Ω) = [1, -1, -1, 1]; only t = 3 has both z > 0
    return BranchView(0, None, None, 0.0, [0], logprobs=[0.0, -2.0, 0.0, 0.0, -1.0],
                    entropy=[1.0, 3.0, 1.0, 3.0, 2.0], generated=[True] * 5, forkable=[True] * 4 + [False])  # fmt: skip


def test_entropy_value_score_golden():
    assert future_values([0.0, -2.0, 0.0, 0.0, -1.0], [True] * 5, gamma=1.0) == [-3.0, -3.0, -1.0, -1.0, -1.0]
    assert future_values([-1.0, -4.0, -2.0], [True, False, True], gamma=0.5) == [-1.5, -1.0, -2.0]
    scores = branch_scores(_appo_branch(), gamma=1.0)
    assert [(t, round(s, 9), strict) for t, s, strict in scores] == [
        (0, 1.0, False), (1, -1.0, False), (2, -1.0, False), (3, 1.0, True)
    ]  # fmt: skip
    rule, cfg = get_rule("entropy_value"), TreeConfig(future_discount=1.0)
    # strict candidates first, then the best of the rest; a fork keeps response[:t + 1]
    got = rule.anchors([_appo_branch()], 3, random.Random(0), cfg)
    assert [(a.branch, a.offset, round(a.score, 9)) for a in got] == [(0, 4, 1.0), (0, 1, 1.0), (0, 2, -1.0)]
    assert rule.wave_size(initial=2, left=6) == 6  # one wave of M − N branches


def test_mixed_outcome_score_golden():
    assert outcome_variance([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.1875)  # p(1 − p), p = 1/4
    branches = [
        BranchView(0, None, None, 1.0, [0, 5, 9]),
        BranchView(1, 0, 9, 0.0, [0, 5, 9, 14]),
        BranchView(2, None, None, 0.0, [0, 6]),
        BranchView(3, 2, 6, 0.0, [0, 6]),
    ]
    # the prompt's mean reward 0.25 joins each node as one pseudo-observation:
    # (0,5), (0,9): {0, 1, 0.25} -> mean 0.41667, variance 0.541667/3 = 0.180556 (deeper first)
    # (1,14): {0, 0.25} -> 0.015625; (2,6): {0, 0, 0.25} -> 0.041667/3 = 0.013889
    rule = get_rule("mixed_outcome")
    got = rule.anchors(branches, 3, None, TreeConfig())
    assert [(a.branch, a.offset) for a in got] == [(0, 9), (0, 5), (1, 14)]
    assert [a.score for a in got] == pytest.approx([0.180556, 0.180556, 0.015625], abs=1e-6)
    assert [(a.branch, a.offset) for a in rule.anchors(branches, 1, None, TreeConfig())] == [(0, 9)]
    same = [BranchView(0, None, None, 1.0, [0, 5]), BranchView(1, None, None, 1.0, [0, 8])]
    assert rule.anchors(same, 2, None, TreeConfig()) == []  # no contrast anywhere: top-ups


# -- the same budget for every rule, on tiny-model rollouts --------------------------------------


def check_budget(res, m: int, max_tokens: int) -> None:
    trajs = res.trajectories
    groups = {t.group_id for t in trajs}
    assert len(trajs) == m * len(groups)
    assert all(sum(t.group_id == g for t in trajs) == m for g in groups)
    by_key = {(t.group_id, t.traj_id): t for t in trajs}
    own = 0  # tokens each branch sampled itself: a fork's prefix is its parent's
    for t in trajs:
        t.validate()
        assert len(t.response_ids) <= max_tokens
        b = 0
        if t.parent_id is not None:
            parent, b = by_key[(t.group_id, t.parent_id)], t.branch_offset
            assert t.response_ids[:b] == parent.response_ids[:b]
            assert t.loss_mask[:b] == parent.loss_mask[:b] and t.logprobs[:b] == parent.logprobs[:b]
            assert t.lineage["depth"] == parent.lineage["depth"] + 1
        own += sum(t.loss_mask[b:])
    metrics = res.metrics()
    assert metrics["rollout/trajectories_per_prompt"] == m
    assert metrics["rollout/generated_tokens_per_prompt"] * len(groups) == own <= m * len(groups) * max_tokens


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_gives_exactly_m_paths_at_the_token_budget(hf_engine, tokenizer, rule):
    t = TreeRollout(hf_engine, TreeConfig(initial_rollouts=2, branch_probability=0.9, branch_rule=rule), budget=6)
    res = run(t.arollout(make_env_factory(tokenizer), PARAMS, n_prompts=2, max_response_tokens=96, seed=7))
    check_budget(res, 6, 96)
    forks = [tr for tr in res.trajectories if tr.parent_id is not None]
    if rule in ("turn", "entropy_value"):  # the tiny model calls a tool, so both rules have somewhere to fork
        assert forks, f"{rule} made no fork: its forks were not exercised"
    if rule == "entropy_value":  # inside a turn: the branch point is a generated token, not a result
        assert any(tr.loss_mask[tr.branch_offset - 1] == 1 for tr in forks)
    # rollout/branch_entropy: each fork's exact token entropy over its first generated run of at most
    # 8 tokens from its branch point, averaged over forks
    want = []
    for tr in forks:
        run_end = tr.branch_offset
        while run_end < min(len(tr.response_ids), tr.branch_offset + 8) and tr.loss_mask[run_end] == 1:
            run_end += 1
        hs = tr.entropy[tr.branch_offset : run_end]
        want += [sum(hs) / len(hs)] if hs else []
    assert want or rule not in ("turn", "entropy_value")
    assert res.metrics()["rollout/branch_entropy"] == pytest.approx(sum(want) / len(want) if want else 0.0, abs=1e-6)


@pytest.mark.parametrize("rule", ["turn", "entropy_value", "mixed_outcome"])
def test_wave_rules_with_aepo_premonitoring(hf_engine, tokenizer, rule):
    # the reused probe is an initial branch like the others: its tool results and tokens are anchors
    cfg = TreeConfig(initial_rollouts=2, branch_rule=rule, enable_dynamic_rollouts=True, reuse_probe=True)
    res = run(TreeRollout(hf_engine, cfg, budget=6).arollout(make_env_factory(tokenizer), PARAMS, n_prompts=2,
                                                             max_response_tokens=96, seed=3))  # fmt: skip
    check_budget(res, 6, 96)
    assert all(1 <= st.initial <= 6 for st in res.prompts)


class Varied(ScriptedEngine):
    """Answers 12 + 7 = 19 in the right format on odd request seeds; on even ones, the scripted
    unformatted 2 (reward -1): so outcomes are mixed."""

    def generate(self, prompts, params):
        out = super().generate(prompts, params)
        reqs = [params] * len(prompts) if isinstance(params, SamplingParams) else params
        for seg, p in zip(out, reqs, strict=True):
            if seg.text.startswith("<answer>") and (p.seed or 0) % 2:
                seg.text = "<think> 19 </think> <answer> \\boxed{19} </answer>"
                ids = self.tokenizer(seg.text, add_special_tokens=False)["input_ids"]
                seg.token_ids = [*ids, self.tokenizer.eos_token_id]
                seg.logprobs = [-0.1] * len(seg.token_ids)
                seg.top_logprobs = [seg.top_logprobs[0]] * len(seg.token_ids) if seg.top_logprobs else None
        return out


def test_mixed_outcome_forks_where_rewards_differ(tokenizer):
    engine = Varied(tokenizer, 1.0, 1.0)
    factory = make_env_factory(tokenizer, tasks=math_tasks(1))  # 12 + 7
    t = TreeRollout(engine, TreeConfig(initial_rollouts=4, branch_rule="mixed_outcome"), budget=8)
    res = run(t.arollout(factory, SamplingParams(), n_prompts=1, max_response_tokens=64, seed=1))
    check_budget(res, 8, 64)
    first = [tr.reward for tr in res.trajectories[:4]]
    assert len(set(first)) == 2, first  # the first wave is mixed, so the second forks after a result
    forks = [tr for tr in res.trajectories if tr.parent_id is not None]
    assert forks and all(tr.lineage["branch_score"] > 0 for tr in forks)


# -- stateful python sessions: a fork continues the interpreter as it was at its branch point ----


class TwoCalls(ScriptedEngine):
    """x = 5, then x = x * 10 (a fork that saw the parent's later state would print 500)."""

    def generate(self, prompts, params):
        out = super().generate(prompts, params)
        enc = lambda s: self.tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        for ids, seg in zip(prompts, out, strict=True):
            ids = list(ids)
            results = ids[len(ids) - ids[::-1].index(self.turn_id) :].count(self.result_id)
            if seg.text.startswith("<python>"):
                seg.text = "<python> x = 5\nprint(x) </python>" if results == 0 else "<python> x = x * 10\nprint(x) </python>"
                seg.token_ids = enc(seg.text)
                seg.logprobs = [-0.1] * len(seg.token_ids)
                seg.top_logprobs = [seg.top_logprobs[0]] * len(seg.token_ids) if seg.top_logprobs else None
        return out


@pytest.mark.parametrize("rule", ["turn", "mixed_outcome"])
def test_wave_forks_continue_the_python_session_of_their_branch_point(tokenizer, rule):
    from agent_envs.core.env import ToolEnv
    from agent_envs.tools.python import PythonTool

    tool = PythonTool(session=True, timeout_s=20.0)
    try:
        tasks = math_tasks(1)
        engine = TwoCalls(tokenizer, 1.0, 1.0, calls_before_answer=2)
        make = lambda: ToolEnv(tasks, [tool], tokenizer=tokenizer, max_tool_calls=3)  # noqa: E731
        cfg = TreeConfig(initial_rollouts=2, branch_rule=rule)
        res = run(TreeRollout(engine, cfg, budget=4).arollout(make, SamplingParams(), n_prompts=1,
                                                               max_response_tokens=200, seed=0))  # fmt: skip
        for tr in res.trajectories:
            assert "<result>\n5\n</result>" in tr.response_text and "<result>\n50\n</result>" in tr.response_text
            assert "500" not in tr.response_text
        if rule == "turn":
            assert any(tr.parent_id is not None for tr in res.trajectories)
    finally:
        tool.close()


# -- agent-envs train with each rule: tree packing, metrics, the viewer's tree ------------------


@pytest.mark.slow
@pytest.mark.parametrize("rule", RULES)
def test_cli_train_with_each_rule(rule, tiny_model_path, tmp_path):
    from baselines.diagnostics.runs import load_run
    from baselines.diagnostics.view.server import prompt_view

    out = tmp_path / rule
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    cmd = [
        sys.executable, "-m", "agent_envs.cli", "train", "--algo", "arpo",
        "--config", str(REPO / "configs" / "arpo_tiny.yaml"), f"tree.branch_rule={rule}",
        f"model={tiny_model_path}", f"output_dir={out}", "total_steps=1", "prompts_per_step=2",
        "group_size=4", "tree.initial_rollouts=2", "max_response_tokens=64", "packing=tree",
        "save_trajectories=true", "health_checks=fatal", "progress=false", "tensorboard=false", "export_model=false", "save_every=0",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = rows[-1]
    assert last["num_trajectories"] == 8 and last["rollout/trajectories_per_prompt"] == 4
    assert last["rollout/generated_tokens_per_prompt"] > 0
    saved = load_run(out)
    step = saved.steps[0]
    view = prompt_view(saved, step, int(next(iter(saved.rows(step)))["group_id"]))
    assert view is not None and len(view["trajectories"]) == 4
    ids = {tr["id"] for tr in view["trajectories"]}
    assert all(tr["parent"] is None or tr["parent"] in ids for tr in view["trajectories"])


def test_the_old_spelling_names_the_new_key(tmp_path):
    # what `agent-envs train ... tree.branch_rule=reference` and a preset's `branch_rule: reference` see
    from agent_envs.base.config import build_config
    from algorithms.arpo import ARPOConfig

    want = "'tree.branch_rule: reference' is now 'tree.entropy_formula: reference'"
    with pytest.raises(ValueError, match=want):
        build_config(ARPOConfig, None, ["tree.branch_rule=reference"])
    preset = tmp_path / "old.yaml"
    preset.write_text("tree:\n  branch_rule: ours\n")
    with pytest.raises(ValueError, match="'tree.branch_rule: ours' is now 'tree.entropy_formula: ours'"):
        build_config(ARPOConfig, preset)


# -- APPO's training rule (advantage_attribution: appo) -----------------------------------------


def test_appo_attribution_golden():
    from algorithms.arpo import appo_attribution

    # branch a (A = 1) with forks b (A = -1, keeps a's first 2 tokens) and c (A = 0.5, first 3):
    # a's positions 0-1 get 1 + mean(-1, 0.5) = 0.75, position 2 gets 1 + 0.5, position 3 stays 1
    adv, mask = appo_attribution(torch.tensor([1.0, -1.0, 0.5]), keys=["a", "b", "c"],
                                 parents=[None, "a", "a"], offsets=[0, 2, 3], mask=torch.ones(3, 4))  # fmt: skip
    assert adv.tolist() == [[0.75, 0.75, 1.5, 1.0], [0.0] * 4, [0.0] * 4]
    assert mask.tolist() == [[1.0] * 4, [0.0] * 4, [0.0] * 4]


@pytest.mark.slow
def test_appo_rule_in_the_learner(tiny_model_path, tokenizer, tmp_path):
    from algorithms.arpo import ARPOConfig, ARPOLearner
    from algorithms.core.batch import RolloutBatch

    class Varied(ARPOLearner):  # distinct rewards, so the two groups' advantages are not all zero
        def shape_rewards(self, trajectories):
            return torch.tensor([float(len(t.response_ids) % 5) for t in trajectories])

    cfg = ARPOConfig(model=str(tiny_model_path), output_dir=str(tmp_path), advantage_attribution="appo",
                     tree=TreeConfig(initial_rollouts=2, branch_rule="entropy_value"), total_steps=1,
                     prompts_per_step=2, group_size=4, max_response_tokens=64, micro_batch_size=4, progress=False,
                     tensorboard=False, export_model=False, threads=1, eval_episodes=0)  # fmt: skip
    learner = Varied(cfg, env_factory=make_env_factory(tokenizer))
    trajs, _ = learner.collect(0)
    forks = [i for i, t in enumerate(trajs) if t.parent_id is not None]
    assert forks, "entropy_value made no fork: the rule was not exercised"
    # a fork inside a turn passes the rollout health checks: its turn is stitched from two engine outputs
    assert any(trajs[f].loss_mask[trajs[f].branch_offset - 1] == 1 for f in forks)
    assert all(not t.health for t in trajs), [t.health for t in trajs]
    batch = RolloutBatch.from_trajectories(trajs, learner.shape_rewards(trajs))
    adv, mask = learner.compute_advantages(batch)
    r = batch.rewards.double()
    z = {}  # GRPO within each of the prompt's two groups: branches from the prompt, and forks
    for g in {t.group_id for t in trajs}:
        for is_fork in (False, True):
            rows = [i for i, t in enumerate(trajs) if t.group_id == g and (t.parent_id is not None) == is_fork]
            if rows:
                std = r[rows].std() if len(rows) > 1 else torch.tensor(0.0)
                z.update(zip(rows, ((r[rows] - r[rows].mean()) / (std + cfg.adv_eps)).tolist(), strict=True))
    for i, t in enumerate(trajs):
        if t.parent_id is not None:  # out of the loss
            assert mask[i].sum() == 0 and adv[i].abs().sum() == 0
            continue
        mine = [f for f in forks if trajs[f].group_id == t.group_id and trajs[f].parent_id == t.traj_id]
        for p in range(len(t.response_ids)):
            cover = [z[f] for f in mine if p < trajs[f].branch_offset]
            want = (z[i] + (sum(cover) / len(cover) if cover else 0.0)) * float(batch.loss_mask[i, p])
            assert adv[i, p].item() == pytest.approx(want, abs=1e-4), (i, p)
    assert torch.isfinite(torch.tensor(learner.train_step()["pg_loss"]))


def test_health_check_accepts_a_turn_stitched_from_two_engine_outputs():
    # a fork inside a turn keeps [5, 6] of its parent's output [5, 6, 7, 8] and the engine, asked
    # from that context, gave [7, 9] (its first token equals the parent's next one); an edited
    # token is still found
    from algorithms.rollout.engine import Segment
    from algorithms.rollout.health import HealthChecker, RecordedEngine
    from algorithms.rollout.trajectory import Trajectory

    class Table:
        tokenizer = None

        def generate(self, prompts, params):
            table = {(1, 2): [5, 6, 7, 8], (1, 2, 5, 6): [7, 9]}
            return [Segment(list(table[tuple(p)]), [0.0] * len(table[tuple(p)])) for p in prompts]

    rec = RecordedEngine(Table())
    rec.generate([[1, 2]], SamplingParams())
    rec.generate([[1, 2, 5, 6]], SamplingParams())
    checker = HealthChecker(mode="warn", engine=rec)

    def turn(ids):
        return Trajectory([1, 2], ids, [1] * 4, [0.0] * 4, segment_starts=[0], traj_id=1, parent_id=0, branch_offset=2)

    assert checker.check_one(turn([5, 6, 7, 9]), rec) == []
    [finding] = checker.check_one(turn([5, 6, 7, 4]), rec)
    assert (finding.check, finding.index) == ("prefix", 3)
