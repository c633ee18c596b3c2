"""Collection rules for the doctests of the packages (`--doctest-modules`, see pyproject.toml).

The worker scripts are programs, not modules: each runs in a subprocess of its own (the sandbox
worker under `python -I`, stdlib only, to isolate user code; the symbolic worker to bound sympy's
time and memory). They hold no `>>>` examples, and importing them into the test process would
test nothing that their subprocess tests do not.

The conftest files under tests/ are already loaded by pytest as plugins; collected again as
doctest modules, two of them would be imported under the one name `conftest` (tests/ holds no
packages), which pytest refuses.
"""

collect_ignore = [
    "agent_envs/tools/sandbox/worker.py",
    "agent_envs/rewards/_symbolic_worker.py",
]
collect_ignore_glob = ["tests/conftest.py", "tests/*/conftest.py"]

# doctests that take over ~5 s (the learner's trains a few steps): `make test` runs them, `make test-fast` not
SLOW_DOCTESTS = ("algorithms.core.learner",)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.name in SLOW_DOCTESTS and type(item).__name__ == "DoctestItem":
            item.add_marker("slow")
