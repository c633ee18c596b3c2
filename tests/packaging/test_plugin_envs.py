"""A benchmark registered in a user's own installed package is found by every command.

A small package is written as docs/adding-a-benchmark.md shows it and installed, not editable,
into a fresh venv that sees this environment's packages (a `.pth` line adds our site-packages, so
nothing is downloaded): `mybench_envs` names itself in the `agent_envs.envs` entry-point group;
`mybench_extra` does not, and is reached with `--import mybench_extra` or a `mybench_extra:ID` id.
`list`, `play` and `evaluate` then run in that venv's python, from an empty folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "mybench"
version = "0.1.0"

[project.entry-points."agent_envs.envs"]
mybench = "mybench_envs"

[tool.setuptools]
packages = ["mybench_envs", "mybench_extra"]

[tool.setuptools.package-data]
mybench_envs = ["*.jsonl"]
"""

MYBENCH = '''"""My sums, registered on import."""
from pathlib import Path

import agent_envs
from agent_envs.data import BenchmarkSpec

agent_envs.register_benchmark(BenchmarkSpec(
    name="mysums", family="math", reward="math", env_id="AgentMath-MySums-v0",
    default_file=str(Path(__file__).parent / "sums.jsonl"), description="my sums", metric="accuracy"))
'''

EXTRA = '''"""An id registered with gymnasium directly, found only when asked for."""
from pathlib import Path

import gymnasium as gym

gym.register(id="MyExtra-v0", entry_point="agent_envs.envs.math:make_math_env",
             kwargs={"data_files": str(Path(__file__).parent.parent / "mybench_envs" / "sums.jsonl")})
'''


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("plugin")
    pkg = tmp / "mybench"
    (pkg / "mybench_envs").mkdir(parents=True)
    (pkg / "mybench_extra").mkdir()
    (pkg / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "mybench_envs" / "__init__.py").write_text(MYBENCH)
    (pkg / "mybench_extra" / "__init__.py").write_text(EXTRA)
    rows = [{"id": f"sum-{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(1, 5)]
    (pkg / "mybench_envs" / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    # this environment's packages (ours included) behind the venv's own, .pth files processed
    (Path(own) / "_outer_env.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", str(pkg)], check=True, capture_output=True, timeout=300)
    assert (Path(own) / "mybench_envs" / "sums.jsonl").is_file()  # a copy, not a link to the source
    return python


def _run(python: Path, cwd: Path, *argv: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([str(python), "-m", "agent_envs.cli", *argv], capture_output=True, text=True,
                          input=stdin, cwd=cwd, env=env, timeout=300)


@pytest.mark.slow  # installs a package (a few seconds), then evaluates with the tiny model
def test_an_installed_package_s_envs_are_found_by_list_play_and_evaluate(venv_python, tmp_path):
    listed = _run(venv_python, tmp_path, "list")
    assert listed.returncode == 0, listed.stderr
    assert "AgentMath-MySums-v0" in listed.stdout and "my sums" in listed.stdout
    assert "MyExtra-v0" not in listed.stdout  # not an entry point: only when imported

    gold = "<think>4</think> <answer> \\boxed{4} </answer>\n\n"
    played = _run(venv_python, tmp_path, "play", "AgentMath-MySums-v0", "--index", "1", stdin=gold)
    assert played.returncode == 0, played.stderr
    assert "What is 2 + 2?" in played.stdout and "reward=1" in played.stdout

    for argv in (["--import", "mybench_extra", "play", "MyExtra-v0"], ["play", "--import", "mybench_extra", "MyExtra-v0"],
                 ["play", "mybench_extra:MyExtra-v0"]):
        played = _run(venv_python, tmp_path, *argv, "--index", "1", stdin=gold)
        assert played.returncode == 0, (argv, played.stderr)
        assert "What is 2 + 2?" in played.stdout and "reward=1" in played.stdout, (argv, played.stdout)
    imported = _run(venv_python, tmp_path, "--import", "mybench_extra", "list")
    assert "MyExtra-v0" in imported.stdout and "registered by mybench_extra" in imported.stdout
    # what --import sets for the processes a command starts
    env = {**os.environ, "PYTHONPATH": str(REPO), "AGENT_ENVS_IMPORT": "mybench_extra"}
    child = subprocess.run([str(venv_python), "-c", "from agent_envs.envs import check_env_id; "
                            "print(check_env_id('MyExtra-v0'))"], capture_output=True, text=True, env=env, timeout=120)
    assert child.stdout.strip() == "MyExtra-v0", child.stderr

    out = tmp_path / "eval"
    evaluated = _run(venv_python, tmp_path, "evaluate", "--env", "AgentMath-MySums-v0", "--model", "tiny",
                     "--engine", "hf", "--limit", "2", "--max-response-tokens", "16", "--out", str(out))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["env"] == "AgentMath-MySums-v0"
    assert {json.loads(line)["task_id"] for line in (out / "samples.jsonl").read_text().splitlines()} <= {
        f"sum-{i}" for i in range(1, 5)}


def test_a_broken_entry_point_is_one_line_and_the_package_s_own_ids_still_work(tmp_path, monkeypatch, capsys):
    """Someone else's broken plugin does not take the package's own ids down with it."""
    import importlib.metadata

    from agent_envs import envs

    broken = importlib.metadata.EntryPoint(name="broken", value="no_such_module_here", group=envs.ENTRY_POINT_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [broken] if group == envs.ENTRY_POINT_GROUP else [])
    monkeypatch.setattr(envs, "_plugins_loaded", False)
    assert envs.check_env_id("AgentMath-v0") == "AgentMath-v0"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "entry point 'broken' = no_such_module_here" in err[0], err
    assert "No module named 'no_such_module_here'" in err[0]
