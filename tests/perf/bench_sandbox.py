"""Benchmark: a sandboxed python call through PythonTool(local) vs a fresh `python -c` per call.

The baseline is how the public ARPO reference runs model code (a new interpreter per call, no
isolation). Calls alternate A/B in one run so machine load hits both alike; the second pair
compares `import sympy` paid per call (fresh interpreter) with sympy preloaded in the preamble.

    python tests/perf/bench_sandbox.py --calls 200

Targets: sandbox p50 <= 3 ms and >= 8x faster than the fresh interpreter. The back-to-back row
shows the cost when a call arrives before the worker has prepared its child (in an env the model's
generation between calls leaves it time).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rich.console import Console  # noqa: E402
from rich.progress import track  # noqa: E402
from rich.table import Table  # noqa: E402

from agent_envs.tools import PythonTool  # noqa: E402


def fresh_interpreter(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def compare(
    label: str, tool: PythonTool, tool_code: str, fresh_code: str, calls: int, burst: int = 1
) -> list[str]:
    """Alternate A (the tool, awaited in one long-lived loop as the env does) and B (fresh spawn).

    With `burst` > 1, A runs `burst` calls in a row and only the calls after the first count: each
    then arrives while the worker is still tearing down the previous call and preparing the next.
    """
    await tool(tool_code)  # start the worker (lazy) outside the measurement
    fresh_interpreter(fresh_code)
    a, b = [], []
    for _ in track(range(calls), description=label):
        for i in range(burst):
            start = time.perf_counter()
            res = await tool(tool_code)
            if burst == 1 or i > 0:
                a.append(time.perf_counter() - start)
            assert res.ok and res.text == "2", res.text
        start = time.perf_counter()
        fresh_interpreter(fresh_code)
        b.append(time.perf_counter() - start)
    p50a, p50b = statistics.median(a), statistics.median(b)
    return [
        label,
        f"{p50a * 1e3:.2f}",
        f"{percentile(a, 0.95) * 1e3:.2f}",
        f"{p50b * 1e3:.1f}",
        f"{percentile(b, 0.95) * 1e3:.1f}",
        f"{p50b / p50a:.1f}x",
    ]


async def run(args: argparse.Namespace) -> None:
    rows = []
    tool = PythonTool(timeout_s=10, preamble=("math",), pool_size=1)
    rows.append(await compare("print(1+1)", tool, "print(1+1)", "print(1+1)", args.calls))
    rows.append(
        await compare(
            "print(1+1), back-to-back calls", tool, "print(1+1)", "print(1+1)", args.calls // 10, burst=11
        )
    )
    isolation = tool.isolation
    await tool.aclose()
    tool = PythonTool(timeout_s=10, preamble=("sympy",), pool_size=1)
    rows.append(
        await compare(
            "sympy: preamble vs import per call",
            tool,
            "print(sympy.Integer(1) + 1)",
            "import sympy\nprint(sympy.Integer(1) + 1)",
            args.sympy_calls,
        )
    )
    await tool.aclose()
    table = Table(title=f"python sandbox (local) vs fresh interpreter; isolation: {isolation}")
    for col in ("case", "sandbox p50 ms", "sandbox p95 ms", "fresh p50 ms", "fresh p95 ms", "speed-up (p50)"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--sympy-calls", type=int, default=30)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
