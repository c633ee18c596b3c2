"""The local sandbox's isolation guarantees, each attacked by real code in real sandbox processes.

Every test states the attack and checks its effect from OUTSIDE the sandbox (the host file system,
a real server the test runs, the process table), so it would fail if the guarantee were missing.
The suite runs as the current user (root in CI: privileges are dropped to a uid of the suite's own,
see `sandbox_support.PRIVATE`), once with
the in-process pool and once through the sandbox service (`agent-envs serve-sandbox`, a real
process on 127.0.0.1), and again, through a small driver, as an unprivileged user (user namespaces
instead of setuid).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from sandbox_support import (
    PRIVATE,
    PRIVATE_UID,
    children_by_parent,
    descendants,
    sandbox_service,
    worker_pids,
)

from agent_envs.base.messages import MESSAGES
from agent_envs.tools import PythonTool
from agent_envs.tools.sandbox import local, worker

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 1.5


SECRET = {"AGENT_ENVS_FAKE_SECRET": "s3cr3t-value"}  # in the environment of whoever owns the workers
LIMITS = {"timeout_s": TIMEOUT, "preamble": ("math",), "memory_mb": 1024, "fsize_mb": 8, "nproc": 32, **PRIVATE}


@pytest.fixture(scope="module", params=["local", "service"])
def tool(request):
    with pytest.MonkeyPatch.context() as mp:
        for key, value in SECRET.items():
            mp.setenv(key, value)
        if request.param == "local":
            tool = PythonTool(pool_size=1, **LIMITS)
            holder = os.getpid()
            service = contextlib.nullcontext((None, None))
        else:
            service = sandbox_service(
                *("--workers", "1", "--timeout", str(TIMEOUT), "--preamble", "math"),
                *("--memory-mb", "1024", "--fsize-mb", "8", "--nproc", "32"),
                *(("--uid", str(PRIVATE_UID)) if PRIVATE_UID is not None else ()),
            )
        with service as (proc, url):
            if url is not None:
                tool = PythonTool(timeout_s=TIMEOUT, backend="service", service_url=url, pool_size=1)
                holder = proc.pid
            tool.run("1")
            assert tool.isolation["net"] and tool.isolation["mount"] and tool.isolation["pid"], tool.isolation
            tool.holder_pid = holder  # the process that owns the workers (the test, or the service)
            yield tool
            tool.close()


@pytest.fixture()
def tcp_server():
    """A real listening server on 127.0.0.1 that the test process itself can reach."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[str] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append("x")
            conn.sendall(b"hello")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = server.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port), timeout=2) as control:
        assert control.recv(5) == b"hello"  # the server works from outside the sandbox
    yield port, accepted
    server.close()


def _is_idle_prepared_child(pid: int, tree: dict[int, list[int]]) -> bool:
    """A child forked ahead of a request: alone, and pid 1 of its own pid namespace."""
    if descendants(pid, tree):
        return False
    try:
        nspid = Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].split("\n")[0]
    except (OSError, IndexError):  # gone (or a zombie) since the scan: the caller looks again
        return False
    return nspid.split()[-1:] == ["1"]


def _leftovers(pid: int) -> list[int]:
    """Processes under worker `pid` beyond its serving init and the children prepared for the
    next calls."""
    tree = children_by_parent()  # one scan: the worker forks the next call's children at any time
    (init, *rest) = descendants(pid, tree)
    prepared = tree.get(init, [])
    if len(prepared) <= worker.PREPARED_CHILDREN and all(_is_idle_prepared_child(p, tree) for p in prepared):
        for child in prepared:
            rest.remove(child)
    return rest


def assert_only_workers_left(tool: PythonTool) -> None:
    """Each idle worker is a wrapper, the pid-namespace init that serves and the idle children
    waiting for the next calls: nothing else may remain (once the last call's child is reaped)."""
    for pid in worker_pids(tool):
        deadline = time.monotonic() + 5
        while (left := _leftovers(pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"processes left behind under worker {pid}: {left}"


NETWORK_CODE = """
import socket
for what, target in [("local", ("127.0.0.1", {port})), ("external", ("1.1.1.1", 53))]:
    try:
        socket.create_connection(target, timeout=1).close()
        print(what, "CONNECTED")
    except OSError as exc:
        print(what, "blocked", type(exc).__name__)
try:
    socket.getaddrinfo("example.com", 80)
    print("dns RESOLVED")
except OSError as exc:
    print("dns blocked", type(exc).__name__)
"""


def test_network_is_blocked(tool, tcp_server):
    port, accepted = tcp_server
    res = tool.run(NETWORK_CODE.format(port=port))
    assert res.text.splitlines() == [
        "local blocked OSError",
        "external blocked OSError",
        "dns blocked gaierror",
    ]
    assert accepted == ["x"]  # only the test's own control connection ever reached the server


def test_writes_outside_the_working_directory_are_denied(tool):
    name = f"sandbox-escape-{uuid.uuid4().hex}"
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    targets = [
        REPO / name,
        Path.home() / name,
        Path(tempfile.gettempdir()) / name,
        Path(site_packages) / name,
    ]
    code = "import os\n" + "".join(
        f"try:\n    open({str(t)!r}, 'w').write('x')\n    print('wrote')\nexcept OSError as e:\n    print('denied', e.errno)\n"
        for t in targets
    )
    code += f"__import__('os').system('touch {REPO / name}.sh; touch {Path.home() / name}.sh')\n"
    res = tool.run(code)
    lines = res.text.splitlines()
    assert lines[3] == "denied 30"  # the Python installation is mounted read-only (EROFS)
    for target in targets:  # the other paths may look writable inside (private /tmp) or not exist
        assert not target.exists(), f"sandboxed code wrote {target} on the host"
    assert not (REPO / f"{name}.sh").exists() and not (Path.home() / f"{name}.sh").exists()


def test_working_directory_is_fresh_and_removed(tool):
    first = tool.run(
        "import os\nopen('marker.txt', 'w').write('x')\nprint(os.getcwd(), sorted(os.listdir('.')))"
    )
    assert first.text.endswith("['marker.txt']")
    second = tool.run("import os\nprint(os.getcwd(), sorted(os.listdir('.')))")
    assert second.text.endswith(" []"), second.text  # nothing survives from the previous call


def test_nothing_written_outside_tmp_survives_a_call(tool):
    paths = ["/dev/planted", "/planted", "/etc/planted", "/proc/planted", "/tmp/planted"]
    plant = "".join(f"try:\n    open({p!r}, 'w').write('x')\nexcept OSError:\n    pass\n" for p in paths)
    tool.run(plant)
    res = tool.run(f"import os\nprint([p for p in {paths!r} if os.path.exists(p)])")
    assert res.text == "[]"


def test_ipc_objects_do_not_survive_a_call(tool):
    # SysV shared memory lives in an IPC namespace, not in a file system: each call gets its own.
    shm = "import ctypes\nprint(ctypes.CDLL(None).shmget(424242, {size}, {flags}))"
    assert tool.run(shm.format(size=4096, flags=0o1000 | 0o666)).text == "0"  # created (id 0)
    assert tool.run(shm.format(size=0, flags=0)).text == "-1"  # the next call cannot find it


def test_environment_is_scrubbed(tool):
    # The secret is in the environment of the process that owns the workers (see the fixture).
    res = tool.run(
        "import os\nprint(sorted(os.environ))\nprint(open('/proc/self/environ').read())\n"
        "print(open('/proc/1/environ').read())"
    )
    assert "AGENT_ENVS_FAKE_SECRET" not in res.text and "s3cr3t-value" not in res.text
    assert "'HOME'" in res.text  # the whitelist is there


def test_code_runs_without_capabilities_as_the_configured_uid(tool):
    # For the service this also checks that `serve-sandbox --uid` reaches the workers.
    res = tool.run("import os\nprint(os.getuid(), os.getgid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])")
    uid, gid, caps = res.text.split()
    assert int(caps, 16) == 0
    if PRIVATE_UID is not None:
        assert (int(uid), int(gid)) == (PRIVATE_UID, PRIVATE_UID)


def test_fork_bomb_is_contained(tool):
    start = time.monotonic()
    res = tool.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert res.error == "timeout" and time.monotonic() - start < TIMEOUT + 1.5
    assert_only_workers_left(tool)
    assert tool.run("2 + 2").text == "4"


def test_the_next_call_gets_its_whole_process_budget():
    # A call that ends while 28 children still sleep: they must die with its pid namespace, and be
    # gone before the next call runs, since as the sandbox uid they would count against its
    # RLIMIT_NPROC (32 here). The worker reaps every ended call before running the next one.
    tool = PythonTool(timeout_s=TIMEOUT, pool_size=1, memory_mb=1024, nproc=32, **PRIVATE)
    spawn = "import os, time\nfor _ in range(28):\n    if os.fork() == 0:\n        time.sleep(60)\nprint('left')"
    fork_20 = (
        "import os\nkids = []\nfor _ in range(20):\n    pid = os.fork()\n    if pid == 0:\n"
        "        os._exit(0)\n    kids.append(pid)\nfor pid in kids:\n    os.waitpid(pid, 0)\nprint(len(kids))"
    )
    try:
        for _ in range(5):
            assert tool.run(spawn).text == "left"
            res = tool.run(fork_20)
            assert res.text == "20", res.text
    finally:
        tool.close()


def test_memory_bomb_is_contained(tool):
    # bytes(n) is calloc'd: the address space fills without touching pages (which is slow on VMs).
    res = tool.run("chunks = []\nwhile True:\n    chunks.append(bytes(100 * 1024 * 1024))")
    assert res.ok and res.text.endswith("MemoryError")
    assert tool.run("len(bytearray(10**8))").text == "100000000"  # 100 MB is fine under 1 GB


def test_file_size_bomb_is_contained(tool):
    code = (
        "import os\ntry:\n    with open('big', 'wb') as f:\n        f.write(b'0' * (64 * 1024 * 1024))\n"
        "except OSError as e:\n    print('stopped', e.strerror)\nprint(os.path.getsize('big') <= 8 * 1024 * 1024)"
    )
    res = tool.run(code)
    assert res.text.splitlines() == ["stopped File too large", "True"]


def test_infinite_loop_and_background_processes_die_at_the_deadline(tool):
    code = (
        "import subprocess, os\nsubprocess.Popen(['sleep', '300'])\n"
        "if os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', '301'])\nwhile True:\n    pass"
    )
    start = time.monotonic()
    res = tool.run(code)
    elapsed = time.monotonic() - start
    assert res.text == MESSAGES["timeout"].format(seconds=f"{TIMEOUT:g}") and res.error == "timeout"
    assert TIMEOUT <= elapsed < TIMEOUT + 1.0
    assert_only_workers_left(tool)


def test_background_process_does_not_outlive_a_finished_call(tool):
    res = tool.run("import subprocess\np = subprocess.Popen(['sleep', '300'])\nprint('spawned', p.pid)")
    assert res.text.startswith("spawned")
    assert_only_workers_left(tool)


def test_parent_and_worker_are_untouchable(tool):
    me = tool.holder_pid
    workers = worker_pids(tool)
    code = textwrap.dedent(f"""
        import os, signal
        print("ppid", os.getppid())
        for label, action in [
            ("kill parent", lambda: os.kill(os.getppid(), signal.SIGKILL)),
            ("kill test process", lambda: os.kill({me}, signal.SIGKILL)),
            ("kill worker", lambda: os.kill({workers[0]}, signal.SIGKILL)),
            ("kill -1", lambda: os.kill(-1, signal.SIGKILL)),
            ("read parent environ", lambda: open("/proc/{me}/environ").read()),
            ("read worker environ", lambda: open("/proc/{workers[0]}/environ").read()),
        ]:
            try:
                action()
                print(label, "ALLOWED")
            except OSError as exc:
                print(label, "denied", type(exc).__name__)
        print("alive")
    """)
    before = tool.run("1").metadata["worker_calls"]
    res = tool.run(code)
    lines = res.text.splitlines()
    assert lines[0] == "ppid 0"  # the parent is outside the call's pid namespace
    assert lines[1] in ("kill parent denied ProcessLookupError", "kill parent ALLOWED")  # kill(0): own group
    assert lines[2:6] == [
        "kill test process denied ProcessLookupError",
        "kill worker denied ProcessLookupError",
        "kill -1 denied ProcessLookupError",
        "read parent environ denied FileNotFoundError",
    ]
    assert lines[6] == "read worker environ denied FileNotFoundError" and lines[7] == "alive"
    assert worker_pids(tool) == workers and all(os.path.exists(f"/proc/{p}") for p in workers)
    assert tool.run("1").metadata["worker_calls"] == before + 2  # the same worker served on


def test_fallback_without_namespaces_warns_once(caplog):
    local._warned.clear()
    tool = PythonTool(timeout_s=TIMEOUT, pool_size=1, namespaces=False)
    try:
        with caplog.at_level("WARNING", logger="agent_envs.tools.sandbox.local"):
            assert tool.run("print(1)").text == "1"
            assert tool.run("print(2)").text == "2"
        warnings = [r.getMessage() for r in caplog.records if "namespaces disabled" in r.getMessage()]
        assert len(warnings) == 1 and "network and file system stay open" in warnings[0]
        # Even here: scrubbed env, a temporary working directory removed afterwards, rlimits, timeout.
        # The write sits in a block: a bare `open(...).write(...)` would have its value echoed after
        # the directory (the sandbox echoes a trailing expression), and the path read would be wrong.
        res = tool.run("import os\nwith open('f', 'w') as fh:\n    fh.write('x')\nprint(os.getcwd())")
        workdir = Path(res.text)
        assert workdir.is_absolute() and workdir.name.startswith("agent-envs-sandbox-"), res.text
        # The worker frees a finished call while it waits for the next request, at the latest when
        # that request arrives: after the next call the directory must be gone.
        assert tool.run("while True: pass").error == "timeout"
        assert workdir.parent.exists() and not workdir.exists(), workdir
        # a worker killed outright (no teardown of its own) leaves no directory behind either
        scratch = workdir.parent
        assert scratch.name.startswith("agent-envs-sandbox-") and any(scratch.iterdir())  # prepared calls
        pid = worker_pids(tool)[0]
        os.kill(pid, signal.SIGKILL)
        res = tool.run("print(3)")
        assert res.error == "sandbox" and "killed by SIGKILL" in res.text and not scratch.exists(), res.text
        assert tool.run("print(4)").text == "4"  # a fresh worker, with a scratch of its own
    finally:
        tool.close()


# ------------------------------------------------------------------------------------------------
# The same attacks as an unprivileged user


DRIVER = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from sandbox import SandboxConfig
from sandbox.local import LocalSandbox
port, host_dir = int(sys.argv[2]), sys.argv[3]
sb = LocalSandbox(SandboxConfig(timeout_s=1.5, pool_size=1, memory_mb=512, fsize_mb=4, nproc=32))
out = {"uid": os.getuid()}
def run(name, code):
    start = time.monotonic()
    r = sb.execute(code)
    out[name] = {"stdout": r.stdout, "stderr": r.stderr[-300:], "timed_out": r.timed_out, "error": r.error,
                 "elapsed": time.monotonic() - start}
run("hello", "print('hi')")
out["isolation"] = sb.isolation
run("network", NETWORK)
run("write", f"open({host_dir!r} + '/escaped', 'w').write('x')")
run("env", "import os; print(sorted(os.environ))")
run("fork_bomb", "import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass")
worker = sb._idle[0].proc.pid
run("after_bomb", "print(2 + 2)")
run("memory", "x = bytearray(2 * 1024**3)")
run("fsize", "open('big', 'wb').write(b'0' * (16 * 1024 * 1024))")
run("parent", f"import os\\nfor pid in (-1, {os.getpid()}):\\n    try:\\n        os.kill(pid, 9)\\n    except OSError as e:\\n        print(type(e).__name__)")
run("after_parent", "print('alive')")
run("dev_write", "open('/dev/planted', 'w').write('x')")
run("ipc_make", "import ctypes\\nprint(ctypes.CDLL(None).shmget(424242, 4096, 0o1666))")
run("ipc_find", "import ctypes\\nprint(ctypes.CDLL(None).shmget(424242, 0, 0))")
out["worker_same"] = sb._idle[0].proc.pid == worker
sb.close()
print(json.dumps(out))
"""


def _unprivileged_runner() -> tuple[list[str], str] | None:
    """A command prefix that runs a system Python as an unprivileged uid, or None with the reason."""
    if os.geteuid() != 0:
        return ["/usr/bin/env"], sys.executable  # already unprivileged: run directly
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
    setpriv = shutil.which("setpriv")
    if python is None or setpriv is None:
        return None
    return [setpriv, f"--reuid={PRIVATE_UID}", f"--regid={PRIVATE_UID}", "--clear-groups"], python


@pytest.mark.skipif(
    _unprivileged_runner() is None,
    reason="no system Python and setpriv to run the sandbox as an unprivileged user here",
)
def test_isolation_holds_for_an_unprivileged_user(tcp_server):
    port, accepted = tcp_server
    prefix, python = _unprivileged_runner()
    copy = Path(tempfile.mkdtemp(prefix="sandbox-nonroot-"))
    host_dir = copy / "world-writable"
    try:
        # The venv lives under a root-only home, so the driver uses the system Python and a readable
        # copy of the (stdlib-only) sandbox package.
        shutil.copytree(
            Path(local.__file__).parent, copy / "sandbox", ignore=shutil.ignore_patterns("__pycache__")
        )
        (copy / "driver.py").write_text(DRIVER.replace("NETWORK", repr(NETWORK_CODE.format(port=port))))
        host_dir.mkdir()
        for path in (copy, host_dir):
            path.chmod(0o777 if path == host_dir else 0o755)
        for path in copy.rglob("*"):
            if path != host_dir:
                path.chmod(0o755 if path.is_dir() else 0o644)
        env = {"PATH": "/usr/bin:/bin", "AGENT_ENVS_FAKE_SECRET": "s3cr3t-value"}
        proc = subprocess.run(
            [*prefix, python, str(copy / "driver.py"), str(copy), str(port), str(host_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd="/",
        )
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert not (host_dir / "escaped").exists()
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    assert out["uid"] != 0 and out["hello"]["stdout"] == "hi\n"
    assert out["isolation"]["user"] == "userns" and out["isolation"]["net"] and out["isolation"]["pid"]
    assert out["network"]["stdout"].splitlines() == [
        "local blocked OSError",
        "external blocked OSError",
        "dns blocked gaierror",
    ]
    assert accepted == ["x"]
    assert "Error" in out["write"]["stderr"]  # the host's world-writable directory is out of reach
    assert "AGENT_ENVS_FAKE_SECRET" not in out["env"]["stdout"] and "HOME" in out["env"]["stdout"]
    assert out["fork_bomb"]["timed_out"] and out["fork_bomb"]["elapsed"] < 3.5
    assert out["after_bomb"]["stdout"] == "4\n"
    assert out["memory"]["stderr"].strip().endswith("MemoryError")
    assert "File too large" in out["fsize"]["stderr"] or "No space left" in out["fsize"]["stderr"]
    assert (
        out["parent"]["stdout"] == "ProcessLookupError\nProcessLookupError\n"
        and out["after_parent"]["stdout"] == "alive\n"
    )
    assert (out["ipc_make"]["stdout"], out["ipc_find"]["stdout"]) == ("0\n", "-1\n")
    # /dev is a tmpfs this user owns inside its namespace: read-only, or files would outlive calls
    assert "Read-only file system" in out["dev_write"]["stderr"]
    assert out["worker_same"]
