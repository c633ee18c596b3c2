"""Collection rules for the doctests of the packages (`--doctest-modules`, see pyproject.toml).

The worker scripts are programs, not modules: each runs in a subprocess of its own (the sandbox
worker under `python -I`, stdlib only, to isolate user code; the symbolic worker to bound sympy's
time and memory). They hold no `>>>` examples, and importing them into the test process would
test nothing that their subprocess tests do not.

The conftest files under tests/ are already loaded by pytest as plugins; collected again as
doctest modules, two of them would be imported under the one name `conftest` (tests/ holds no
packages), which pytest refuses.
"""

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent

collect_ignore = [
    "agent_envs/tools/sandbox/worker.py",
    "agent_envs/rewards/_symbolic_worker.py",
    "tests/interop/trl_grpo.py",  # a script for TRL's own venv: importing it runs the training
]
collect_ignore_glob = [
    "tests/conftest.py", "tests/*/conftest.py",
    "tests/gateway/agents/*.py",  # agent programs for their own venvs (openai-agents, smolagents)
]

# doctests that take over ~5 s (the learner's trains a few steps): `make test` runs them, `make test-fast` not
SLOW_DOCTESTS = ("algorithms.core.learner",)


# -- two workers (`make test`: pytest-xdist, `-n 2 --dist loadfile`) -------------------------------
# Each worker builds its own session fixtures, so the files on a costly one (an SFT run, a vLLM
# engine, the converted SmolLM2) form one group, run by one worker; every other file is a group
# of its own, as with plain loadfile, so its module fixtures are built once too. (xdist's
# `loadgroup` cannot do this: the group marks it reads are lost on pytest 9's node ids.)
# a costly session fixture -> the folder whose conftest.py defines it
SHARED_FIXTURES = {"sft_run": "tests/learners", "vllm_engine": "tests/rollout", "smollm2_path": "tests/models"}

# Files whose fork bombs fill the sandbox uid's process budget (RLIMIT_NPROC 32 as uid 65534, and
# the limit counts every process of the uid on the machine): beside each other, one's bomb makes
# the other's sandboxes fail to start (EAGAIN), so they form one group too.
SANDBOX_UID_FILES = ("tests/tools/test_sandbox_isolation.py", "tests/tools/test_session_isolation.py")

# The longest groups, longest first (from `--durations`). Groups go out in collection order, one
# more whenever a worker is nearly done, so a long group collected late would run alone at the end
# while the other worker idles.
LONG_FIRST = ("tests/learners/test_learning.py", "sft_run", "vllm_engine", "tests/arpo/test_tree_model.py",
              "smollm2_path")


@functools.cache
def _group(path: str) -> str:
    """A test file's group: the shared fixture that the file names, else the file itself."""
    if path in SANDBOX_UID_FILES:
        return "sandbox-uid"
    for fixture, folder in SHARED_FIXTURES.items():
        if path.startswith(folder + "/") and re.search(rf"\b{fixture}\b", (ROOT / path).read_text("utf-8")):
            return fixture
    return path


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(_file(nodeid))

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.name in SLOW_DOCTESTS and type(item).__name__ == "DoctestItem":
            item.add_marker("slow")
    if hasattr(config, "workerinput"):  # an xdist worker: the order it collects is the order work goes out
        rank = {group: i for i, group in enumerate(LONG_FIRST)}
        items.sort(key=lambda item: rank.get(_group(_file(item.nodeid)), len(rank)))
