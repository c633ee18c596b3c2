"""The capacity model's tables in docs/scaling.md are its current output, and its arithmetic holds.

The hand-computed 7B case is the module's doctest (algorithms/core/capacity.py).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex

import pytest
from learner_support import REPO

from algorithms.core import capacity

BLOCK = re.compile(r"```console\n\$ python -m algorithms\.core\.capacity(.*?)\n(.*?)```", re.DOTALL)


def test_the_docs_tables_are_the_models_output():
    blocks = BLOCK.findall((REPO / "docs" / "scaling.md").read_text())
    assert len(blocks) >= 4, "docs/scaling.md shows the capacity tables"
    for args, shown in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            capacity.main(shlex.split(args))
        assert out.getvalue() == shown, (
            f"docs/scaling.md: the table of `python -m algorithms.core.capacity{args}` is stale; paste its output"
        )


def test_sharding_divides_the_state_and_layouts_behave():
    m = capacity.QWEN25["7B"]
    assert capacity.train_state_gb(m.params(), shards=16) == pytest.approx(capacity.train_state_gb(m.params()) / 16)
    small = capacity.plan("7B", gpus=8, gpu="h100")
    big = capacity.plan("7B", gpus=8, gpu="h200")
    assert big.kv_room_gb - small.kv_room_gb == pytest.approx(141 - 80)  # same learner, more room
    assert big.rollout_s < small.rollout_s  # more sequences at once, more bandwidth
    # 32B never fits colocated on 8 x 80 GB; a server on GPUs of its own has room for sequences
    assert capacity.plan("32B", gpus=8).sequences == 0
    assert capacity.plan("32B", gpus=16, server_gpus=16, tp=8).sequences > 100
    # time scales with tokens: twice the prompts, twice the update
    assert capacity.plan("7B", prompts=256).train_s == pytest.approx(2 * small.train_s)
