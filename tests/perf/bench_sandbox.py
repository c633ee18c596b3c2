"""Benchmark: one sandboxed python call (`LocalSandbox`, all isolation on) vs the alternatives.

A sides (sandboxes), each alternated call by call with the others and with the B sides in one
run, so machine load hits all alike:
- this user's `LocalSandbox` (as root: code runs as uid 65534 after a uid drop);
- with `--as-uid N` (as root, repeatable): the same as uid N, in a helper under `setpriv` with the
  system Python and a readable copy of the stdlib-only sandbox package, as a real user runs it (a
  user namespace instead of the uid drop); the helper times its own calls. `--as-uid 0` gives root
  the same interpreter and helper, for a like-for-like root vs unprivileged comparison;
- with `--service-url`: the same call through `agent-envs serve-sandbox --preamble math`.
B sides (baselines):
- `bare`: a fresh system interpreter per call, `/usr/bin/python3 -I -S -c CODE` (no isolation; the
  floor of any spawn-per-call design, without a venv's import hooks);
- `gem` (with `--peer-python`): GEM's python tool (`PythonCodeTool.execute_action`, sandbox_type
  "none") in a long-lived process of that interpreter; it spawns `python -c` per call.

    python tests/perf/bench_sandbox.py --calls 60 --as-uid 65534 \
        [--peer-python /path/to/gem-venv/bin/python] [--service-url http://127.0.0.1:8100]

Cases: calls 20 ms apart (a model generates between calls), back to back (bursts of 11, the first
of each not counted), and `sympy` preloaded vs imported per call (when a B side can import it).
Targets: p50 <= 1.5 ms with gaps, <= 2.5 ms back to back, >= 10x the bare interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
HERE = Path(__file__).resolve()
BARE_PYTHON = "/usr/bin/python3"

GEM_DRIVER = """
import json, sys, time
from gem.tools.python_code_tool import PythonCodeTool
tool = PythonCodeTool(timeout=10)
for line in sys.stdin:
    code = json.loads(line)
    start = time.perf_counter()
    _, has_error, observation, _ = tool.execute_action("<python>" + code + "</python>")
    print(json.dumps([time.perf_counter() - start, has_error, observation]), flush=True)
"""


class Gem:
    """GEM's python tool, driven call by call in its own interpreter (its venv first on PATH, so
    the `python` it spawns is that venv's, as in a GEM install)."""

    def __init__(self, python: str) -> None:
        self.workdir = tempfile.mkdtemp(prefix="bench-gem-")  # GEM makes a temp dir per call in "."
        path = os.path.dirname(python) + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
        self.proc = subprocess.Popen(
            [python, "-c", GEM_DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=self.workdir,
            env={"PATH": path, "HOME": self.workdir, "OMP_NUM_THREADS": "1"},
        )

    def __call__(self, code: str) -> str:
        self.proc.stdin.write(json.dumps(code) + "\n")
        self.proc.stdin.flush()
        _, has_error, observation = json.loads(self.proc.stdout.readline())
        if has_error:
            raise RuntimeError(f"GEM's tool failed on {code!r}: {observation}")
        return observation.removeprefix("Code execution result: ").strip()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def bare(code: str) -> str:
    return subprocess.run(
        [BARE_PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_burst(sandbox, code: str, n: int, gap_s: float) -> tuple[list[float], str]:
    """`n` calls in a row after `gap_s` idle; the times of all but the first when n > 1."""
    time.sleep(gap_s)
    times, stdout = [], ""
    for _ in range(n):
        start = time.perf_counter()
        result = sandbox.execute(code)
        times.append(time.perf_counter() - start)
        if result.error or result.exit_code != 0:
            raise RuntimeError(f"sandbox call failed: {result}")
        stdout = result.stdout.strip()
    return (times[1:] if n > 1 else times), stdout


class InProcess:
    """A sandbox this process calls (a `LocalSandbox`, or the client of a service)."""

    def __init__(self, sandbox) -> None:
        self.sandbox = sandbox

    def burst(self, code: str, n: int, gap_s: float) -> tuple[list[float], str]:
        return timed_burst(self.sandbox, code, n, gap_s)

    def close(self) -> None:
        self.sandbox.close()


class AsUser:
    """A `LocalSandbox` in a helper process running as another uid (system Python, a readable copy
    of the stdlib-only sandbox package outside /tmp); it times its own calls, so the pipe to it
    is not counted."""

    def __init__(self, uid: int, preamble: str) -> None:
        # Not under /tmp: each call would then bind the copy again above its own /tmp (extra
        # mounts that a user whose Python lives elsewhere does not pay).
        base = "/var/tmp" if os.path.isdir("/var/tmp") else None
        self.copy = Path(tempfile.mkdtemp(prefix="bench-sandbox-", dir=base))
        shutil.copytree(
            HERE.parents[2] / "agent_envs/tools/sandbox",
            self.copy / "sandbox",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        shutil.copy(HERE, self.copy / HERE.name)
        for path in [self.copy, *self.copy.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        command = [
            *setpriv,
            BARE_PYTHON,
            str(self.copy / HERE.name),
            "--timing-server",
            str(self.copy),
            preamble,
        ]
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
            cwd="/",
        )

    def burst(self, code: str, n: int, gap_s: float) -> tuple[list[float], str]:
        self.proc.stdin.write(json.dumps([code, n, gap_s]) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        if "error" in reply:
            raise RuntimeError(f"the sandbox as another user failed: {reply['error']}")
        return reply["times"], reply["stdout"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()
        shutil.rmtree(self.copy, ignore_errors=True)


def timing_server(sandbox_dir: str, preamble: str) -> None:
    """The helper behind `AsUser`: bursts requested on stdin, times on stdout, one JSON line each."""
    sys.path.insert(0, sandbox_dir)
    from sandbox import SandboxConfig
    from sandbox.local import LocalSandbox

    sandbox = LocalSandbox(SandboxConfig(timeout_s=30, preamble=(preamble,), pool_size=1))
    for line in sys.stdin:
        code, n, gap_s = json.loads(line)
        try:
            times, stdout = timed_burst(sandbox, code, n, gap_s)
            print(json.dumps({"times": times, "stdout": stdout}), flush=True)
        except RuntimeError as exc:
            print(json.dumps({"error": str(exc)}), flush=True)
    print(
        f"uid {os.getuid()}: python {sys.version.split()[0]}, isolation {sandbox.isolation}", file=sys.stderr
    )
    sandbox.close()


def compare(
    label: str, a_sides: dict, code: str, b_sides: dict, b_code: str, calls: int, burst: int, gap_s: float
) -> list[list[str]]:
    """Alternate every A side (sandboxes) and B side (baselines) call by call; one row per A side."""
    for side in a_sides.values():  # workers start (lazily) outside the measurement
        _, want = side.burst(code, 1, 0.0)
    for name, run_b in b_sides.items():
        if run_b(b_code) != want:
            raise RuntimeError(f"B side {name} printed {run_b(b_code)!r}, the sandbox {want!r}")
    a: dict[str, list[float]] = {name: [] for name in a_sides}
    b: dict[str, list[float]] = {name: [] for name in b_sides}
    for _ in range(calls):
        for name, side in a_sides.items():
            times, stdout = side.burst(code, burst, gap_s)
            assert stdout == want, (stdout, want)
            a[name] += times
        for name, run_b in b_sides.items():
            time.sleep(gap_s)
            start = time.perf_counter()
            run_b(b_code)
            b[name].append(time.perf_counter() - start)
    rows = []
    for name, times in a.items():
        p50 = statistics.median(times)
        cells = {
            k: f"{statistics.median(t) * 1e3:.1f} ({statistics.median(t) / p50:.1f}x)" for k, t in b.items()
        }
        rows.append([label, name, f"{p50 * 1e3:.2f}", f"{percentile(times, 0.95) * 1e3:.2f}", cells])
    return rows


def run(args: argparse.Namespace) -> None:
    from agent_envs.tools.sandbox import SandboxConfig
    from agent_envs.tools.sandbox.local import LocalSandbox
    from agent_envs.tools.sandbox.service import ServiceSandbox

    load_before = os.getloadavg()
    b_sides = {"bare": bare}
    gem = Gem(args.peer_python) if args.peer_python else None
    if gem:
        b_sides["gem"] = gem
    me = f"uid {os.getuid()}"
    local = LocalSandbox(SandboxConfig(timeout_s=10, preamble=("math",), pool_size=1))
    a_sides = {me: InProcess(local)}
    for uid in args.as_uid:
        a_sides[f"uid {uid}, system Python"] = AsUser(uid, "math")
    if args.service_url:  # `agent-envs serve-sandbox --preamble math`, as this user
        a_sides[f"{me}, service"] = InProcess(ServiceSandbox(SandboxConfig(service_url=args.service_url)))
    code = "print(1+1)"
    rows = compare("20 ms apart", a_sides, code, b_sides, code, args.calls, 1, 0.02)
    rows += compare("back to back", a_sides, code, b_sides, code, max(1, args.calls // 10), 11, 0.0)
    isolation = local.isolation
    for side in a_sides.values():
        side.close()
    sympy_b = {name: fn for name, fn in b_sides.items() if _imports(name, args, "sympy")}
    if sympy_b:
        sympy_a = {me: InProcess(LocalSandbox(SandboxConfig(timeout_s=30, preamble=("sympy",), pool_size=1)))}
        rows += compare(
            "sympy preloaded vs imported",
            sympy_a,
            "print(sympy.Integer(1) + 1)",
            sympy_b,
            "import sympy\nprint(sympy.Integer(1) + 1)",
            args.sympy_calls,
            1,
            0.02,
        )
        sympy_a[me].close()
    if gem:
        gem.close()
    print(f"{me}, python {sys.version.split()[0]}, isolation {isolation}")
    print(f"load average before {_load(load_before)}, after {_load(os.getloadavg())}")
    header = ["case", "sandbox", "p50 ms", "p95 ms", *(f"{name} p50 ms (speed-up)" for name in b_sides)]
    table = [header] + [[*row[:4], *(row[4].get(name, "-") for name in b_sides)] for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for row in table:
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def _imports(side: str, args: argparse.Namespace, module: str) -> bool:
    python = args.peer_python if side == "gem" else BARE_PYTHON
    flags = [] if side == "gem" else ["-I", "-S"]
    return subprocess.run([python, *flags, "-c", f"import {module}"], capture_output=True).returncode == 0


def _load(values: tuple[float, float, float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def main() -> None:
    if sys.argv[1:2] == ["--timing-server"]:  # the helper of --as-uid (stdlib only)
        timing_server(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--sympy-calls", type=int, default=20)
    parser.add_argument("--peer-python", help="GEM's venv interpreter: GEM's python tool becomes a B side")
    parser.add_argument(
        "--service-url", help="also measure calls through this sandbox service (preamble math)"
    )
    parser.add_argument(
        "--as-uid",
        type=int,
        action="append",
        default=[],
        help="(as root) also measure as this uid with the system Python; repeat it (0 gives root the same interpreter)",
    )
    args = parser.parse_args()
    if args.as_uid and os.geteuid() != 0:
        sys.exit("--as-uid needs root (setpriv); run the benchmark as that user instead")
    if args.peer_python and not os.access(args.peer_python, os.X_OK):
        sys.exit(f"--peer-python {args.peer_python}: not an executable this user can run")
    run(args)


if __name__ == "__main__":
    main()
