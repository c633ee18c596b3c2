"""docs/interop.md "Training any agent through the gateway" runs as written: its `gateway` command
(on a free port) and its Python example, with the printed values the comments state."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.servers import REPO, free_port

SECTION = "## Training any agent through the gateway"


def _blocks() -> list[tuple[str, str]]:
    text = (REPO / "docs" / "interop.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```(\w+)\n(.*?)```", text[start:] if end < 0 else text[start:end], flags=re.S)


def test_the_documented_command_and_code_run(tmp_path):
    blocks = _blocks()
    [serve] = [code.strip() for lang, code in blocks if lang == "bash"]
    [program] = [code for lang, code in blocks if lang == "python"]
    port = free_port()
    argv = shlex.split(serve.replace("--port 8200", f"--port {port}"))
    assert argv[:2] == ["agent-envs", "gateway"]
    log = tmp_path / "gateway.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "agent_envs.cli", *argv[1:]], stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"gateway exited:\n{log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.3)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(program.replace(":8200", f":{port}"), "docs/interop.md", "exec"), {})
        expected = [m for m in re.findall(r"print\(.*\)\s+# (.*)", program)]
        assert printed.getvalue().strip().splitlines() == expected
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
