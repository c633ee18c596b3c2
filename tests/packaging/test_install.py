"""A plain (non-editable) install runs the commands and finds its presets, far from any checkout.

The package is built from a copy of the sources (so the build leaves nothing in the checkout) and
installed with `pip install --no-deps --target`; the dependencies come from this environment's
site-packages, which the subprocesses keep. Everything then runs from an empty folder outside
the repository, with the installed copy first on the path, so a preset found through the
checkout's `configs/` would be a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "agent_envs", "algorithms", "baselines", "configs")

CHECK = """
import json
from pathlib import Path
import agent_envs, algorithms
from agent_envs.base.config import build_config, load_preset
from algorithms.base.presets import find_preset, presets_dir
from algorithms.cli import ALGORITHMS, learner_class
from algorithms.sft import SFTConfig
from baselines import quickstart
from baselines.comparison import compare

built = {}
for algo in ALGORITHMS:  # what quickstart and compare build first, by a bare name and by the default
    built[algo] = build_config(learner_class(algo).config_class, find_preset(f"{algo}_tiny.yaml")).env
    default = find_preset(compare.CompareConfig().config.format(algo=algo))
    assert default == presets_dir() / f"{algo}_tiny.yaml", default
built["sft"] = build_config(SFTConfig, quickstart.CONFIGS / "sft_tiny.yaml").env
print(json.dumps({
    "package": str(Path(agent_envs.__file__).parent.parent), "presets": str(presets_dir()),
    "quickstart": str(quickstart.CONFIGS), "built": built,
    "accelerate": sorted(p.name for p in (presets_dir() / "accelerate").glob("*.yaml")),
    "launch": sorted(p.name for p in (presets_dir() / "launch").glob("*.sh")),
}))
"""


@pytest.mark.slow
def test_a_plain_install_runs_and_finds_its_presets(tmp_path):
    src, site, work = tmp_path / "src", tmp_path / "site", tmp_path / "work"
    src.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    work.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(src)], check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}

    def run(*args: str) -> str:
        out = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=work, env=env)
        assert out.returncode == 0, (args, out.stderr[-3000:])
        return out.stdout

    agent_envs = str(site / "bin" / "agent-envs")
    assert run(agent_envs, "--version").strip() == "agent-envs 0.1.0"
    assert run(agent_envs, "quickstart", "--help").startswith("usage: agent-envs quickstart")
    compare_help = run(agent_envs, "compare", "--help")
    # the default preset by its name, resolved where the package is: no path of the building machine
    assert "'{algo}_tiny.yaml'" in compare_help and str(site) not in compare_help, compare_help

    report = json.loads(run(sys.executable, "-c", CHECK).strip().splitlines()[-1])
    assert report["package"] == str(site)  # the installed copy, not the checkout
    assert report["presets"] == report["quickstart"] == str(site / "algorithms" / "presets")
    assert report["built"] == {"grpo": "AgentMath-v0", "dapo": "AgentMath-v0", "arpo": "AgentMath-v0",
                               "aepo": "AgentMath-v0", "sft": "AgentMath-v0"}, report["built"]
    assert "ddp.yaml" in report["accelerate"] and "common.sh" in report["launch"]
