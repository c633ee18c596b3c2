"""The README's figures agree with the pages and the code they summarise.

The README quotes numbers measured elsewhere (docs/quickstart.md's three-seed table,
docs/benchmarks.md's comparison of the learners) and counts things the code defines (the
benchmark registry, the learners' config defaults). Each test reads the README's figure and the
source's, and fails when either side changes alone, naming both. No model runs: text and
registries only.

    OMP_NUM_THREADS=1 pytest -q tests/test_readme_figures.py
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DASH = "[–-]"  # the README writes ranges with an en dash; a hyphen is accepted too


def _find(pattern: str, text: str, where: str) -> re.Match[str]:
    match = re.search(pattern, text, flags=re.S)
    assert match, f"{where} no longer matches {pattern!r}: update the figure there or this test"
    return match


def _table(page: str, first_header: str) -> list[dict[str, str]]:
    """Rows of the first markdown table on `page` whose header starts with `first_header`."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_header:
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(cells, (c.strip() for c in row.strip().strip("|").split("|")),
                                     strict=False)))
            return rows
    raise AssertionError(f"{page} has no table whose first column is {first_header!r}")


def _number(cell: str) -> float:
    """The first number in a table cell, bold and signs included: '**+38.6**' -> 38.6."""
    return float(_find(r"[-+−]?\d+(?:\.\d+)?", cell.replace(",", ""), f"cell {cell!r}").group(0)
                 .replace("−", "-"))


def _seconds(cell: str) -> float:
    """'3 min 40 s' -> 220."""
    minutes, seconds = _find(r"(\d+) min (\d+) s", cell, f"cell {cell!r}").groups()
    return 60 * int(minutes) + int(seconds)


QUICKSTART = _table("docs/quickstart.md", "seed")


def _column(header_start: str) -> list[str]:
    key = next((k for k in QUICKSTART[0] if k.startswith(header_start)), None)
    assert key, f"docs/quickstart.md's seed table has no column starting {header_start!r}"
    return [row[key] for row in QUICKSTART]


def test_quickstart_table_has_three_seeds() -> None:
    claim = int(_find(r"on each of (\d+) seeds", README, "README's quickstart summary").group(1))
    assert claim == len(QUICKSTART), (
        f"README says {claim} seeds; docs/quickstart.md's table has {len(QUICKSTART)} rows")


def test_quickstart_rise_in_points() -> None:
    low, high = map(float, _find(rf"rises by ([\d.]+){DASH}([\d.]+) points", README,
                                 "README's quickstart summary").groups())
    rises = [_number(c) for c in _column("rise")]
    assert (low, high) == (min(rises), max(rises)), (
        f"README: {low}-{high} points; docs/quickstart.md's rise column: {rises}")


def test_quickstart_tool_use_after_rl() -> None:
    low, high = map(int, _find(rf"call the tool \((\d+){DASH}(\d+) %", README,
                               "README's quickstart summary").groups())
    after = [round(100 * float(c.split("→")[1])) for c in _column("tool use on hard tasks, sampled")]
    assert (low, high) == (min(after), max(after)), (
        f"README: {low}-{high} %; docs/quickstart.md, tool use on hard tasks after GRPO: {after} %")


def test_quickstart_tool_skipping_after_sft() -> None:
    skip = int(_find(r"skipping\s+the Python tool on ~(\d+) %", README,
                     "README's quickstart summary").group(1))
    before = [100 - round(100 * float(c.split("→")[0])) for c in _column("tool use on hard tasks, sampled")]
    assert min(before) - 1 <= skip <= max(before) + 1, (
        f"README: ~{skip} % skip the tool after SFT; docs/quickstart.md: {before} %")


def test_quickstart_wall_time() -> None:
    minutes = int(_find(r"about (\d+) minutes on 2 CPU cores", README, "README's quickstart summary").group(1))
    times = [_seconds(c) for c in _column("wall time")]
    # "about N minutes": within a minute of the table's fastest and slowest runs
    assert min(times) - 60 <= 60 * minutes <= max(times) + 90, (
        f"README: about {minutes} min; docs/quickstart.md's wall times: {times} s")


def test_benchmark_ids() -> None:
    from agent_envs.data import BENCHMARKS

    total, evaluation, training = map(int, _find(
        r"(\d+) real benchmark ids.*?\((\d+)\s+evaluation benchmarks, (\d+) ARPO training sets\)",
        README, "README's environment summary").groups())
    train = [name for name, spec in BENCHMARKS.items() if spec.train]
    assert (total, evaluation, training) == (len(BENCHMARKS), len(BENCHMARKS) - len(train), len(train)), (
        f"README: {total} ids ({evaluation} + {training}); agent_envs.data.BENCHMARKS: "
        f"{len(BENCHMARKS)} ids, training sets {train}")
    page = (ROOT / "docs/benchmarks-data.md").read_text(encoding="utf-8")
    on_page = int(_find(r"(\d+) ids in all", page, "docs/benchmarks-data.md").group(1))
    assert on_page == total, f"README: {total} ids; docs/benchmarks-data.md: {on_page}"


def test_arpo_tool_call_ratio() -> None:
    claim = float(_find(r"ARPO ran ([\d.]+)× GRPO's tool\s+calls", README, "README's measured numbers")
                  .group(1))
    text = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")
    section = _find(r"## Comparison of the four learners on the quickstart task\n(.*?)\n## ", text,
                    "docs/benchmarks.md").group(1)
    stated = float(_find(r"ARPO ran \*\*([\d.]+)×\*\* GRPO's tool calls", section,
                         "docs/benchmarks.md's quickstart comparison").group(1))
    rows = {row["algorithm"]: row for row in _table("docs/benchmarks.md", "algorithm")}
    column = "tool calls run / training trajectory"
    measured = _number(rows["ARPO"][column]) / _number(rows["GRPO"][column])
    assert claim == stated == round(measured, 2), (
        f"README: {claim}×; docs/benchmarks.md says {stated}× and its table gives {measured:.3f}")
    # the README names the preset the comparison ran with; the page must name the same
    preset = _find(r"earlier preset of it \((\d+) % teacher shortcuts,\s+(\d+) SFT steps", README,
                   "README's measured numbers").groups()
    assert re.search(rf"{preset[0]} % of hard tasks,\s+{preset[1]} SFT steps", section), (
        f"README: the comparison ran with {preset[0]} % shortcuts and {preset[1]} SFT steps; "
        "docs/benchmarks.md's comparison section names another preset")


def test_help_excerpt_matches_the_config() -> None:
    """The `agent-envs train --algo arpo --help` excerpt shows each key as the CLI prints it."""
    from agent_envs.base.config import format_help
    from algorithms.cli import learner_class

    excerpt = _find(r"\$ agent-envs train --algo arpo --help\n(.*?)```", README, "README").group(1)
    shown = [line for line in excerpt.splitlines() if re.match(r"  \S+ \(.*default .*\)$", line)]
    assert shown, "README's --help excerpt lists no keys"
    real = format_help(learner_class("arpo").config_class).splitlines()
    for line in shown:
        assert line in real, f"README's --help excerpt shows {line.strip()!r}; the CLI prints otherwise"


def test_preset_excerpt_matches_the_file() -> None:
    """The README's preset excerpt shows the keys and values the preset file holds."""
    import yaml

    name, body = _find(r"```yaml\n# (configs/\S+\.yaml)[^\n]*\n(.*?)```", README, "README's preset excerpt").groups()
    shown, real = yaml.safe_load(body), yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))
    assert shown == real, f"README's excerpt of {name}: {shown}; the file: {real}"


@functools.cache
def _subcommands() -> frozenset[str]:
    from agent_envs.cli import build_parser

    parser = build_parser()
    return frozenset(next(a.choices for a in parser._subparsers._group_actions if a.choices))  # noqa: SLF001


@pytest.mark.parametrize("command", sorted(set(re.findall(r"`agent-envs ([a-z][a-z-]+)", README))))
def test_commands_exist(command: str) -> None:
    assert command in _subcommands(), f"README names `agent-envs {command}`, which the CLI does not have"


def test_real_model_summary_matches_its_page() -> None:
    rows = {row["model"].split(" (")[0]: row for row in _table("docs/real-model.md", "model")}
    sft, grpo, arpo, ratio = _find(
        r"SFT ([\d.]+) held-out sampled accuracy, then ([\d.]+) after \d+ GRPO steps and ([\d.]+) after \d+\s+"
        r"ARPO steps.*?ARPO running ([\d.]+)× GRPO's tool calls", " ".join(README.split()),
        "README's real-model summary").groups()  # the sentence may wrap anywhere
    sampled = {name: _number(rows[name]["sampled"]) for name in ("SFT", "GRPO", "ARPO")}
    assert [float(sft), float(grpo), float(arpo)] == [round(sampled[n], 2) for n in ("SFT", "GRPO", "ARPO")], (
        f"README: {sft}, {grpo}, {arpo}; docs/real-model.md's sampled column: {sampled}")
    calls = {n: _number(rows[n]["tool calls run / training trajectory"]) for n in ("GRPO", "ARPO")}
    assert float(ratio) == round(calls["ARPO"] / calls["GRPO"], 2), (f"README: {ratio}×; page: {calls}")


COUNTING_PLUGIN = '''
import json, os
import pytest


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: every collected test, with its marks
def pytest_collection_modifyitems(items):
    marks = [{m.name for m in item.iter_markers()} for item in items]
    counts = {"all": len(items), "stress": sum("stress" in m for m in marks),
              "slow or stress": sum(bool(m & {"slow", "stress"}) for m in marks)}
    with open(os.environ["README_COUNTS_OUT"], "w") as f:
        json.dump(counts, f)
'''


@pytest.mark.slow
def test_test_counts(tmp_path: Path) -> None:
    """The README's test counts are within 3 % of what pytest collects (one collection, about a
    minute on 2 cores: every module of the packages is imported for its doctests)."""
    import json
    import os
    import subprocess
    import sys

    claims = {target: int(_find(rf"`make {target}` [^(]*\(([\d,]+) tests", README, "README's set-up section")
                          .group(1).replace(",", "")) for target in ("test", "test-fast", "stress")}
    (tmp_path / "readme_counts.py").write_text(COUNTING_PLUGIN)
    out = tmp_path / "counts.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "README_COUNTS_OUT": str(out)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "readme_counts"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    counts = json.loads(out.read_text())
    collected = {"test": counts["all"] - counts["stress"], "test-fast": counts["all"] - counts["slow or stress"],
                 "stress": counts["stress"]}
    off = {t: (claims[t], collected[t]) for t in claims if abs(claims[t] - collected[t]) > 0.03 * collected[t]}
    assert not off, "README's test counts (README, collected): " + ", ".join(
        f"make {t}: {c} vs {n}" for t, (c, n) in off.items())
