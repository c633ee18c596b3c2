"""The GPU check (`python -m algorithms.gpu_check`, docs/scaling.md "The GPU check") as a dry run on
CPU: the real command, on the toy shape, writes every row with numbers into a JSON file and a
well-formed markdown table; its time limit skips what it cannot start and says so in both.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
from learner_support import REPO, cli_env

from algorithms.core.capacity import QWEN25
from algorithms.core.tree_packing import packed_tokens
from algorithms.gpu_check import (
    COLUMNS,
    DRY,
    FULL,
    TOY,
    Budget,
    GPUCheckConfig,
    ModelBench,
    Row,
    arpo_trajectories,
    main,
    run_rows,
)

ROWS = [("generate", "batch 2"), ("generate", "batch 4"), ("parity", "batch 2"), ("learner", "full, 8 x 32"),
        ("packing", "ARPO flat, 8 x 32"), ("packing", "ARPO tree, 8 x 32"), ("learner", "LoRA r=4, 8 x 32")]


def gpu_check(out, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "algorithms.gpu_check", "--dry-run", "--out", str(out), *args],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)  # fmt: skip


def table(md: str) -> list[list[str]]:
    """The markdown table's rows as cells (an escaped `\\|` stays inside its cell); checks its shape."""
    lines = md.splitlines()
    lines = [line for line in lines[lines.index("| " + " | ".join(COLUMNS) + " |") :] if line.startswith("|")]
    cells = [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
    assert cells[0] == list(COLUMNS)
    assert all(set(c) == {"-"} for c in cells[1]), "the header's separator line"
    assert all(len(row) == len(COLUMNS) for row in cells), md
    return cells[2:]


@pytest.mark.slow  # ~10 s: a subprocess that builds and trains the toy model three times
def test_the_dry_run_measures_every_row(tmp_path):
    done = gpu_check(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = report["rows"]
    assert [(r["measure"], r["setting"]) for r in rows] == ROWS
    assert report["dry_run"] is True and report["time_limit_s"] == 480
    for r in rows:
        assert r["status"] == "ok", r
        for key in ("ours", "bare", "ratio", "time_s"):
            assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, (key, r)
        assert r["ratio"] == pytest.approx(r["ours"] / r["bare"])
        assert (r["peak_mem_gib"] is None) == (report["device"] == "cpu")
    parity = rows[2]
    assert parity["ours"] < 0.5 and parity["extra"]["mean_abs_diff"] <= parity["ours"]
    # the tree row ran the real packer on the ARPO batch: one group per micro-batch, so its token
    # ratio is the batch's packed tokens over its flat ones
    trajs = arpo_trajectories(DRY, TOY.vocab, np.random.default_rng([0, 1]))
    groups = [trajs[i : i + DRY.group] for i in range(0, len(trajs), DRY.group)]
    flat = sum(len(t.input_ids) for t in trajs)
    assert rows[5]["extra"]["tree_token_ratio"] == pytest.approx(sum(packed_tokens(g) for g in groups) / flat)
    assert rows[5]["extra"]["tree_token_ratio"] < 0.8
    md_rows = table((tmp_path / "gpu_check.md").read_text())
    assert [(c[1], c[2], c[-1].split(":")[0]) for c in md_rows] == [(m, s, "ok") for m, s in ROWS]
    assert all(c[4] != "-" and c[5] != "-" and c[6] != "-" for c in md_rows)
    progress = [line for line in done.stdout.splitlines() if line.startswith("[gpu-check ")]
    assert len(progress) == 2 * len(ROWS), done.stdout  # a line as each row starts and as it ends


def test_no_time_left_skips_every_row_and_fails(tmp_path, capsys):
    # in this process: with no row started, no model, accelerator or tokenizer is made
    assert main(["--dry-run", "--time-limit-s", "0", "--out", str(tmp_path)]) == 1
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    assert len(rows) == len(ROWS) and all(r["status"] == "skipped" and r["ours"] is None for r in rows)
    assert all(c[-1].startswith("skipped: time limit: ") for c in table((tmp_path / "gpu_check.md").read_text()))
    assert capsys.readouterr().out.count(": skipped (time limit") == len(ROWS)


def test_the_docs_table_has_the_rows_of_a_full_run():
    text = (REPO / "docs" / "scaling.md").read_text()
    shown = [tuple(c[:4]) for c in table(text.split("## The GPU check")[1])]
    planned = [(r.model, r.measure, r.setting, r.unit) for m in ("0.5B", "1.5B")
               for r, _ in ModelBench(m, QWEN25[m], FULL, GPUCheckConfig(), ctx=None).rows()]  # fmt: skip
    assert shown == planned, "docs/scaling.md: the GPU check's table lacks rows of the command (or has others)"


def test_rows_start_only_while_the_time_left_exceeds_the_longest_row():
    now = [0.0]

    def takes(seconds):
        def measure(row):
            now[0] += seconds
            row.ours = seconds

        return measure

    def fails(row):
        now[0] += 1
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    rows = [Row("m", "x", str(i), "s") for i in range(5)]
    plan = list(zip(rows, [takes(10), fails, takes(10), takes(1), takes(1)], strict=True))
    lines, reports = [], []
    run_rows(plan, Budget(30, clock=lambda: now[0]), report=lambda: reports.append(1), log=lines.append)
    # 0-10 s, 10-11 s (fails), 11-21 s; at 21 s 9 s are left, less than the longest row (10 s)
    assert [r.status for r in rows] == ["ok", "error", "ok", "skipped", "skipped"]
    assert rows[1].note == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert rows[3].note == "time limit: 21 s of 30 s spent" and rows[3].ours is None
    assert len(reports) == 3 and len(lines) == 3 * 2 + 2
