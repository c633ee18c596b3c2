"""What the checkpoint manifest costs: fsync + SHA-256 of every file + manifest, and verification.

    OMP_NUM_THREADS=1 python tests/perf/bench_checkpoint.py [--size 4096] [--rounds 3]

Saves an `nn.Linear(size, size)` with its AdamW state (size 4096: 192 MiB) `rounds` times and
prints, per save, the whole save, the part spent sealing it (fsync, hashes, manifest) and a cold
verification of it. Threads are fixed to 1; the load average is printed with the results.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

from algorithms.core import checkpoint  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(args.size, args.size)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(1, args.size)).sum().backward()
    opt.step()
    model, opt = acc.prepare(model, opt)
    sealing: list[float] = []
    seal = checkpoint._seal

    def timed_seal(*a) -> None:
        t = time.perf_counter()
        seal(*a)
        sealing.append(time.perf_counter() - t)

    checkpoint._seal = timed_seal
    with tempfile.TemporaryDirectory() as run_dir:
        for step in range(1, args.rounds + 1):
            t = time.perf_counter()
            path = checkpoint.save_checkpoint(acc, run_dir, step, {})
            save_s = time.perf_counter() - t
            checkpoint._verified.clear()  # a cold check, as a resume in a new process does
            t = time.perf_counter()
            checkpoint.verify_checkpoint(path)
            verify_s = time.perf_counter() - t
            mib = sum(p.stat().st_size for p in Path(path).iterdir()) / 2**20
            print(f"{mib:.0f} MiB checkpoint: save {save_s:.2f} s, of it sealing {sealing[-1]:.2f} s; "
                  f"verify {verify_s:.2f} s")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
