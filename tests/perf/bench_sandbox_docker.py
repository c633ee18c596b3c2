"""Benchmark: the Docker backend's warm container pool vs one fresh container per call.

B is how a Docker sandbox usually runs model code (and how this backend ran before its pool):
`docker run --rm` per call, with the same isolation flags. A is `PythonTool(backend="docker")`:
warm containers running the fork server, one fresh process per call, the container reset after
it. Calls alternate A/B in one run so machine load hits both alike. Needs a Docker engine and the
image (`.ci/system` builds `agent-envs-sandbox:bookworm`).

    python tests/perf/bench_sandbox_docker.py --calls 40

Target: A p50 <= 50 ms per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from agent_envs.tools import PythonTool  # noqa: E402
from agent_envs.tools.sandbox import SandboxConfig  # noqa: E402
from agent_envs.tools.sandbox.docker import DockerSandbox  # noqa: E402

CODE = "x = sum(i * i for i in range(1000))\nprint(x)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40, help="A calls; B makes one per 4 A calls")
    parser.add_argument("--image", default=os.environ.get("AGENT_ENVS_SANDBOX_IMAGE", "agent-envs-sandbox:bookworm"))
    parser.add_argument("--gap-ms", type=float, default=20.0, help="pause between calls (generation time)")
    args = parser.parse_args()
    tool = PythonTool(backend="docker", docker_image=args.image, timeout_s=20, pool_size=1)
    options = DockerSandbox(SandboxConfig(docker_image=args.image)).container_options()
    fresh = ["docker", "run", "--rm", *options, args.image, "python", "-I", "-c", CODE]
    assert tool.run(CODE).text == "332833500", "warm-up call failed"
    a: list[float] = []
    b: list[float] = []
    for i in range(args.calls):
        t = time.perf_counter()
        assert tool.run(CODE).text == "332833500"
        a.append(time.perf_counter() - t)
        if i % 4 == 0:
            t = time.perf_counter()
            subprocess.run(fresh, capture_output=True, check=True, timeout=120)
            b.append(time.perf_counter() - t)
        time.sleep(args.gap_ms / 1000)
        print(f"\r{i + 1}/{args.calls} calls", end="", flush=True)
    tool.close()
    pa, pb = statistics.median(a), statistics.median(b)
    print(f"\nload average {os.getloadavg()[0]:.2f}; {args.calls} warm calls, {len(b)} fresh containers")
    print(f"A warm pool          p50 {pa * 1000:8.1f} ms   max {max(a) * 1000:8.1f} ms")
    print(f"B container per call p50 {pb * 1000:8.1f} ms   max {max(b) * 1000:8.1f} ms")
    print(f"B / A = {pb / pa:.0f}x")


if __name__ == "__main__":
    main()
