"""A third-party MCP server from PyPI in a venv of its own, for the MCP tool tests.

`mcp-server-calculator` 0.2.1 pins `mcp<2` while this project uses `mcp>=2.3`: it can only run
from its own venv, which is the point of the test. The venv is built once and cached, keyed by
version, under the repository's ignored `.cache/mcp-venvs/` (or `$AGENT_ENVS_MCP_VENVS`).

The two MCP protocol eras get a venv each too: the SDK 2.x (`MODERN_SDK`) runs the server that
speaks only 2026-07-28 (`mcp_modern_server.py`) and the new-version client of `serve-mcp`; the
last SDK 1.x (`LEGACY_SDK`), which knows only the `initialize` handshake, is the old client.

    python tests/tools/mcp_support.py      # build it ahead of the tests (CI does, after install)
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

CALCULATOR = "mcp-server-calculator==0.2.1"
ROOT = Path(__file__).resolve().parents[2]
# what pip prints when the index cannot be reached (no network, a proxy refusing, DNS down)
OFFLINE_MARKERS = ("NewConnectionError", "Network is unreachable", "Temporary failure in name resolution",
            "No matching distribution found", "Could not find a version", "ProxyError", "ConnectTimeout")


class PyPIUnreachable(RuntimeError):
    """pip could not download from the package index."""


def venv_root() -> Path:
    return Path(os.environ.get("AGENT_ENVS_MCP_VENVS") or ROOT / ".cache" / "mcp-venvs")


def server_venv(requirement: str = CALCULATOR, *, python: str | None = None,
                prepare: Callable[[Path], list[str]] | None = None) -> Path:
    """The venv with `requirement` installed, built on first use (a minute) and reused after.
    `python` makes it (default: our base interpreter), and `prepare(folder)`, run before pip, may
    set it up further and return more pip arguments (a constraint file, say)."""
    folder = venv_root() / requirement.replace("==", "-")
    if (folder / ".complete").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # built in place (a venv's scripts name its path, so it cannot be moved), under a lock, and
    # marked complete last: a half-built one is never reused
    with open(folder.parent / (folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / ".complete").is_file():  # another process built it while we waited
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run([python or _base_python(), "-m", "venv", str(folder)], check=True, capture_output=True)
        extra = prepare(folder) if prepare is not None else []
        pip = subprocess.run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", requirement, *extra],
                             capture_output=True, text=True, timeout=900)
        if pip.returncode != 0:
            output = pip.stdout + pip.stderr
            lines = [ln for ln in output.splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
            why = lines[-1] if lines else f"pip exited with {pip.returncode}"
            if any(marker in output for marker in OFFLINE_MARKERS):
                raise PyPIUnreachable(f"PyPI cannot be reached to install {requirement}: {why}")
            raise RuntimeError(f"pip install {requirement} failed: {why}")
        (folder / ".complete").write_text(requirement + "\n")
    return folder


MODERN_SDK = "mcp==2.3.0"
LEGACY_SDK = "mcp==1.30.0"
MODERN_SERVER = Path(__file__).with_name("mcp_modern_server.py")


def sdk_python(requirement: str) -> str:
    """The interpreter of a venv holding only the MCP SDK `requirement` (and its dependencies)."""
    return str(server_venv(requirement) / "bin" / "python")


def modern_server_command() -> list[str]:
    """The command line that starts the 2026-07-28-only server over stdio, from the SDK 2.x venv."""
    return [sdk_python(MODERN_SDK), str(MODERN_SERVER)]


def calculator_command() -> list[str]:
    """The command line that starts the calculator server over stdio."""
    return [str(server_venv(CALCULATOR) / "bin" / "mcp-server-calculator")]


def _base_python() -> str:
    """The interpreter our venv was made from: the server's venv must not see our packages."""
    return getattr(sys, "_base_executable", None) or sys.executable


if __name__ == "__main__":
    print(calculator_command()[0])
    print(sdk_python(MODERN_SDK))
    print(sdk_python(LEGACY_SDK))
