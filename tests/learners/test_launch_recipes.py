"""The multi-GPU recipes (configs/launch/*.sh, configs/accelerate/*.yaml) parse and name real things.

No GPU here: each script runs with DRY_RUN=1, which prints its commands instead of running them.
Every printed `accelerate launch` must parse with Accelerate's own launch parser and name an
accelerate config that exists; its `train` part must build a learner config from the preset
plus the script's overrides (unknown keys, bad types and missing presets fail there); every
`agent-envs serve-*` command must parse with the CLI's parser.
"""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest
import yaml
from learner_support import REPO

from agent_envs.base.config import build_config
from agent_envs.cli import build_parser
from algorithms.cli import learner_class

LAUNCH = REPO / "configs" / "launch"
# each script with the environment each of its roles needs (addresses are placeholders)
CASES = {
    "colocated_1x8.sh": [{}],
    "colocated_2x8.sh": [{"MASTER_ADDR": "10.0.0.1", "MACHINE_RANK": "0"},
                         {"MASTER_ADDR": "10.0.0.1", "MACHINE_RANK": "1",
                          "ACCEL": "configs/accelerate/deepspeed_zero3_2x8.yaml"}],
    "server_1x8.sh": [{}],
    "server_2x8.sh": [{"ROLE": "server", "SYNC_DIR": "/shared/sync"},
                      {"ROLE": "learner", "SYNC_DIR": "/shared/sync", "ROLLOUT_ADDR": "10.0.0.2"}],
    "retriever.sh": [{"ROLE": "server", "CORPUS": "corpus.jsonl"},
                     {"ROLE": "learner", "RETRIEVER_ADDR": "10.0.0.3"}],
}  # fmt: skip


def _commands(script: str, env: dict[str, str]) -> list[list[str]]:
    proc = subprocess.run(["bash", str(LAUNCH / script)], env={**os.environ, "DRY_RUN": "1", **env},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines() if line.strip()]


def test_every_script_is_covered_and_valid_bash():
    scripts = {p.name for p in LAUNCH.glob("*.sh")} - {"common.sh"}
    assert scripts == set(CASES)
    for path in LAUNCH.glob("*.sh"):
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "accelerate").glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_configs_load(path):
    cfg = yaml.safe_load(path.read_text())
    assert cfg["distributed_type"] in {"MULTI_GPU", "FSDP", "DEEPSPEED"}
    assert cfg["num_processes"] % cfg["num_machines"] == 0, "ranks split evenly over the nodes"
    if cfg["distributed_type"] == "DEEPSPEED" and cfg["deepspeed_config"]["zero_stage"] == 3:
        # the weight sync gathers the 16-bit weights every step
        assert cfg["deepspeed_config"]["zero3_save_16bit_model"] is True


@pytest.mark.parametrize("script", sorted(CASES))
def test_script_commands_name_real_presets_keys_and_flags(script):
    from accelerate.commands.launch import launch_command_parser

    seen = 0
    for env in CASES[script]:
        for cmd in _commands(script, env):
            if cmd[:2] == ["accelerate", "launch"]:
                args = launch_command_parser().parse_args(cmd[2:])
                accel = yaml.safe_load((REPO / args.config_file).read_text())
                assert args.module and args.training_script == "agent_envs.cli"
                if accel["num_machines"] > 1:
                    assert args.machine_rank == int(env["MACHINE_RANK"]) and args.main_process_ip
                train = build_parser().parse_args(args.training_script_args)
                cfg = build_config(learner_class(train.algo).config_class, train.config, train.overrides)
                assert cfg.engine in {"vllm", "vllm-server"}
                if cfg.engine == "vllm-server":
                    assert cfg.engine_kwargs["base_url"].endswith("/v1") and cfg.engine_kwargs["sync_dir"]
                seen += 1
            else:
                assert cmd[0] == "agent-envs", f"{script}: unexpected command {cmd}"
                served = build_parser().parse_args(cmd[1:])
                if served.command == "serve-rollout" and "ROLE" in env:  # another node's server
                    assert served.host == "0.0.0.0"
                seen += 1
    assert seen >= len(CASES[script])
