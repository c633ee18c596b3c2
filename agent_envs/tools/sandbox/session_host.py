"""Stateful Python sessions inside a local sandbox worker, and their copy-on-write forks.

The worker (`worker.py serve`) loads this file before it isolates itself (stdlib only) and hands
it every request that carries an `op`: `session_open`, `session_run`, `session_fork`,
`session_close`. A session is one long-lived interpreter that runs cell after cell in the same
globals, so variables, imports and files persist. Its layout:

- a *family* per opened session: an init process, pid 1 of a fresh pid namespace, in its own
  mount and IPC namespaces with a tmpfs `/tmp`, rlimits and no privileges, exactly like a call's
  child (`worker.isolate_child`); it only reaps. Killing it ends everything in the family.
- the session's interpreter, a child of the init in its own process group, working in its own
  directory under `/tmp`; it talks to the worker over a socket pair (requests, status, and the
  descriptors of a fork) and writes its output to two pipes the worker reads.
- a fork: the interpreter forks itself (copy-on-write: the fork starts with the memory as it
  stood), reseeds `random` (and numpy's global generator when imported), copies its directory and
  sends the worker its new socket and pipes. A fork stays in its parent's family (an unprivileged
  process cannot leave its pid namespace), so it outlives its parent, and the family lives until
  its last session closes.

The worker enforces each cell's deadline as for a call: at the deadline it kills the
interpreter's process group and reports the session lost; a session whose interpreter died (a
kill, the OOM killer, `os._exit`) is reported lost on its next request. Processes a cell starts
in the background keep running between cells (they are the session's); those that leave its
process group live until the family ends.

This module only runs inside the worker process; `LocalSandbox.session_*` is its client.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import secrets
import select
import shutil
import signal
import socket
import struct
import sys
import time
from typing import Any

HEADER = struct.Struct(">I")
REPLY_MAX_BYTES = 4096  # what the worker accepts from an interpreter (statuses, fork replies)
SESSION_CPU_CALLS = 100  # RLIMIT_CPU of an interpreter: this many cells' worth (each also has its deadline)
MAX_FDS = 4

W: Any = None  # the worker module (worker.py runs as __main__; handed over by SessionHost)


# ----------------------------------------------------------------------------------------------
# Messages on a session's socket: a length-prefixed JSON body, descriptors with its first byte.


def send_message(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    frame = HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [frame], list(fds)) if fds else sock.send(frame)
    if sent < len(frame):
        sock.sendall(frame[sent:])


def recv_message(sock: socket.socket, max_size: int = 1 << 31) -> tuple[dict | None, list[int]]:
    """Blocking (the socket's timeout applies); (None, []) at EOF.

    The worker reads what an interpreter sends with a small `max_size`: code running there can
    write to its end of the socket too, and must not make the worker allocate or hang on it."""
    buf, fds = b"", []
    need = HEADER.size
    try:
        while len(buf) < need:
            data, got, _, _ = socket.recv_fds(sock, need - len(buf), MAX_FDS)
            fds += got
            if not data:
                for fd in fds:
                    os.close(fd)
                return None, []
            buf += data
            if len(buf) == HEADER.size and need == HEADER.size:
                need += HEADER.unpack(buf)[0]
                if need > max_size:
                    raise OSError(f"a message of {need} bytes, more than {max_size}")
        message = json.loads(buf[HEADER.size :])
        if not isinstance(message, dict):
            raise OSError("a message that is not an object")
        return message, fds
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        raise


# ----------------------------------------------------------------------------------------------
# Inside the session's interpreter


def _reseed(seed: int) -> None:
    """A fork's own randomness: the global generators of `random` and numpy, when imported."""
    for name, seeder in (("random", lambda m: m.seed(seed)), ("numpy", lambda m: m.random.seed(seed % 2**32))):
        module = sys.modules.get(name)
        if module is not None:
            with contextlib.suppress(Exception):
                seeder(module)


def _enter(home: str, ctrl: socket.socket, out_fd: int, err_fd: int, hello: bool = True) -> None:
    """Become a session's interpreter: own process group, output on the pipes, home directory;
    `hello` sends the worker this process's pidfd (a fork's parent sends it instead)."""
    os.setsid()
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    W._close_fds_except({ctrl.fileno()})
    os.makedirs(home, exist_ok=True)
    os.chdir(home)
    os.environ.update(HOME=home, TMPDIR=home)
    if hello:
        pidfd = os.pidfd_open(os.getpid())
        send_message(ctrl, {"ready": True, "home": home}, (pidfd,))
        os.close(pidfd)


def _fork(ctrl: socket.socket, home: str, seed: int) -> tuple[socket.socket, str] | int:
    """Fork this interpreter; in the fork, return its socket and home; in the parent, its pid."""
    fds: list[int] = []
    try:
        mine, theirs = socket.socketpair()
        fds += [mine.detach(), theirs.detach()]
        fds += os.pipe() + os.pipe()
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    mine, theirs = socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1])
    out_r, out_w, err_r, err_w = fds[2:]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # The fork keeps every object that exists now out of its garbage collector's walks, which
    # would otherwise write to (and so copy) the pages of the whole shared heap.
    gc.freeze()
    try:
        pid = os.fork()
    except OSError:
        gc.unfreeze()
        mine.close()
        theirs.close()
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        raise
    if pid == 0:
        ctrl.close()
        theirs.close()
        new_home = os.path.join(os.path.dirname(home), "session-" + secrets.token_hex(6))
        try:
            shutil.copytree(home, new_home, symlinks=True)
        except OSError as exc:  # e.g. the family's tmpfs is full: the fork starts without them
            os.makedirs(new_home, exist_ok=True)
            os.write(err_w, f"[session fork: files not copied: {exc}]\n".encode())
        _reseed(seed)
        _enter(new_home, mine, out_w, err_w, hello=False)
        return mine, new_home
    gc.unfreeze()  # this side collects its own objects again
    # The worker gets the fork's pidfd from here, so it need not wait for the fork to be scheduled:
    # the fork sets itself up while the worker answers, and reads its first cell when ready.
    pidfd = os.pidfd_open(pid)
    mine.close()
    os.close(out_w)
    os.close(err_w)
    send_message(ctrl, {"forked": True}, (theirs.fileno(), out_r, err_r, pidfd))
    for fd in (out_r, err_r, pidfd):
        os.close(fd)
    theirs.close()
    return pid


def _reap(forks: set[int]) -> None:
    """Reap this interpreter's ended forks (only those: the code's own children are its business).
    Zombies count against RLIMIT_NPROC; a parent forked many times would run out of processes."""
    for pid in list(forks):
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                forks.discard(pid)
        except ChildProcessError:  # the code reaped it itself
            forks.discard(pid)


def serve_session(ctrl: socket.socket, home: str, namespace: dict) -> None:
    """The interpreter's loop: run cells in one namespace, fork on request. Never returns."""
    status = 0
    forks: set[int] = set()
    try:
        while True:
            message, _ = recv_message(ctrl)
            if message is None:  # the worker closed the session or died
                break
            _reap(forks)
            if message["op"] == "run":
                code = message["code"]
                status = W.run_compiled(*W.compile_code(code), namespace, keep_state=True)
                send_message(ctrl, {"status": status & 0xFF})
            elif message["op"] == "fork":
                try:
                    forked = _fork(ctrl, home, int(message["seed"]))
                except OSError as exc:  # e.g. RLIMIT_NPROC: this session goes on, without a fork
                    send_message(ctrl, {"forked": False, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                if isinstance(forked, int):
                    forks.add(forked)
                else:  # this is the fork: its parent's forks are not its children
                    ctrl, home = forked
                    forks = set()
    finally:
        os._exit(0)


# ----------------------------------------------------------------------------------------------
# The worker's side


class ForkRefused(Exception):
    """The interpreter could not fork (it said why) and goes on."""


class Session:
    """The worker's handle on one interpreter."""

    def __init__(self, sid: str, family: Family, ctrl: socket.socket, out_r: int, err_r: int) -> None:
        self.sid, self.family, self.ctrl, self.out_r, self.err_r = sid, family, ctrl, out_r, err_r
        self.pidfd = -1
        self.pid = 0  # in the worker's pid namespace (for the process-group kill)
        self.lost: str | None = None

    def attach(self, deadline: float) -> None:
        """Wait for the interpreter's hello, which brings its pidfd."""
        self.ctrl.settimeout(max(0.01, deadline - time.monotonic()))
        hello, fds = recv_message(self.ctrl, REPLY_MAX_BYTES)
        if hello is None or not fds:
            raise OSError("the session's interpreter did not start")
        for fd in fds[1:]:
            os.close(fd)
        self.adopt(fds[0])

    def adopt(self, pidfd: int) -> None:
        """Take the interpreter's pidfd; find its pid here (for the process-group kill)."""
        self.pidfd = pidfd
        with open(f"/proc/self/fdinfo/{self.pidfd}") as f:
            self.pid = next(int(line.split()[1]) for line in f if line.startswith("Pid:"))

    def kill(self) -> None:
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        if self.pid > 0:
            with contextlib.suppress(OSError):
                os.killpg(self.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        self.ctrl.close()
        for fd in (self.out_r, self.err_r, self.pidfd):
            if fd >= 0:
                os.close(fd)
        self.pidfd = -1


class Family:
    """The init process of one opened session and its forks."""

    def __init__(self, pid: int, workdir: str | None) -> None:
        self.pid = pid
        self.workdir = workdir  # only without a mount namespace: removed with the family
        self.members: set[str] = set()

    def end(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _family_init(req: dict, iso: Any, namespace: dict, workdir: str, ctrl: socket.socket, out_w: int,
                 err_w: int) -> None:
    """Pid 1 of a family: isolate like a call's child, start the first interpreter, then reap."""
    try:
        limits = dict(req, timeout_s=float(req["timeout_s"]) * SESSION_CPU_CALLS)
        workdir = W.isolate_child(limits, iso, workdir, out_w, err_w, {ctrl.fileno(), out_w, err_w})
        home = os.path.join(workdir, "session-" + secrets.token_hex(6))
        if os.fork() == 0:
            _enter(home, ctrl, out_w, err_w)
            serve_session(ctrl, home, dict(namespace))
        # Hold none of the interpreter's descriptors: its death must show as EOF and a pidfd event.
        ctrl.close()
        os.close(out_w)
        os.close(err_w)
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 1)
        os.dup2(null, 2)
        while True:
            try:
                os.wait()
            except ChildProcessError:
                select.select([], [], [], 0.05)  # a fork may still be on its way to being reparented
            except InterruptedError:
                pass
    except BaseException as exc:
        with contextlib.suppress(Exception):
            os.write(err_w, f"sandbox setup failed: {exc}\n".encode())
    os._exit(W.EXIT_SETUP_FAILED)


class SessionHost:
    """All sessions of one worker, by id; `handle` answers one request."""

    def __init__(self, worker: Any, iso: Any, namespace: dict) -> None:
        global W
        W = worker
        self.iso, self.namespace = iso, namespace
        self.sessions: dict[str, Session] = {}
        self.counter = 0

    def handle(self, req: dict) -> dict:
        op = req["op"]
        session = None
        try:
            if op == "session_open":
                return {"sid": self._open(req)}
            if op == "session_close":
                self._close(req["sid"])
                return {"closed": True}
            session = self.sessions.get(req["sid"])
            if session is None or session.lost:
                reason = session.lost if session else "the session is unknown to this worker"
                return {"lost": reason}
            if op == "session_run":
                if select.select([session.pidfd], [], [], 0)[0]:  # died since its last cell
                    self._close(session.sid)
                    return {"lost": "the interpreter ended between two calls (killed, or it exited)"}
                reply = self._run(session, req)
                if reply["lost"]:  # its family ends now if it was the last one in it
                    self._close(session.sid)
                return reply
            if op == "session_fork":
                return {"sid": self._fork(session, req)}
        except ForkRefused as exc:  # the parent is fine; only its copy could not be made
            return {"refused": f"the interpreter could not fork: {exc}"}
        except Exception as exc:  # this session's trouble (or its code's mischief): only it is lost
            if session is not None:
                self._close(session.sid)
            return {"lost": f"session {op} failed: {type(exc).__name__}: {exc}"}
        return {"error": f"unknown session op {op!r}"}

    def _new_sid(self) -> str:
        self.counter += 1
        return str(self.counter)

    def _open(self, req: dict) -> str:
        ctrl, theirs = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        workdir = "/tmp"
        if not self.iso.mount:
            import tempfile

            workdir = tempfile.mkdtemp(prefix="agent-envs-session-", dir=W._SCRATCH)
            if self.iso.user == "root-drop":
                os.chown(workdir, req["uid"], req["gid"])
        if self.iso.pid:
            W._new_call_pid_namespace(self.iso)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            ctrl.close()
            os.close(out_r)
            os.close(err_r)
            _family_init(req, self.iso, self.namespace, workdir, theirs, out_w, err_w)
        theirs.close()
        os.close(out_w)
        os.close(err_w)
        family = Family(pid, None if self.iso.mount else workdir)
        session = Session(self._new_sid(), family, ctrl, out_r, err_r)
        try:
            session.attach(time.monotonic() + 30.0)
        except OSError as exc:
            detail = _drain(err_r).decode("utf-8", "replace")
            session.close()
            family.end()
            raise OSError(f"{exc}: {detail.strip()}" if detail.strip() else str(exc)) from None
        family.members.add(session.sid)
        self.sessions[session.sid] = session
        return session.sid

    def _close(self, sid: str) -> None:
        session = self.sessions.pop(sid, None)
        if session is None:
            return
        session.close()
        session.family.members.discard(sid)
        if not session.family.members:
            session.family.end()

    def _fork(self, parent: Session, req: dict) -> str:
        parent.ctrl.settimeout(30.0)
        send_message(parent.ctrl, {"op": "fork", "seed": int(req["seed"])})
        reply, fds = recv_message(parent.ctrl, REPLY_MAX_BYTES)
        if reply is not None and reply.get("forked") is False and not fds:
            raise ForkRefused(str(reply.get("error")))
        if reply is None or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            parent.lost = "the interpreter died while forking"
            raise OSError(parent.lost)
        ctrl = socket.socket(fileno=fds[0])
        child = Session(self._new_sid(), parent.family, ctrl, fds[1], fds[2])
        try:
            child.adopt(fds[3])
        except (OSError, StopIteration) as exc:
            child.close()
            raise OSError(f"cannot follow the fork: {exc}") from None
        parent.family.members.add(child.sid)
        self.sessions[child.sid] = child
        return child.sid

    def _run(self, session: Session, req: dict) -> dict:
        """Send one cell; collect its output until the interpreter reports, dies or runs out of time."""
        start = time.monotonic()
        deadline = start + float(req["timeout_s"])
        session.ctrl.settimeout(None)
        send_message(session.ctrl, {"op": "run", "code": req["code"]})  # an OSError: it just died
        captures = {fd: W.Capture(req["max_capture_bytes"]) for fd in (session.out_r, session.err_r)}
        poller = select.poll()
        for fd in (session.out_r, session.err_r, session.ctrl.fileno(), session.pidfd):
            poller.register(fd, select.POLLIN)
        status: int | None = None
        timed_out = False
        while status is None and not session.lost:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            for fd, _ in poller.poll((deadline - now) * 1000):
                if fd in captures:
                    chunk = os.read(fd, 65536)
                    if chunk:
                        captures[fd].feed(chunk)
                    else:
                        poller.unregister(fd)
                elif fd == session.pidfd:
                    session.lost = "the interpreter ended during the call (killed, or it exited)"
                elif status is None and not session.lost:
                    session.ctrl.settimeout(max(0.01, deadline - time.monotonic()))
                    try:
                        reply, fds = recv_message(session.ctrl, REPLY_MAX_BYTES)
                    except TimeoutError:
                        continue
                    except (OSError, ValueError) as exc:  # the code wrote to the socket itself
                        session.kill()
                        session.lost = f"its control channel was tampered with ({exc})"
                        break
                    for fd in fds:  # none expected: whatever the code sent is dropped
                        os.close(fd)
                    if reply is None:
                        session.lost = "the interpreter ended during the call (killed, or it exited)"
                    elif isinstance(reply.get("status"), int):
                        status = reply["status"]
        if timed_out:
            session.kill()
            session.lost = f"killed at the {float(req['timeout_s']):g} s deadline"
        for fd, capture in captures.items():  # what was written before the report (or the death)
            capture.feed(_drain(fd, limit=4 * req["max_capture_bytes"]))
        stdout, out_dropped = captures[session.out_r].text()
        stderr, err_dropped = captures[session.err_r].text()
        return {
            "stdout": stdout,
            "stderr": stderr,
            "stdout_dropped": out_dropped,
            "stderr_dropped": err_dropped,
            "exit_code": status,  # None: timed out, or died without reporting (how is not known here)
            "timed_out": timed_out,
            "setup_failed": False,
            "elapsed_s": time.monotonic() - start,
            "lost": session.lost,
        }


def _drain(fd: int, limit: int = 65536) -> bytes:
    """Whatever is readable on `fd` right now (up to `limit` bytes), without blocking."""
    out = bytearray()
    os.set_blocking(fd, False)
    try:
        while len(out) < limit:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out += chunk
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(fd, True)
    return bytes(out)
