"""The `agent-envs` command.

    agent-envs list                      # every registered env id, one line each
    agent-envs play AgentMath-v0         # play an episode yourself in the terminal
    agent-envs serve-retriever --corpus corpus.jsonl --port 8000
    agent-envs serve-sandbox --port 8100 --workers 8   # the Python sandbox for many rollout workers
    agent-envs sft ... / train --algo grpo ... / evaluate ... / compare ...   (learner extras)

Subcommands live next to what they run: each module offers `add_cli(subparsers)`. Learner
subcommands are found only when the `algorithms` / `baselines` packages import (the `train`
extra), so `agent_envs` itself never imports learner code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# modules that may contribute subcommands; missing optional ones are skipped
_SUBCOMMAND_MODULES = (
    "agent_envs.server.retriever",
    "agent_envs.server.sandbox",
    "algorithms.cli",
    "baselines.cli",
)


def _list(args: argparse.Namespace) -> int:
    from agent_envs.envs import env_summaries

    for env_id, summary in env_summaries():
        print(f"{env_id:<34} {summary}")
    return 0


def _play(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import agent_envs  # noqa: F401  (registers the ids)

    env = gym.make(args.env_id, **dict(kv.split("=", 1) for kv in args.kwargs))
    prompt, info = env.reset(seed=args.seed, options=None if args.index is None else {"index": args.index})
    tool_env = env.unwrapped
    print(prompt)
    print(f"[task {info['task_id']}; end each action with one of {info['stop_sequences'] or ['<answer>...</answer>']}; "
          "an empty line sends the action; Ctrl-D quits]")
    while True:
        lines: list[str] = []
        try:
            while (line := input("> " if not lines else "  ")) != "":
                lines.append(line)
        except EOFError:
            print()
            return 0
        obs, reward, terminated, truncated, info = env.step("\n".join(lines))
        if obs:
            print(obs)
        if terminated or truncated:
            end = "terminated" if terminated else f"truncated ({info.get('end_reason')})"
            print(f"[{end}] reward={reward:g} pred={info.get('pred')!r} gold={tool_env.task.answers} "
                  f"format_ok={info.get('format_ok')} tool_calls={info.get('tool_calls')}")
            return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent-envs", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list registered env ids")
    p.set_defaults(func=_list)
    p = sub.add_parser("play", help="play an episode in the terminal")
    p.add_argument("env_id")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--index", type=int, default=None, help="task index (default: drawn from the seed)")
    p.add_argument("kwargs", nargs="*", help="env keyword arguments as key=value (strings)")
    p.set_defaults(func=_play)
    for name in _SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            if name.startswith("agent_envs") or (exc.name and not exc.name.startswith(name.split(".")[0])):
                # a real missing dependency inside our module deserves a message, not silence
                print(f"agent-envs: subcommands of {name} unavailable: {exc}", file=sys.stderr)
            continue
        if hasattr(module, "add_cli"):
            module.add_cli(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
