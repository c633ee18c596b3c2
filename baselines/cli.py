"""Subcommands of `agent-envs` that live in `baselines`: evaluate, compare, quickstart, analyze, view, export."""

from __future__ import annotations

from typing import Any

from baselines import quickstart
from baselines.comparison import compare
from baselines.diagnostics import analyze, export
from baselines.diagnostics.view import server as view
from baselines.evaluation import evaluate


def add_cli(subparsers: Any) -> None:
    for module in (evaluate, compare, quickstart, analyze, view, export):
        module.add_cli(subparsers)
