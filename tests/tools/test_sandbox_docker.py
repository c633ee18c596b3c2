"""The Docker backend against a real engine: its warm pool, and its isolation attacked by real code.

Needs a running Docker engine and a local Python image (`.ci/system` starts `dockerd` and builds
`agent-envs-sandbox:bookworm` with debootstrap when run as root; nothing is pulled). Without them
every test here skips and says which is missing. Each attack's effect is checked from outside the
container where it can be: the host's file system, a real server on the host, the engine's list
of containers.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid

import pytest

from agent_envs.tools import PythonTool
from agent_envs.tools.sandbox import SandboxConfig
from agent_envs.tools.sandbox.docker import CONTAINER_PREFIX, DockerSandbox

IMAGE = os.environ.get("AGENT_ENVS_SANDBOX_IMAGE", "agent-envs-sandbox:bookworm")


def _missing() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "no `docker` command here"
    if subprocess.run([docker, "version"], capture_output=True, timeout=30).returncode != 0:
        return "no Docker engine reachable (start dockerd)"
    if subprocess.run([docker, "image", "inspect", IMAGE], capture_output=True, timeout=30).returncode != 0:
        return f"image {IMAGE} missing: build it as `.ci/system` does (debootstrap + docker import)"
    return None


needs_engine = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


def test_container_options_carry_the_limits():
    opts = DockerSandbox(SandboxConfig(memory_mb=512, nproc=32, docker_cpus=0.5, fsize_mb=8)).container_options()
    pairs = dict(zip(opts, opts[1:], strict=False))  # each flag with the word after it
    assert pairs["--network"] == "none" and "--read-only" in opts and pairs["--cap-drop"] == "ALL"
    assert (pairs["--memory"], pairs["--memory-swap"], pairs["--pids-limit"], pairs["--cpus"]) == (
        "512m", "512m", "32", "0.5")
    assert pairs["--user"] == "65534:65534" and pairs["--security-opt"] == "no-new-privileges"
    assert pairs["--tmpfs"] == "/tmp:size=8m,mode=1777"
    env = [value for flag, value in zip(opts, opts[1:], strict=False) if flag == "--env"]
    assert env and not any(v.startswith(("HOME=/root", "DOCKER", "PYTHONPATH")) for v in env), env


def test_no_engine_is_a_clear_observation(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # an engine nobody runs
    res = PythonTool(backend="docker", timeout_s=5).run("print(1)")
    assert not res.ok and res.error == "sandbox"
    assert "no Docker engine reachable" in res.text and "backend='local'" in res.text


def _containers() -> set[str]:
    out = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
    return {n for n in out.split() if n.startswith(CONTAINER_PREFIX)}


@pytest.fixture(scope="module")
def tool():
    tool = PythonTool(backend="docker", docker_image=IMAGE, timeout_s=3.0, pool_size=1, memory_mb=256,
                      fsize_mb=8, nproc=32)
    assert tool.run("1").text == "1"
    yield tool
    tool.close()


@needs_engine
def test_code_runs_as_an_unprivileged_user_in_a_warm_container(tool):
    res = tool.run("import os\nx = 6*7\nprint(os.getuid(), os.getgid())\nx")
    assert res.ok and res.text.split() == ["65534", "65534", "42"]
    before = _containers()
    assert len(before) >= 1  # the warm container stays up between calls
    for _ in range(3):
        tool.run("1")
    assert _containers() == before, "calls must reuse the warm container, not start new ones"


@needs_engine
def test_network_is_blocked(tool):
    """The host listens on every interface; the container must reach none of them."""
    server = socket.create_server(("0.0.0.0", 0))
    port = server.getsockname()[1]
    accepted: list[int] = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0].fileno()), daemon=True).start()
    host_ips = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split() or ["172.17.0.1"]
    targets = [*host_ips, "172.17.0.1", "127.0.0.1"]
    code = (f"import socket\nfor ip in {targets!r}:\n    try:\n        socket.create_connection((ip, {port}), timeout=1)\n"
            "        print('CONNECTED', ip)\n    except OSError as e:\n        print('blocked', type(e).__name__)")
    res = tool.run(code)
    server.close()
    assert "CONNECTED" not in res.text and "blocked" in res.text
    assert accepted == []


@needs_engine
def test_root_file_system_is_read_only(tool, tmp_path):
    res = tool.run("open('/etc/pwned', 'w').write('x')")
    assert "Read-only file system" in res.text
    assert tool.run("import os\nos.path.exists('/etc/pwned')").text == "False"


@needs_engine
def test_nothing_passes_from_one_call_to_the_next(tool):
    """A call leaves a background process and files in every writable place; the next sees none."""
    marker = uuid.uuid4().hex
    tool.run(
        "import subprocess, os\n"
        f"subprocess.Popen(['python', '-c', 'import time; time.sleep(60)  # {marker}'], start_new_session=True)\n"
        f"open('/tmp/{marker}', 'w').write('x'); open('/dev/shm/{marker}', 'w').write('x')\n"
        f"open('{marker}', 'w').write('x')"
    )
    res = tool.run(
        "import os\n"
        "def cmdline(p):\n"  # a process may end between the listing and the read
        "    try:\n        return open(f'/proc/{p}/cmdline', 'rb').read()\n"
        "    except OSError:\n        return b''\n"
        "procs = [cmdline(p) for p in os.listdir('/proc') if p.isdigit()]\n"
        f"print(sum({marker!r}.encode() in c for c in procs), os.listdir('/tmp'), os.listdir('/dev/shm'))"
    )
    count, rest = res.text.split(" ", 1)
    assert count == "0", "the background process survived into the next call"
    assert marker not in rest, res.text


@needs_engine
def test_deadline_kills_the_call_and_the_pool_carries_on(tool):
    res = tool.run("while True: pass")
    assert res.error == "timeout"
    assert tool.run("2 + 2").text == "4"


@needs_engine
def test_fork_and_memory_bombs_are_contained(tool):
    fork = tool.run("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
                    "            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
                    "except OSError as e:\n    print('stopped after', n)")
    assert fork.text.startswith("stopped after") and int(fork.text.split()[-1]) < 32, fork.text
    mem = tool.run("x = bytearray(1 << 30)")
    assert not mem.ok or "MemoryError" in mem.text
    # the sleeping children were killed after the call: the next one has its whole pid budget back
    again = tool.run("import os\nfor _ in range(20):\n    if os.fork() == 0:\n        os._exit(0)\n    os.wait()\n"
                     "print('forked 20')")
    assert again.text == "forked 20", again.text


@needs_engine
def test_a_container_killed_mid_call_is_replaced():
    sandbox = DockerSandbox(SandboxConfig(docker_image=IMAGE, timeout_s=20, pool_size=1))
    try:
        assert sandbox.execute("print(1)").stdout == "1\n"
        (name,) = _containers() & sandbox._names
        killer = threading.Timer(1.0, lambda: subprocess.run(["docker", "kill", name], capture_output=True))
        killer.start()
        res = sandbox.execute("import time\ntime.sleep(10)")
        killer.join()
        assert res.exit_code is None and "sandbox worker failed" in (res.error or ""), res
        assert sandbox.execute("print(2)").stdout == "2\n"
    finally:
        sandbox.close()
    time.sleep(0.5)
    assert not (_containers() & {name}), "closing the sandbox must leave no container behind"


@needs_engine
def test_a_missing_image_is_a_clear_error():
    res = PythonTool(backend="docker", docker_image="agent-envs-no-such-image:0", timeout_s=5).run("1")
    assert not res.ok and res.error == "sandbox"
    assert "agent-envs-no-such-image" in res.text
