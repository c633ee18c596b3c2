"""The ARPO tree rollout over python sessions: branches forked after a python result continue from
the interpreter as it stood there, and each keeps its own state.

The real `TreeRollout`, runner and `ToolEnv`s drive real sandbox sessions; the engine is the ARPO
tests' scripted one (chosen entropies make every path branch at its first result), writing a
different cell for each call of a path:

1. `hist = []` (before the branch point, shared by every branch through the fork);
2. `hist.append(os.getpid())` then `len(hist)`: 1 in each branch when branches are private;
3. `len(hist), hist[0] == os.getpid()`: (1, True), each branch sees only its own append.
"""

from __future__ import annotations

import math

import pytest

from agent_envs.core.env import ToolEnv
from agent_envs.tools import PythonTool
from algorithms.rollout.engine import SamplingParams, Segment
from algorithms.rollout.tree import TreeRollout
from algorithms.rollout.tree_config import TreeConfig
from tests.arpo.arpo_helpers import ScriptedEngine, math_tasks, run

CELLS = ["hist = []", "import os\nhist.append(os.getpid())\nlen(hist)", "len(hist), hist[0] == os.getpid()"]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from algorithms.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model(warmup_steps=150))


class CellEngine(ScriptedEngine):
    """The scripted engine, calling python with cell number `n` after `n` results."""

    def __init__(self, tokenizer, h_first: float, h_react) -> None:
        super().__init__(tokenizer, h_first, h_react, calls_before_answer=len(CELLS))
        self.cells = [tokenizer(f"<python>{c}</python>", add_special_tokens=False)["input_ids"] for c in CELLS]

    def generate(self, prompts, params):
        out = super().generate(prompts, params)
        for i, (ids, seg) in enumerate(zip(prompts, out, strict=True)):
            ids = list(ids)
            start = len(ids) - ids[::-1].index(self.turn_id)
            seen = sum(1 for t in ids[start:] if t == self.result_id)
            if seen < len(CELLS):
                toks = self.cells[seen]
                rows = seg.top_logprobs[:1] * len(toks) if seg.top_logprobs else None
                out[i] = Segment(toks, [seg.logprobs[0]] * len(toks), rows, "stop", "</python>",
                                 f"<python>{CELLS[seen]}</python>")
        return out


def test_tree_branches_fork_the_session_at_the_result(tokenizer):
    vocab = len(tokenizer.get_vocab())
    h0 = 0.5
    # ΔH = +3 after the first result: every path branches there, and the forks fill the budget
    hi = h0 + 3.0 * math.log(vocab) / 20
    engine = CellEngine(tokenizer, h0, lambda n: hi if n == 1 else h0)
    tool = PythonTool(session=True, pool_size=1, timeout_s=10.0)
    try:
        def make() -> ToolEnv:
            return ToolEnv(math_tasks(), [tool], tokenizer=tokenizer, max_tool_calls=4)

        tree = TreeRollout(engine, TreeConfig(initial_rollouts=2, beam_size=3), budget=6, vocab_size=vocab)
        res = run(tree.arollout(make, SamplingParams(), n_prompts=1, max_response_tokens=256, seed=0))
        forks = [t for t in res.trajectories if t.parent_id is not None]
        assert len(forks) == 4 and len(res.trajectories) == 6
        for t in res.trajectories:
            text = tokenizer.decode(t.response_ids)
            results = [r.split("</result>")[0].strip() for r in text.split("<result>")[1:]]
            assert results[1:] == ["1", "(1, True)"], (t.parent_id, text)
    finally:
        tool.close()
