"""Fixtures of the learner tests: one real SFT run of the tiny model per session.

The SFT'd model writes the tag protocol, so RL rollouts on AgentMath-v0 have rewards that differ
within a group (an untrained model fails the format everywhere: every advantage would be 0 and
no test of an update could fail).
"""

from __future__ import annotations

import pytest
from learner_support import SYSTEM_PROMPT


def pytest_collection_modifyitems(items):
    """Tests on the SFT run are `slow`: the run takes about two minutes on a busy 2-core machine,
    more than all of `make test-fast` should."""
    for item in items:
        if "sft_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def sft_run(tmp_path_factory) -> dict:
    """SFT of the tiny model on 640 arithmetic gold traces (200 steps, batch 16) + held-out eval."""
    from algorithms.sft import SFTConfig, run_sft

    out = tmp_path_factory.mktemp("sft")
    cfg = SFTConfig(
        model="tiny",
        env="AgentMath-v0",
        env_kwargs={"system_prompt": SYSTEM_PROMPT},
        num_examples=640,
        steps=200,
        batch_size=16,
        lr=1e-3,
        eval_episodes=48,
        eval_max_response_tokens=128,
        output_dir=str(out),
        threads=1,
        progress=False,
        tensorboard=False,
    )
    return run_sft(cfg)
