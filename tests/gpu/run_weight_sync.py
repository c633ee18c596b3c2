"""Weight-sync time into vLLM: in-process (colocated, TP 1) and a server at each TP size.

Not collected by pytest. Run from the repository root on a machine with GPUs and `vllm` (CUDA);
see tests/gpu/README.md:

    python tests/gpu/run_weight_sync.py --model Qwen/Qwen2.5-1.5B-Instruct --tp 1 2 4 8

For each case it loads the model's bf16 weights, syncs them `--repeats` times and prints the
median seconds and GB/s, beside docs/scaling.md's assumption for the server's file handoff
(about 1 s per GB through /dev/shm). Send the printed lines back.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.servers import free_port, running_server  # noqa: E402


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, nargs="+", default=[1])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mem", type=float, default=0.5, help="vLLM's gpu_memory_utilization")
    args = p.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    state = model.state_dict()
    gb = sum(t.numel() * t.element_size() for t in state.values()) / 1e9

    from algorithms.rollout.vllm import VLLMEngine

    engine = VLLMEngine(args.model, dtype="bfloat16", gpu_memory_utilization=args.mem, max_model_len=2048)
    on_gpu = {k: v.cuda() for k, v in state.items()}
    s = timed(lambda e=engine, w=on_gpu: e.sync_weights(w), args.repeats)
    print(json.dumps({"case": "in-process", "tp": 1, "weights_gb": gb, "sync_s": s, "gb_per_s": gb / s}))
    del engine, on_gpu
    torch.cuda.empty_cache()

    from algorithms.rollout.vllm_server import VLLMServerEngine

    for tp in args.tp:
        port = free_port()
        cmd = [sys.executable, "-m", "agent_envs.cli", "serve-rollout", args.model, "--port", str(port),
               "--vllm-args", f"--tensor-parallel-size {tp} --gpu-memory-utilization {args.mem} --max-model-len 2048"]
        log = Path(tempfile.mkdtemp(prefix="gpu_server_")) / "server.log"
        with running_server(cmd, port, log, env={"PYTHONPATH": str(REPO)}, ready_path="/v1/models",
                            timeout_s=600) as url:
            remote = VLLMServerEngine(f"{url}/v1", tokenizer=args.model)
            s = timed(lambda remote=remote: remote.sync_weights(state, config=model.config), args.repeats)
            print(json.dumps({"case": "server", "tp": tp, "weights_gb": gb, "sync_s": s, "gb_per_s": gb / s,
                              "assumed_s": gb * 1.0}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
