"""The sandbox attack suite against stateful sessions (`PythonTool(session=True)`).

The attacks of tests/tools/test_sandbox_isolation.py whose claim holds as stated for a session run
here unchanged against a session tool (imported, so they are collected again with this module's
`tool` fixture). The claims about "the next call" become claims about the next *session* (within
one, files and IPC objects persist by design), and the process checks look at the session
workers. As there, every effect is checked from outside the sandbox. The unprivileged run drives
sessions as an unprivileged uid (user namespaces instead of setuid).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from sandbox_support import descendants, worker_pids
from test_sandbox_isolation import (  # noqa: F401 (collected again, against sessions)
    LIMITS,
    NETWORK_CODE,
    SECRET,
    TIMEOUT,
    _unprivileged_runner,
    assert_only_workers_left,
    tcp_server,
    test_code_runs_without_capabilities_as_the_configured_uid,
    test_environment_is_scrubbed,
    test_file_size_bomb_is_contained,
    test_fork_bomb_is_contained,
    test_network_is_blocked,
    test_writes_outside_the_working_directory_are_denied,
)

from agent_envs.base.messages import MESSAGES
from agent_envs.tools import PythonTool
from agent_envs.tools.sandbox import local

RESET = MESSAGES["session_reset"].split("(")[0]


@pytest.fixture(scope="module")
def tool():
    with pytest.MonkeyPatch.context() as mp:
        for key, value in SECRET.items():
            mp.setenv(key, value)
        tool = PythonTool(pool_size=1, session=True, **LIMITS)
        tool.run("1")
        assert tool.isolation["net"] and tool.isolation["mount"] and tool.isolation["pid"], tool.isolation
        tool.holder_pid = os.getpid()
        yield tool
        tool.close()


@pytest.fixture(autouse=True)
def fresh_session(tool):
    """Each attack starts in a session of its own (the tool's default one, replaced)."""
    yield
    with tool._lock:
        session, tool._default_session = tool._default_session, None
    if session is not None:
        session.close()


def test_a_new_session_starts_with_an_empty_directory(tool):
    first, second = tool.open_session(), tool.open_session()
    try:
        made = first.run("import os\nopen('marker.txt', 'w').write('x')\nprint(os.path.abspath('marker.txt'))").text
        # its own empty directory; the first session's file is in another family's /tmp, out of sight
        # (what else /tmp holds depends on where the interpreter is installed: its folders are bound)
        res = second.run(f"import os\nprint(sorted(os.listdir('.')), os.path.exists({made!r}))")
        assert res.text == "[] False"
    finally:
        first.close()
        second.close()


def test_nothing_planted_reaches_another_session(tool):
    paths = ["/dev/planted", "/planted", "/etc/planted", "/proc/planted", "/tmp/planted"]
    plant = "".join(f"try:\n    open({p!r}, 'w').write('x')\nexcept OSError:\n    pass\n" for p in paths)
    planter, other = tool.open_session(), tool.open_session()
    planter.run(plant)
    assert other.run(f"import os\nprint([p for p in {paths!r} if os.path.exists(p)])").text == "[]"
    planter.close()
    other.close()


def test_ipc_objects_do_not_reach_another_session(tool):
    shm = "import ctypes\nprint(ctypes.CDLL(None).shmget(424242, {size}, {flags}))"
    maker, other = tool.open_session(), tool.open_session()
    assert maker.run(shm.format(size=4096, flags=0o1000 | 0o666)).text == "0"
    assert other.run(shm.format(size=0, flags=0)).text == "-1"
    assert maker.run(shm.format(size=0, flags=0)).text == "0"  # its own session still has it
    maker.close()
    other.close()


def test_memory_bomb_is_contained(tool):
    res = tool.run("chunks = []\nwhile True:\n    chunks.append(bytes(100 * 1024 * 1024))")
    assert res.ok and res.text.endswith("MemoryError")
    # The session keeps its variables, the bomb's list included: freeing it is the code's business.
    assert tool.run("del chunks\nlen(bytearray(10**8))").text == "100000000"


def test_infinite_loop_and_background_processes_die_at_the_deadline(tool):
    code = (
        "import subprocess, os\nsubprocess.Popen(['sleep', '300'])\n"
        "if os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', '301'])\nwhile True:\n    pass"
    )
    start = time.monotonic()
    res = tool.run(code)
    elapsed = time.monotonic() - start
    assert res.text.startswith(MESSAGES["timeout"].format(seconds=f"{TIMEOUT:g}")) and RESET in res.text
    assert res.error == "timeout" and TIMEOUT <= elapsed < TIMEOUT + 1.0
    assert_only_workers_left(tool)  # the family ended with its only session, the setsid escapee too


def test_background_processes_end_with_the_session(tool):
    session = tool.open_session()
    res = session.run("import subprocess, os\np = subprocess.Popen(['sleep', '300'])\n"
                      "if os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', '301'])\nprint('spawned')")
    assert res.text == "spawned"
    assert session.run("p.poll() is None").text == "True"  # a session's processes outlive its cells
    session.close()
    assert_only_workers_left(tool)


def test_parent_worker_and_other_sessions_are_untouchable(tool):
    other = tool.open_session()
    other.run("import os\nmine = os.getpid()")
    other_pid = other.run("mine").text
    me = tool.holder_pid
    tool.run("1")
    [worker] = worker_pids(tool)
    code = textwrap.dedent(f"""
        import os, signal
        print("ppid", os.getppid())
        for label, action in [
            ("kill init", lambda: os.kill(1, signal.SIGKILL)),
            ("kill test process", lambda: os.kill({me}, signal.SIGKILL)),
            ("kill worker", lambda: os.kill({worker}, signal.SIGKILL)),
            ("read worker environ", lambda: open("/proc/{worker}/environ").read()),
        ]:
            try:
                action()
                print(label, "ALLOWED")
            except OSError as exc:
                print(label, "denied", type(exc).__name__)
        print("others", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
        try:
            os.kill(-1, signal.SIGKILL)  # everything this uid may signal: only its own family
        except OSError as exc:
            print("kill -1", type(exc).__name__)
    """)
    res = tool.run(code)
    lines = res.text.splitlines()
    assert lines[0] == "ppid 1"  # the family's init; the worker is outside its pid namespace
    assert lines[1] in ("kill init denied PermissionError", "kill init ALLOWED")  # pid 1 ignores it
    assert lines[2:5] == [
        "kill test process denied ProcessLookupError",
        "kill worker denied ProcessLookupError",
        "read worker environ denied FileNotFoundError",
    ]
    assert lines[5] == "others [1, 2]", lines[5]  # init and itself: no other session is visible
    assert worker_pids(tool) == [worker] and os.path.exists(f"/proc/{worker}")
    assert other.run("mine").text == other_pid  # the other session lived through it all
    other.close()


def test_session_processes_run_in_a_namespace_of_their_own(tool):
    # (that they run unprivileged, as the configured uid, is the imported
    # test_code_runs_without_capabilities_as_the_configured_uid)
    assert tool.run("x = 1").ok
    [worker] = worker_pids(tool)
    family = descendants(worker)
    assert len(family) >= 3  # the worker's serving init, the family's init, the interpreter


DRIVER = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from sandbox import SandboxConfig
from sandbox.local import LocalSandbox
port, host_dir = int(sys.argv[2]), sys.argv[3]
sb = LocalSandbox(SandboxConfig(timeout_s=1.5, pool_size=1, memory_mb=512, fsize_mb=4, nproc=32))
pool = sb.sessions
out = {"uid": os.getuid()}
a = pool.open()
def run(name, sid, code):
    r = pool.run(sid, code)
    out[name] = {"stdout": r.stdout, "stderr": r.stderr[-300:], "timed_out": r.timed_out,
                 "lost": r.metadata.get("session_lost")}
run("set", a, "x = 41")
b = pool.fork(a, 1)
run("fork_add", b, "x += 1\\nprint(x)")
run("parent_x", a, "print(x)")
out["isolation"] = sb.isolation
run("network", a, NETWORK)
run("write", a, f"open({host_dir!r} + '/escaped', 'w').write('x')")
run("env", a, "import os; print(sorted(os.environ))")
run("loop", b, "while True: pass")
run("after_loop", a, "print(x)")
run("parent", a, f"import os\\nfor pid in ({os.getpid()}, {sb.sessions.worker_pids()[0]}):\\n    try:\\n        os.kill(pid, 9)\\n    except OSError as e:\\n        print(type(e).__name__)")
pool.close(a)
pool.close(b)
time.sleep(0.3)
def children(pid):
    return [p for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/stat")
            and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(pid)]
[serving] = children(pool.worker_pids()[0])  # the worker's pid-namespace init, which serves
out["left"] = children(serving)
sb.close()
print(json.dumps(out))
"""


@pytest.mark.skipif(
    _unprivileged_runner() is None,
    reason="no system Python and setpriv to run the sandbox as an unprivileged user here",
)
def test_sessions_hold_for_an_unprivileged_user(tcp_server):  # noqa: F811 (the fixture imported above)
    port, accepted = tcp_server
    prefix, python = _unprivileged_runner()
    copy = Path(tempfile.mkdtemp(prefix="sandbox-nonroot-"))
    host_dir = copy / "world-writable"
    try:
        shutil.copytree(Path(local.__file__).parent, copy / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
        (copy / "driver.py").write_text(DRIVER.replace("NETWORK", repr(NETWORK_CODE.format(port=port))))
        host_dir.mkdir()
        host_dir.chmod(0o777)
        copy.chmod(0o755)
        for path in copy.rglob("*"):
            if path != host_dir:
                path.chmod(0o755 if path.is_dir() else 0o644)
        proc = subprocess.run(
            [*prefix, python, str(copy / "driver.py"), str(copy), str(port), str(host_dir)],
            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **SECRET}, cwd="/",
        )
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert not (host_dir / "escaped").exists()
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    assert out["uid"] != 0 and out["isolation"]["user"] == "userns" and out["isolation"]["pid"]
    assert out["fork_add"]["stdout"] == "42\n" and out["parent_x"]["stdout"] == "41\n"
    assert out["network"]["stdout"].splitlines() == ["local blocked OSError", "external blocked OSError",
                                                     "dns blocked gaierror"]
    assert accepted == ["x"]
    assert "Error" in out["write"]["stderr"]
    assert "AGENT_ENVS_FAKE_SECRET" not in out["env"]["stdout"] and "HOME" in out["env"]["stdout"]
    assert out["loop"]["timed_out"] and out["loop"]["lost"]
    assert out["after_loop"]["stdout"] == "41\n"  # the fork's kill left its parent alone
    assert out["parent"]["stdout"] == "ProcessLookupError\nProcessLookupError\n"
    assert out["left"] == [], out["left"]  # no family is left under the serving worker


def _wait_dead(pid: int) -> None:
    """Until the signalled process has really ended (a zombie or gone): kill() returns first."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)


def test_killing_the_session_worker_is_an_observation(tool):
    tool.run("x = 1")
    [worker] = worker_pids(tool)
    os.kill(worker, signal.SIGKILL)
    _wait_dead(worker)
    res = tool.run("print('x' in globals())")
    assert RESET in res.text and res.text.endswith("False")
    assert worker_pids(tool) != [worker]


TAMPER = """
import os, socket, stat, struct
for fd in map(int, os.listdir('/proc/self/fd')):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            sock = socket.socket(fileno=fd)
            sock.send({payload})
            sock.detach()
    except OSError:
        pass
print('sent')
"""


@pytest.mark.parametrize("payload", ["struct.pack('>I', 1 << 30) + b'x' * 1000", "struct.pack('>I', 5) + b'[1,2'",
                                     "struct.pack('>I', 2) + b'{}'"])
def test_code_writing_to_its_control_socket_hurts_only_its_own_session(tool, payload):
    bystander = tool.open_session()
    assert bystander.run("y = 2").ok
    # the previous payload may have left its worker dying: the bystander's first call replaced it
    deadline = time.monotonic() + 5
    while len(worker_pids(tool)) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
        bystander.run("y = 2")
    [worker] = worker_pids(tool)
    res = tool.run(TAMPER.format(payload=payload))
    # A well-formed message without a status is ignored (the cell's own report follows); anything
    # else loses the session, with the reset notice.
    assert res.text == "sent" or RESET in res.text, res.text
    assert bystander.run("y").text == "2"
    assert worker_pids(tool) == [worker]  # the worker lived through it
    bystander.close()
