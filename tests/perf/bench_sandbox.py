"""Benchmark: one sandboxed python call (`LocalSandbox`, all isolation on) vs the alternatives.

B sides, alternated with A call by call in one run so machine load hits all alike:
- `bare`: a fresh system interpreter per call, `/usr/bin/python3 -I -S -c CODE` (no isolation; the
  floor of any spawn-per-call design, without a venv's import hooks);
- `gem` (with `--peer-python`): GEM's python tool (`PythonCodeTool.execute_action`, sandbox_type
  "none") in a long-lived process of that interpreter; it spawns `python -c` per call.

    python tests/perf/bench_sandbox.py --calls 60 [--peer-python /path/to/gem-venv/bin/python]
    python tests/perf/bench_sandbox.py --calls 60 --as-uid 65534      # as an unprivileged user
    python tests/perf/bench_sandbox.py --service-url http://127.0.0.1:8100   # + through the service

`--as-uid` (when root) reruns this file under `setpriv` with the system Python and a readable copy
of the stdlib-only sandbox package, as a real user runs it (user namespaces instead of the uid
drop). Cases: calls 20 ms apart (a model generates between calls), back to back (bursts of 11, the
first of each not counted), and `sympy` preloaded vs imported per call (when B can import it).
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


def compare(label, sandbox, code: str, sides: dict, b_code: str, calls: int, burst: int, gap_s: float):
    """Alternate A (the sandbox) with each B side; returns one row per B side."""
    want = sandbox.execute(code).stdout.strip()  # workers start (lazily) outside the measurement
    for run in sides.values():
        assert run(b_code) == want, (run(b_code), want)
    a: list[float] = []
    b: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(calls):
        for i in range(burst):
            if gap_s and i == 0:
                time.sleep(gap_s)
            start = time.perf_counter()
            result = sandbox.execute(code)
            if burst == 1 or i > 0:
                a.append(time.perf_counter() - start)
            assert result.stdout.strip() == want and not result.error, result
        for name, run in sides.items():
            time.sleep(gap_s)
            start = time.perf_counter()
            run(b_code)
            b[name].append(time.perf_counter() - start)
    p50a = statistics.median(a)
    return [
        [
            label,
            f"{p50a * 1e3:.2f}",
            f"{percentile(a, 0.95) * 1e3:.2f}",
            name,
            f"{statistics.median(times) * 1e3:.1f}",
            f"{statistics.median(times) / p50a:.1f}x",
        ]
        for name, times in b.items()
    ]


def run(args: argparse.Namespace, sandbox_module) -> None:
    config_cls, local = sandbox_module
    load_before = os.getloadavg()
    sides = {"bare": bare}
    gem = Gem(args.peer_python) if args.peer_python else None
    if gem:
        sides["gem"] = gem
    rows = []
    sandbox = local.LocalSandbox(config_cls(timeout_s=10, preamble=("math",), pool_size=1))
    code = "print(1+1)"
    rows += compare("20 ms apart", sandbox, code, sides, code, args.calls, 1, 0.02)
    rows += compare("back to back", sandbox, code, sides, code, max(1, args.calls // 10), 11, 0.0)
    isolation = sandbox.isolation
    sandbox.close()
    if args.service_url:  # the same call through `agent-envs serve-sandbox` (started with --preamble math)
        from importlib import import_module

        service = import_module(local.__name__.rsplit(".", 1)[0] + ".service")
        client = service.ServiceSandbox(config_cls(timeout_s=10, service_url=args.service_url))
        rows += compare("service, 20 ms apart", client, code, sides, code, args.calls, 1, 0.02)
        client.close()
    sympy_sides = {name: fn for name, fn in sides.items() if _imports(name, args, "sympy")}
    if sympy_sides:
        sandbox = local.LocalSandbox(config_cls(timeout_s=30, preamble=("sympy",), pool_size=1))
        rows += compare(
            "sympy: preamble vs import per call",
            sandbox,
            "print(sympy.Integer(1) + 1)",
            sympy_sides,
            "import sympy\nprint(sympy.Integer(1) + 1)",
            args.sympy_calls,
            1,
            0.02,
        )
        sandbox.close()
    if gem:
        gem.close()
    print(f"uid {os.getuid()}, python {sys.version.split()[0]} ({sys.executable}), isolation {isolation}")
    print(f"load average before {_load(load_before)}, after {_load(os.getloadavg())}")
    header = ["case", "sandbox p50 ms", "sandbox p95 ms", "B", "B p50 ms", "speed-up (p50)"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(" | ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)))


def _imports(side: str, args: argparse.Namespace, module: str) -> bool:
    python = args.peer_python if side == "gem" else BARE_PYTHON
    flags = [] if side == "gem" else ["-I", "-S"]
    return subprocess.run([python, *flags, "-c", f"import {module}"], capture_output=True).returncode == 0


def _load(values: tuple[float, float, float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def rerun_as(uid: int, argv: list[str]) -> int:
    """Run this benchmark as `uid` with the system Python and a readable copy of the sandbox."""
    if os.geteuid() != 0:
        sys.exit("--as-uid needs root (setpriv); run the benchmark directly as that user instead")
    # Not under /tmp: each call would then bind the copy again above its own /tmp (extra mounts
    # that a user whose Python lives elsewhere does not pay).
    copy = Path(tempfile.mkdtemp(prefix="bench-sandbox-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    try:
        shutil.copytree(
            HERE.parents[2] / "agent_envs/tools/sandbox",
            copy / "sandbox",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        shutil.copy(HERE, copy / HERE.name)
        for path in [copy, *copy.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        command = [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            BARE_PYTHON,
            str(copy / HERE.name),
            "--sandbox-dir",
            str(copy),
            *argv,
        ]
        return subprocess.run(
            command, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}, cwd="/"
        ).returncode
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--sympy-calls", type=int, default=20)
    parser.add_argument("--peer-python", help="GEM's venv interpreter: GEM's python tool becomes a B side")
    parser.add_argument("--service-url", help="also measure calls through this sandbox service (preamble math)")
    parser.add_argument("--as-uid", type=int, help="(as root) rerun as this unprivileged uid")
    parser.add_argument("--sandbox-dir", help=argparse.SUPPRESS)  # set by --as-uid
    args = parser.parse_args()
    if args.as_uid is not None:
        argv = list(sys.argv[1:])
        i = argv.index("--as-uid")
        del argv[i : i + 2]
        sys.exit(rerun_as(args.as_uid, argv))
    if args.sandbox_dir:  # the stdlib-only sandbox package, without the project's dependencies
        sys.path.insert(0, args.sandbox_dir)
        from sandbox import SandboxConfig, local
    else:
        from agent_envs.tools.sandbox import SandboxConfig, local
    if args.peer_python and not os.access(args.peer_python, os.X_OK):
        sys.exit(f"--peer-python {args.peer_python}: not an executable this user can run")
    run(args, (SandboxConfig, local))


if __name__ == "__main__":
    main()
