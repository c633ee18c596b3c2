"""PythonTool behaviour through real sandbox workers: echo, output rules, timeouts, concurrency, cleanup.

The isolation guarantees have their own suite (test_sandbox_isolation.py). Docker tests skip when
no engine is reachable; the no-engine path itself is tested for a clear observation.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from agent_envs.base.messages import MESSAGES
from agent_envs.tools import PythonTool
from agent_envs.tools.python import truncate_middle
from agent_envs.tools.sandbox import SandboxConfig
from agent_envs.tools.sandbox.local import LocalSandbox


@pytest.fixture(scope="module")
def tool():
    tool = PythonTool(timeout_s=2.0, preamble=("math", "numpy as np"), pool_size=2)
    yield tool
    tool.close()


def test_echo_of_trailing_expression(tool):
    res = tool.run("x = 6*7\nx")
    assert (res.text, res.ok) == ("42", True)
    assert tool.run("print('hi')").text == "hi"  # a print call is not echoed twice
    assert tool.run("'a' + 'b'").text == "ab"  # printed with print(), as the ARPO reference does
    assert tool.run("for i in range(3):\n    print(i)").text == "0\n1\n2"


def test_empty_output_is_a_valid_result(tool):
    res = tool.run("x = 1")
    assert (res.text, res.ok, res.error) == (MESSAGES["no_output"], True, None)
    assert res.metadata["exit_code"] == 0


def test_exception_shows_stdout_then_traceback(tool):
    res = tool.run("print('before')\n1/0")
    assert res.ok  # code that raises is a valid result for the model to read
    lines = res.text.splitlines()
    assert lines[0] == "before" and lines[1].startswith("Traceback")
    assert lines[-1] == "ZeroDivisionError: division by zero"
    assert 'File "<string>", line 2' in res.text and "1/0" in res.text  # user frames only, with source
    assert "worker.py" not in res.text


def test_last_line_error_format():
    tool = PythonTool(timeout_s=2.0, error_format="last_line", pool_size=1)
    try:
        assert tool.run("print('so far')\nraise KeyError('k')").text == "so far\nKeyError: 'k'"
        assert tool.run("def f(:\n  pass").text == "SyntaxError: invalid syntax"
    finally:
        tool.close()


def test_syntax_error_and_system_exit(tool):
    res = tool.run("def f(:\n  pass")
    assert res.ok and "SyntaxError" in res.text and "line 1" in res.text
    assert tool.run("import sys\nprint('x')\nsys.exit(3)").metadata["exit_code"] == 3
    assert tool.run("import sys\nprint('x')\nsys.exit(0)").text == "x"


def test_exit_status_without_a_report_comes_from_the_kernel(tool):
    # os._exit and signals skip the child's status report: the worker falls back to waitpid.
    assert tool.run("import os\nprint('x', flush=True)\nos._exit(4)").metadata["exit_code"] == 4
    # A fault the kernel raises (pid 1 of a pid namespace ignores signals it sends itself).
    res = tool.run("import ctypes\nctypes.string_at(0)")
    assert res.metadata["exit_code"] == -11 and "SIGSEGV" in res.text
    assert tool.run("import sys\nsys.exit(300)").metadata["exit_code"] == 300 & 0xFF  # as `python -c`


def test_large_and_odd_code_reaches_the_prepared_child(tool):
    # Larger than a pipe buffer (the child reads while the worker writes); non-ASCII; a lone
    # surrogate, which Python cannot compile: an error the model reads, not a failed call.
    assert tool.run("x = '" + "a" * 200_000 + "'\nlen(x)").text == "200000"
    assert tool.run("len('é😀')").text == "2"
    res = tool.run("len('\ud800')")
    assert res.ok and res.error is None and "surrogates not allowed" in res.text


def test_per_call_timeout_override_gets_its_own_child():
    sandbox = LocalSandbox(SandboxConfig(timeout_s=5.0, pool_size=1))
    try:
        assert sandbox.execute("print(1)").stdout == "1\n"  # the next child is prepared for 5 s
        start = time.monotonic()
        res = sandbox.execute("import time\ntime.sleep(3)", timeout_s=0.5)
        assert res.timed_out and time.monotonic() - start < 2.0
        res = sandbox.execute("import time\ntime.sleep(1)\nprint('done')")
        assert (res.timed_out, res.stdout) == (False, "done\n")
    finally:
        sandbox.close()


def test_preamble_is_bound_and_stateless_between_calls(tool):
    assert tool.run("math.factorial(5)").text == "120"
    assert tool.run("int(np.arange(5).sum())").text == "10"
    assert tool.run("secret_value = 7\nsecret_value").text == "7"
    res = tool.run("secret_value")  # the previous call's globals are gone
    assert res.ok and res.text.endswith("NameError: name 'secret_value' is not defined")


def test_output_is_middle_truncated(tool):
    small = PythonTool(timeout_s=2.0, max_output_chars=200, pool_size=1)
    try:
        res = small.run("print('HEAD' + 'x' * 10000 + 'TAIL')")
        assert len(res.text) <= 200 and res.text.startswith("HEAD") and res.text.endswith("TAIL")
        assert "characters truncated" in res.text
        # 40 MB of output: the capture keeps head and tail, counts the rest, and does not stall.
        res = small.run("import sys\n_ = sys.stdout.write('A' * 20_000_000 + 'B' * 20_000_000)")
        assert res.text.startswith("A") and res.text.endswith("B") and len(res.text) <= 200
        dropped = int(res.text.split("... [")[1].split(" ")[0])
        assert dropped >= 40_000_000 - 200
    finally:
        small.close()


def test_truncate_middle_exact():
    assert truncate_middle("abc", 10) == "abc"
    out = truncate_middle("a" * 50 + "b" * 50, 64)
    assert len(out) <= 64 and out.startswith("a") and out.endswith("b") and "[" in out


def test_timeout_fires_and_kills(tool):
    start = time.monotonic()
    res = tool.run("print('started', flush=True)\nwhile True:\n    pass")
    elapsed = time.monotonic() - start
    assert (res.ok, res.error) == (False, "timeout")
    assert res.text == "started\n" + MESSAGES["timeout"].format(seconds="2")
    assert 2.0 <= elapsed < 3.5
    assert tool.run("1 + 1").text == "2"  # the same pool keeps working


async def test_concurrent_calls_from_many_tasks(tool):
    codes = [f"import time\ntime.sleep(0.05)\nprint({i} * {i})" for i in range(10)]
    results = await asyncio.gather(*(tool(code) for code in codes))
    assert [r.text for r in results] == [str(i * i) for i in range(10)]
    assert all(r.ok and r.latency_s > 0 for r in results)


async def test_async_call_and_aclose_stop_workers():
    tool = PythonTool(timeout_s=2.0, pool_size=2)
    await asyncio.gather(tool("print('hi')"), tool("print('ho')"))
    pids = [w.proc.pid for w in tool._sandbox._idle]
    assert pids and all(os.path.exists(f"/proc/{pid}") for pid in pids)
    await tool.aclose()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)  # killed and reaped: no zombies
    assert (await tool("print('again')")).text == "again"  # restarts lazily
    await tool.aclose()


def test_each_call_runs_once(tool):
    before = tool.run("1").metadata["worker_calls"]
    assert tool.run("").error == "empty_call"  # nothing executed for an empty call
    res = tool.run("pass")
    assert res.text == MESSAGES["no_output"]
    assert res.metadata["worker_calls"] in (before + 1, 1)  # one execution (possibly on the other worker)


def test_bad_configuration_names_the_field():
    with pytest.raises(ValueError, match="backend"):
        PythonTool(backend="firecracker")
    with pytest.raises(ValueError, match="error_format"):
        PythonTool(error_format="short")
    with pytest.raises(ValueError, match="memory_mb"):
        PythonTool(memory_mb=0)
    with pytest.raises(ValueError, match="preamble entry"):
        PythonTool(preamble=("from math import pi",))
    with pytest.raises(TypeError, match="unknown sandbox options"):
        PythonTool(timeout=3)


def test_bad_preamble_module_is_a_clear_failed_result():
    tool = PythonTool(timeout_s=2.0, preamble=("no_such_module_xyz",), pool_size=1)
    try:
        res = tool.run("print(1)")
        assert not res.ok and res.error == "sandbox"
        assert "no_such_module_xyz" in res.text
    finally:
        tool.close()
