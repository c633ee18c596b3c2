"""The HF engine decodes on the thread count it was built with, in whichever thread runs it.

torch keeps its OpenMP thread count per thread, and the env loop's executor threads, where
`agenerate` decodes, live as long as the process: one that ran torch work under an earlier run's
count kept it, so a resumed run decoded on other float kernels than the run it resumed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from algorithms.rollout import SamplingParams
from algorithms.rollout.hf import HFEngine


def test_a_worker_thread_decodes_on_the_engines_count(hf_engine):
    engine = HFEngine(hf_engine.model, hf_engine.tokenizer, threads=1, seed=0)
    before = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(1) as worker:
            torch._C.set_num_threads(2)
            assert worker.submit(torch.get_num_threads).result() == 2  # the worker's torch starts up
            torch._C.set_num_threads(1)
            if worker.submit(torch.get_num_threads).result() != 2:
                pytest.skip("this torch build shares one thread count between threads")
            [seg] = worker.submit(
                engine.generate, [[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0)
            ).result()
            assert len(seg.token_ids) == 2
            assert worker.submit(torch.get_num_threads).result() == 1
    finally:
        torch._C.set_num_threads(before)
