"""The `agent-envs` command is assembled bottom-up: `agent_envs/cli.py` imports its own package's
subcommands and finds those of `algorithms` and `baselines` through the `agent_envs.commands`
entry points, so no module of `agent_envs` imports a package above it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE = re.compile(r"(algorithms|baselines)(\.\w+)+(:\w+)?")


def test_no_module_of_the_bottom_package_names_one_above_it_in_an_import():
    """Neither an import statement nor a module's name as a string (for importlib): the drawing of
    the import graph sees the first, and would miss the second."""
    above = ("algorithms", "baselines")
    found = []
    for path in (REPO / "agent_envs").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE.fullmatch(node.value):
                names = [node.value]  # a module's name as data, for importlib
            found += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names if n.split(".")[0] in above]
    assert found == []


def test_every_subcommand_is_registered_through_the_entry_points():
    from agent_envs.cli import COMMANDS_GROUP, _command_entry_points, build_parser

    targets = {ep.value for ep in _command_entry_points()}
    assert targets == {"algorithms.cli:add_cli", "algorithms.gateway.server:add_cli", "baselines.cli:add_cli"}, \
        f"reinstall the package (pip install -e .) for the {COMMANDS_GROUP} entry points of pyproject.toml"
    commands = build_parser()._subparsers._group_actions[0].choices
    for name in ("list", "play", "data", "serve-env", "train", "sft", "serve-rollout", "gateway", "evaluate",
                 "compare", "quickstart", "analyze", "view", "export"):
        assert name in commands, name
