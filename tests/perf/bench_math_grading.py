"""Math grading latency on the MATH-500 golden answers: each against itself, against a perturbed
(wrong) answer, and against an equivalent rewrite.

    OMP_NUM_THREADS=1 python tests/perf/bench_math_grading.py [--rounds 3] [--plot bench_math_grading.png]

A = `agent_envs.rewards.math.math_equal` (cheap checks in-process, symbolic stage in a worker
process with a 1 s timeout). B = the baseline measured in the same run: math-verify called
directly on every pair (`parse` both sides, then `verify`, in-process with its signal timeouts
off, as threaded callers must run it). A and B alternate per pair, for `--rounds` rounds.
Target (docs/benchmarks.md): A's median <= 1 ms on golden answers.
Needs AGENT_ENVS_DATA_DIR (the folder that holds math500/test.jsonl).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rich.console import Console  # noqa: E402
from rich.progress import track  # noqa: E402
from rich.table import Table  # noqa: E402

from agent_envs.data import load_benchmark  # noqa: E402
from agent_envs.rewards.math import math_equal, parse_number  # noqa: E402
from agent_envs.rewards.symbolic import default_pool  # noqa: E402


def perturb(gold: str) -> str:
    """A wrong answer of the same shape: numbers shifted by one, expressions given a "+1"."""
    n = parse_number(gold)
    if n is not None:
        return str(n + 1) if n.denominator == 1 else f"\\frac{{{n.numerator + 1}}}{{{n.denominator}}}"
    return f"{gold}+1"


def rewrite(gold: str) -> str:
    """An equivalent answer in another form where one is obvious (fractions as decimals or a/b)."""
    n = parse_number(gold)
    if n is not None and n.denominator != 1:
        return f"{n.numerator}/{n.denominator}"
    if n is not None:
        return f"{n}.0"
    return f"\\left({gold}\\right)" if "," not in gold else gold.replace(",", ", ")


def baseline(pred: str, gold: str) -> bool:
    from math_verify import parse, verify

    return verify(
        parse(f"${gold}$", parsing_timeout=None),
        parse(f"${pred}$", parsing_timeout=None),
        timeout_seconds=None,
    )


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--plot", default=None, help="write a PNG of the latency distributions here")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    console = Console(width=140)
    golds = [t.answers[0] for t in load_benchmark("math500")]
    cases = {
        "gold vs itself": [(g, g) for g in golds],
        "perturbed (wrong)": [(perturb(g), g) for g in golds],
        "equivalent rewrite": [(rewrite(g), g) for g in golds],
    }
    default_pool().warmup()
    baseline("1", "1")  # imports and parser tables before timing
    times: dict[str, dict[str, list[float]]] = {c: {"A": [], "B": []} for c in cases}
    verdicts: dict[str, dict[str, int]] = {c: {"A": 0, "B": 0} for c in cases}
    for r in range(args.rounds):
        for case, pairs in cases.items():
            for pred, gold in track(
                pairs, description=f"round {r + 1}/{args.rounds}: {case}", console=console
            ):
                t0 = time.perf_counter()
                a = math_equal(pred, [gold])[0]
                t1 = time.perf_counter()
                b = baseline(pred, gold)
                t2 = time.perf_counter()
                times[case]["A"].append(t1 - t0)
                times[case]["B"].append(t2 - t1)
                if r == 0:
                    verdicts[case]["A"] += a
                    verdicts[case]["B"] += b
    table = Table(
        title=f"math grading on MATH-500 ({len(golds)} answers x {args.rounds} rounds), ms per pair"
    )
    for col in ("case", "A median", "A p95", "B median", "B p95", "B/A median", "A equal", "B equal"):
        table.add_column(col, justify="right")
    for case in cases:
        a, b = times[case]["A"], times[case]["B"]
        am, bm = statistics.median(a), statistics.median(b)
        table.add_row(
            case, f"{am * 1e3:.3f}", f"{pct(a, 0.95) * 1e3:.3f}", f"{bm * 1e3:.3f}", f"{pct(b, 0.95) * 1e3:.3f}",
            f"{bm / am:.0f}x", f"{verdicts[case]['A']}/{len(golds)}", f"{verdicts[case]['B']}/{len(golds)}",
        )  # fmt: skip
    console.print(table)
    console.print(f"symbolic-stage timeouts during the run: {default_pool().timeouts}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(cases), figsize=(12, 3.2), sharey=True)
        for ax, case in zip(axes, cases, strict=True):
            for label, key in (("ours (A)", "A"), ("math-verify direct (B)", "B")):
                xs = sorted(t * 1e3 for t in times[case][key])
                ax.plot(xs, [i / len(xs) for i in range(len(xs))], label=label)
            ax.set_xscale("log")
            ax.set_title(case)
            ax.set_xlabel("ms per pair (log)")
        axes[0].set_ylabel("fraction of pairs")
        axes[0].legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        console.print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
