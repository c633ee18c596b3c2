"""docs/interop.md "Environments over HTTP" runs as written: its `serve-env` command (on a free
port) and its Python examples, in order, with the printed values the comments state."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import sys

from test_serve_env_cli import _wait_healthy

from tests.servers import REPO, free_port

SECTION = "## Environments over HTTP"


def _blocks() -> list[tuple[str, str]]:
    text = (REPO / "docs" / "interop.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:] if end < 0 else text[start:end]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


def test_the_documented_commands_and_code_run(tmp_path):
    blocks = _blocks()
    [serve] = [code.strip() for lang, code in blocks if lang == "bash"]
    programs = [code for lang, code in blocks if lang == "python"]
    assert len(programs) == 2
    port = free_port()
    argv = shlex.split(serve.replace("--port 8000", f"--port {port}"))
    assert argv[:2] == ["agent-envs", "serve-env"]
    log = tmp_path / "serve-env.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "agent_envs.cli", *argv[1:], "--out", str(tmp_path)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}", log)
        assert (tmp_path / "openenv.yaml").is_file()
        for code in programs:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(code.replace(":8000", f":{port}"), "docs/interop.md", "exec"), {})
            # each example ends with a print whose expected output is its comment
            expected = re.findall(r"print\(.*\)\s+# (.*)", code)[-1]
            assert printed.getvalue().strip().splitlines()[-1] == expected
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
