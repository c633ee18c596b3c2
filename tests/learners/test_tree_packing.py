"""Tree packing (one pass over the packed trees with a tree attention mask, and the walk down
each tree through cached keys and values) gives the flat computation's log-probs, loss and
gradients (fp32, within 1e-5), with full fine-tuning and with LoRA adapters (then the gradients
are the adapters'), under SDPA and eager attention.

The model is the real tiny Qwen2 built locally; the trees are laid out the way the tree rollout
records them (a fork's response before `branch_offset` is its parent's).
"""

from __future__ import annotations

import random

import pytest
import torch

from algorithms.core.logprobs import response_logits, token_logprobs
from algorithms.core.tree_packing import TreePacker, mask_logits, packed_tokens, walk_logits
from algorithms.models.tiny import build_tiny_model
from algorithms.rollout.trajectory import Trajectory


@pytest.fixture(scope="module", params=["full", "lora", "eager"])
def model(request):
    from transformers import AutoModelForCausalLM

    from algorithms.models.lora import LoRAConfig, wrap_lora

    torch.manual_seed(0)
    attention = "eager" if request.param == "eager" else "sdpa"  # the tree mask is additive in eager
    base = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=0), torch_dtype=torch.float32,
                                                attn_implementation=attention)
    if request.param != "lora":
        return base
    lora = wrap_lora(base, LoRAConfig(enabled=True, r=4, alpha=8.0))
    with torch.no_grad():  # B starts at zero, which would leave A's gradients zero: nothing to compare
        for name, p in lora.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.02)
    return lora


def traj(prompt, response, group, tid, parent=None, offset=None):
    n = len(response)
    return Trajectory(list(prompt), list(response), [1] * n, [0.0] * n, group_id=group, traj_id=tid,
                      parent_id=parent, branch_offset=offset)


def grpo_group(rng, group, size=4):
    prompt = [rng.randrange(5, 400) for _ in range(rng.randrange(6, 12))]
    return [traj(prompt, [rng.randrange(5, 400) for _ in range(rng.randrange(3, 9))], group, k) for k in range(size)]


def arpo_tree(rng, group):
    """A root, two forks of it at different points, and a fork of a fork."""
    prompt = [rng.randrange(5, 400) for _ in range(8)]
    root = [rng.randrange(5, 400) for _ in range(10)]
    a = root[:4] + [rng.randrange(5, 400) for _ in range(5)]
    b = root[:7] + [rng.randrange(5, 400) for _ in range(2)]
    c = a[:6] + [rng.randrange(5, 400) for _ in range(4)]
    return [traj(prompt, root, group, 0), traj(prompt, a, group, 1, 0, 4), traj(prompt, b, group, 2, 0, 7),
            traj(prompt, c, group, 3, 1, 6)]


def loss_of(logits, trajs, width):
    targets = torch.zeros((len(trajs), width), dtype=torch.long)
    mask = torch.zeros((len(trajs), width))
    for i, t in enumerate(trajs):
        targets[i, : len(t.response_ids)] = torch.tensor(t.response_ids)
        mask[i, : len(t.response_ids)] = 1
    logp, _ = token_logprobs(logits, targets)
    return logp * mask, (-(logp * mask).sum() / mask.sum())


def mask_logits_in_short_rows(model, trajs, width, **kw):
    return mask_logits(model, trajs, width, row_tokens=24, **kw)  # a tree's subtrees split over rows


def without_forks(fn):
    """`fn` with every trajectory a root: the learner's packing of flat GRPO batches (`packing: flat`)."""
    return lambda model, trajs, width, **kw: fn(model, trajs, width, forks=False, **kw)


def check_equal(model, trajs):
    width = max(len(t.response_ids) for t in trajs)
    results = []
    for fn in (response_logits, walk_logits, mask_logits, mask_logits_in_short_rows, without_forks(mask_logits),
               without_forks(walk_logits), TreePacker(forks=False)):
        model.zero_grad()
        logp, loss = loss_of(fn(model, trajs, width, pad_id=0, device="cpu"), trajs, width)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), loss.item(), grads))
    flat_lp, flat_loss, flat_g = results[0]
    for tree_lp, tree_loss, tree_g in results[1:]:
        assert torch.allclose(flat_lp, tree_lp, atol=1e-5), (flat_lp - tree_lp).abs().max()
        assert abs(flat_loss - tree_loss) < 1e-5
        assert flat_g and flat_g.keys() == tree_g.keys()
        for name in flat_g:
            assert torch.allclose(flat_g[name], tree_g[name], atol=1e-5), name


@pytest.mark.parametrize("shape", ["grpo", "arpo", "mixed"])
def test_tree_packing_equals_the_flat_computation(model, shape):
    rng = random.Random(shape)
    if shape == "grpo":
        trajs = grpo_group(rng, 0) + grpo_group(rng, 1)
    elif shape == "arpo":
        trajs = arpo_tree(rng, 0) + arpo_tree(rng, 1)
    else:  # children listed before parents, and a fork whose parent is not in the micro-batch
        trajs = list(reversed(arpo_tree(rng, 0))) + grpo_group(rng, 1, 3)
        trajs.append(traj(trajs[0].prompt_ids, [7, 8, 9], 0, 9, parent=42, offset=2))
    check_equal(model, trajs)


def test_shared_tokens_are_computed_once():
    rng = random.Random(1)
    tree = arpo_tree(rng, 0)
    # prompt 8 + root 10 + a's own 5 + b's own 2 + c's own 4
    assert packed_tokens(tree) == 8 + 10 + 5 + 2 + 4
    group = grpo_group(rng, 0)
    assert packed_tokens(group) == len(group[0].prompt_ids) + sum(len(t.response_ids) for t in group)


def test_without_forks_every_response_is_computed_whole_after_its_shared_prompt():
    tree = arpo_tree(random.Random(1), 0)
    assert packed_tokens(tree, forks=False) == 8 + 10 + 9 + 9 + 10


def test_the_packer_chooses_the_pass_and_reports_only_tree_packing(monkeypatch):
    """One forward pass for the learner: the full pass per trajectory only where prompts cannot be
    shared (several processes, gradient checkpointing); a ratio only under `packing: tree`."""
    from transformers import AutoModelForCausalLM

    from algorithms.core import tree_packing

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=0), torch_dtype=torch.float32)
    group = grpo_group(random.Random(2), 0)
    width = max(len(t.response_ids) for t in group)
    calls = []
    monkeypatch.setattr(tree_packing, "response_logits", lambda *a, **kw: calls.append("full"))
    monkeypatch.setattr(tree_packing, "tree_logits", lambda *a, forks, **kw: calls.append(("packed", forks)))
    for forks, share in ((False, True), (True, True), (True, False), (False, False)):
        packer = TreePacker(forks=forks, share_prompts=share)
        packer(model, group, width, pad_id=0, device="cpu")
        assert ("tree_token_ratio" in packer.take_metrics()) == forks
    assert calls == [("packed", False), ("packed", True), ("packed", True), "full"]


def test_lineage_not_token_values_decides_sharing():
    """Two roots with equal responses are not merged: only a recorded fork shares tokens."""
    a = traj([1, 2, 3], [4, 5, 6], 0, 0)
    b = traj([1, 2, 3], [4, 5, 6], 0, 1)
    assert packed_tokens([a, b]) == 3 + 3 + 3


def test_the_mask_route_is_taken_only_where_every_layer_uses_the_mask_as_given():
    from types import SimpleNamespace

    from algorithms.core.tree_packing import _takes_tree_mask

    def model(attention, layers=None):
        return SimpleNamespace(config=SimpleNamespace(_attn_implementation=attention, layer_types=layers))

    assert _takes_tree_mask(model("sdpa")) and _takes_tree_mask(model("eager", ["full_attention"] * 2))
    assert not _takes_tree_mask(model("flash_attention_2"))  # no 4D mask: the walk
    assert not _takes_tree_mask(model("flex_attention"))
    assert not _takes_tree_mask(model("sdpa", ["full_attention", "sliding_attention"]))


def test_the_packer_reports_the_exact_ratio_of_each_step():
    """`tree_token_ratio` is packed ÷ flat tokens of the passes since the last read, counting only
    the `width` response tokens a pass computes."""
    from transformers import AutoModelForCausalLM

    from algorithms.core.tree_packing import TreePacker

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(seed=0), torch_dtype=torch.float32)
    rng = random.Random(1)
    tree, group = arpo_tree(rng, 0), grpo_group(rng, 1)
    packer = TreePacker()
    assert packer.take_metrics() == {"tree_token_ratio": 1.0}  # nothing computed yet
    # width 8 cuts the root (10), a (9), b (9) and c (10): a forks at 4, b at 7, c (a's fork) at 6;
    # packed: prompt 8 + root 8 + a 8-4 + b 8-7 + c 8-6 = 23, flat: 4 x (prompt 8 + 8) = 64
    packer(model, tree, 8, pad_id=0, device="cpu")
    assert packer.take_metrics() == {"tree_token_ratio": 23 / 64}
    # the next step counts afresh, over its two micro-batches: the tree at width 5 (packed 8 + 5 +
    # 1 + 0 + 0 = 14 of 4 x 13 = 52) and the GRPO group (its prompt once, every response)
    packer(model, tree, 5, pad_id=0, device="cpu")
    packer(model, group, 9, pad_id=0, device="cpu")
    prompt, lengths = len(group[0].prompt_ids), [len(t.response_ids) for t in group]
    assert max(lengths) <= 9
    expect = (14 + prompt + sum(lengths)) / (52 + 4 * prompt + sum(lengths))
    assert packer.take_metrics() == {"tree_token_ratio": expect}
    assert packer.take_metrics() == {"tree_token_ratio": 1.0}
