"""Helpers shared by the sandbox tests: a real `agent-envs serve-sandbox` process, and process trees.

The service runs as its own process, started through the package CLI exactly as an operator would,
on a free port it prints when it listens.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from agent_envs.tools import PythonTool

REPO = Path(__file__).resolve().parents[2]

# RLIMIT_NPROC counts every process of a uid on the machine, and the test workers run sandboxes side
# by side: as root, a suite that checks process budgets runs its sandboxes as a uid of its own, so a
# fork bomb in another worker's sandbox (as uid 65534) cannot eat its budget, nor its bomb theirs.
PRIVATE_UID = 60000 + os.getpid() % 5000 if os.geteuid() == 0 else None
PRIVATE = {"uid": PRIVATE_UID, "gid": PRIVATE_UID} if PRIVATE_UID is not None else {}


@contextlib.contextmanager
def sandbox_service(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen, str]]:
    """Run `agent-envs serve-sandbox --port 0 ARGS`; yields (process, base URL); stops it gracefully."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_envs.cli", "serve-sandbox", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment,
        cwd=REPO,
    )
    lines = []
    try:
        deadline = time.monotonic() + 120
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if match := re.search(r"listening on (http://[\d.:]+)/execute", line):
                url = match.group(1)
        assert url, f"serve-sandbox did not start: {''.join(lines)}"
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()


def children_by_parent() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    tree, out, todo = tree or children_by_parent(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def worker_pids(tool: PythonTool) -> list[int]:
    """The idle workers behind `tool`, in this process or in the service it calls; for a local
    session tool, the workers holding its sessions."""
    sandbox, _ = tool._ensure_started()
    if tool.backend == "service":
        return sandbox.health()["worker_pids"]
    return sandbox.sessions.worker_pids() if tool.session else sandbox.worker_pids()
