"""The README's and docs/quickstart.md's shell blocks work when pasted in order into a fresh shell.

Every ```bash block of the two pages is read in page order and run, command by command, in one
fresh `bash` (no virtual environment on its PATH) in a clean clone of the repository, as a new
user would paste them: the docs' own `source .venv/bin/activate` is what puts `agent-envs` on the
PATH. Commands run as written, plus the smoke sizes below (later flags and key=value settings
win). What is not run is listed with the reason, and printed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/quickstart.md")

# the docs' smoke run of the quickstart (docs/quickstart.md, "Options")
QUICKSTART_SMOKE = "--sft-steps 40 --rl-steps 4 --eval-tasks 16"



def _small_comparison(cmd: str) -> str:
    """One seed, 2 steps, 4 evaluation tasks; flags go before the key=value settings (argparse)."""
    cmd = re.sub(r"--seeds \S+", "--seeds 0", re.sub(r"\btotal_steps=\d+", "total_steps=2", cmd))
    return cmd.replace("agent-envs compare", "agent-envs compare --eval-tasks 4 --eval-samples 1", 1)


# (pattern of a command, what it becomes): tiny sizes of the same commands
SMOKE: list[tuple[str, Callable[[str], str]]] = [
    # the set-up itself: this test runs in the installed .venv; the quickstart's runs/quickstart
    # (whose SFT model later commands use) comes from the smoke run instead
    (r"^make quickstart\b", lambda _: f".venv/bin/agent-envs quickstart {QUICKSTART_SMOKE} --out runs/quickstart"),
    (r"^agent-envs quickstart\b", lambda cmd: f"{cmd} {QUICKSTART_SMOKE}"),
    (r"^agent-envs compare --algos", _small_comparison),
    # the vLLM CPU engine takes about a minute to start: tests/rollout cover it
    (r"^agent-envs evaluate\b(?!.*--engine)", lambda cmd: f"{cmd} --limit 4 --engine hf"),
    (r"^agent-envs evaluate\b", lambda cmd: f"{cmd} --limit 4"),
]

# (pattern, why it is not run)
NOT_RUN: list[tuple[str, str]] = [
    (r"^make (test|test-fast|stress|install)\b", "the test suite or the install itself"),
    (r"\.\.\.", "`...` stands for the flags of the command above it"),
    (r"^agent-envs view\b", "serves the browser view until stopped (tests/diagnostics/test_view_server.py)"),
    (r"--engine vllm\b|engine=vllm\b|\bgpu\b", "needs a GPU"),
]


def shell_commands(page: str) -> list[str]:
    """The commands of a page's ```bash blocks, in order; continuation lines joined."""
    text = (REPO / page).read_text(encoding="utf-8")
    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        pending = ""
        for line in block.splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            command = (pending + line).strip()
            pending = ""
            if command and not command.startswith("#"):
                out.append(command)
    return out


def plan(commands: list[str]) -> tuple[list[str], list[str]]:
    """(the commands to run, as run; "command: reason" of each one left out)."""
    run, left_out, seen = [], [], set()
    for command in commands:
        bare = re.sub(r"\s+#.*$", "", command).strip()  # the comment after a command
        why = next((reason for pattern, reason in NOT_RUN if re.search(pattern, bare)), None)
        if bare.startswith("make ") and bare in seen:
            why = "the same set-up, run above already (the second page repeats it)"
        seen.add(bare)
        if why is not None:
            left_out.append(f"{bare}: {why}")
            continue
        for pattern, smoke in SMOKE:
            if re.search(pattern, bare):
                bare = smoke(bare)
                break
        run.append(bare)
    return run, left_out


def test_the_plan_reads_the_pages() -> None:
    """What the slow test runs: the activation first, every later `agent-envs` command after it."""
    commands = [c for page in PAGES for c in shell_commands(page)]
    run, left_out = plan(commands)
    activate = run.index("source .venv/bin/activate")
    assert run[0].startswith(".venv/bin/agent-envs quickstart") and activate == 1
    assert all(c.startswith(("agent-envs", "source .venv/bin/activate")) for c in run[1:]), run
    assert any(c.startswith("agent-envs compare") and "--algos" in c for c in run)
    assert any(c.startswith("make test-fast") for c in left_out)


@pytest.mark.slow
def test_the_pages_commands_work_pasted_into_a_fresh_shell(tmp_path: Path) -> None:
    run, left_out = plan([c for page in PAGES for c in shell_commands(page)])
    print("not run:\n  " + "\n  ".join(left_out))
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{REPO}", str(clone)], check=True, timeout=120)
    (clone / ".venv").symlink_to(REPO / ".venv")  # what `make install` made
    venv_bin = str(REPO / ".venv" / "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != Path(venv_bin))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"PATH": path, "OMP_NUM_THREADS": "1"}
    # one shell for all, as pasted; each command echoed first, so a failure names its command
    script = ["set -euo pipefail", "! command -v agent-envs  # a fresh shell: nothing on the PATH yet"]
    for command in run:
        script += [f"echo {shlex.quote('$ ' + command)}", command]
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-c", "\n".join(script)], cwd=clone, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1500)
    tail = proc.stdout[-6000:]
    last = [line for line in proc.stdout.splitlines() if line.startswith("$ ")]
    assert proc.returncode == 0, f"failed at {last[-1] if last else 'the start'}:\n{tail}"
    assert len(last) == len(run)
    assert (clone / "runs" / "compare" / "grpo-0" / "final_model").is_dir()
