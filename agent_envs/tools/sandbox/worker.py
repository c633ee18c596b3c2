"""The warm fork server of the local Python sandbox, and the code runner both backends share.

This file runs as a standalone script (stdlib only; the parent imports it only for `clean_env`), in
two modes:

- ``python -I worker.py serve CONFIG_JSON``: a worker of `LocalSandbox`. It imports the preamble
  once, isolates itself (network and mount namespaces, a read-only root built from bind mounts),
  then answers length-prefixed JSON requests on stdin/stdout. Each call runs in a child forked
  before its request arrives: it enters fresh pid and mount namespaces, mounts its own /proc and a
  tmpfs working directory, sets rlimits, drops privileges and waits for the code on a pipe; the
  worker enforces the wall-clock deadline by killing the child's pid namespace, reaps everything
  after replying, and prepares the next child. Requests that carry an `op` belong to stateful
  sessions and go to `session_host.py` (one long-lived interpreter per session, forked on request).
- ``python -I worker.py once CODE [PREAMBLE_JSON]``: run CODE once in this process (the Docker
  backend runs this inside the container).

    $ python -I agent_envs/tools/sandbox/worker.py once 'x = 6*7
    x'
    42
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import errno
import gc
import importlib
import io
import json
import linecache
import os
import platform
import resource
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback

CODE_FILENAME = "<string>"

# Linux constants (sched.h, mount.h, prctl.h); Python 3.11 has no os.unshare.
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(platform.machine())

# statvfs flags whose mount bits are locked in a user namespace and must be kept on remount.
_LOCKED_FLAGS = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
EXIT_SETUP_FAILED = 125


# ----------------------------------------------------------------------------------------------
# Running code (shared by both backends)


def _echo_last_expression(tree: ast.Module) -> ast.Module:
    """REPL echo as in ARPO/ToRA: a trailing bare expression that is not a print call is printed."""
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        value = tree.body[-1].value
        is_print = (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print"
        )
        if not is_print:
            call = ast.Call(func=ast.Name(id="print", ctx=ast.Load()), args=[value], keywords=[])
            tree.body[-1] = ast.copy_location(ast.Expr(value=call), tree.body[-1])
            ast.fix_missing_locations(tree)
    return tree


def _user_traceback(exc: BaseException) -> str:
    """The traceback as `python -c` would print it, without this runner's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CODE_FILENAME:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def compile_code(code: str) -> tuple[object | None, str]:
    """Compile with the REPL echo; returns (code object, "") or (None, the error text to print)."""
    linecache.cache[CODE_FILENAME] = (len(code), None, code.splitlines(True), CODE_FILENAME)
    try:
        return compile(
            _echo_last_expression(ast.parse(code, CODE_FILENAME, "exec")), CODE_FILENAME, "exec"
        ), ""
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        return None, "".join(traceback.format_exception_only(type(exc), exc))


def run_compiled(compiled: object | None, compile_error: str, namespace: dict, keep_state: bool = False) -> int:
    """Execute compiled code in `namespace`, printing like `python -c`; returns the exit status.

    `keep_state`: a session's namespace outlives the call, so a MemoryError does not empty it."""
    status = 0
    if compiled is None:
        sys.stderr.write(compile_error)
        status = 1
    else:
        try:
            exec(compiled, namespace)
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                status = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                status = 1
        except BaseException as exc:  # the model's code failing is a result, printed like python does
            if isinstance(exc, MemoryError) and not keep_state:
                namespace.clear()  # free what the code allocated, so the traceback can be formatted
            try:
                sys.stderr.write(_user_traceback(exc))
            except BaseException:
                sys.stderr.write(f"{type(exc).__name__}\n")
            status = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return status


def run_code(code: str, namespace: dict) -> int:
    """Compile and execute `code` in this process (the Docker backend's path)."""
    return run_compiled(*compile_code(code), namespace)


def import_preamble(preamble: list[str]) -> dict:
    """Import `mod` or `mod as alias` entries; returns the globals user code starts with."""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    for entry in preamble:
        parts = entry.split()
        if len(parts) == 1:
            module, alias = parts[0], parts[0].split(".")[0]
            importlib.import_module(module)
            namespace[alias] = sys.modules[alias]
        elif len(parts) == 3 and parts[1] == "as":
            namespace[parts[2]] = importlib.import_module(parts[0])
        else:
            raise ValueError(f"preamble entry {entry!r}: expected 'module' or 'module as alias'")
    return namespace


# ----------------------------------------------------------------------------------------------
# Kernel calls


_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    ret = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ret, f"mount {source} on {target}")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def drop_bounding_set() -> None:
    """Empty the capability bounding set (needs CAP_SETPCAP; the process keeps what it has).

    Done once per worker: 41 prctl calls per call cost ~0.45 ms of each child's preparation as an
    unprivileged user; the children inherit the empty set.
    """
    last_cap = 40
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last_cap = int(f.read())
    except OSError:
        pass
    for cap in range(last_cap + 1):
        _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0)


def clear_capabilities() -> None:
    """Empty the effective, permitted and inheritable capability sets of this thread."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


# ----------------------------------------------------------------------------------------------
# Worker isolation (once per worker)


def _locked_flags(path: str) -> int:
    f_flag = os.statvfs(path).f_flag
    return sum(ms for st, ms in _LOCKED_FLAGS if f_flag & st)


def _bind_readonly(source_fd: int, locked_flags: int, target: str) -> None:
    mount(f"/proc/self/fd/{source_fd}", target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | locked_flags)


def _python_dirs() -> list[str]:
    """Directories the interpreter and its imports need, outermost first."""
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    candidates += [os.path.dirname(os.path.realpath(sys.executable))]
    candidates += [p for p in sys.path if p and os.path.isdir(p)]
    return sorted({os.path.realpath(p) for p in candidates if os.path.isdir(p)}, key=len)


UNDER_TMP: list[str] = []  # bound directories that live below /tmp (set by build_readonly_root)


def build_readonly_root(extra_binds: list[str]) -> None:
    """pivot_root into a tmpfs holding read-only binds of the system and Python directories.

    The new root hides everything else (home directories, the repository, the host's /tmp, /proc,
    /sys) and is itself read-only; per-call children mount /proc and a tmpfs /tmp on top.
    """
    if SYS_PIVOT_ROOT is None:
        raise OSError(errno.ENOSYS, f"pivot_root syscall number unknown on {platform.machine()}")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    links = [(p, os.readlink(p)) for p in SYSTEM_DIRS if os.path.islink(p)]
    binds: list[str] = []
    wanted = [p for p in SYSTEM_DIRS if os.path.isdir(p) and not os.path.islink(p)]
    for path in sorted({os.path.realpath(p) for p in [*wanted, *_python_dirs(), *extra_binds]}, key=len):
        if os.path.exists(path) and not any(path == b or path.startswith(b + "/") for b in binds):
            binds.append(path)
    # Per-call tmpfs mounts on /tmp would hide these (e.g. a checkout and its venv under /tmp):
    # children bind them again on top of their tmpfs.
    UNDER_TMP[:] = [p for p in binds if p.startswith("/tmp/")]
    # Open the sources before the new root's tmpfs covers /tmp (a source may live there).
    sources = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC), _locked_flags(path)) for path in binds]
    dev_fds = {
        d: os.open(f"/dev/{d}", os.O_PATH | os.O_CLOEXEC) for d in DEVICES if os.path.exists(f"/dev/{d}")
    }
    new_root = "/tmp"
    mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for path, link in links:
        os.symlink(link, new_root + path)
    for path, fd, locked in sources:
        target = new_root + path
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(target, exist_ok=True)
        else:
            open(target, "w").close()
        _bind_readonly(fd, locked, target)
        os.close(fd)
    os.makedirs(new_root + "/dev")
    mount("tmpfs", new_root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name, fd in dev_fds.items():
        open(f"{new_root}/dev/{name}", "w").close()
        mount(f"/proc/self/fd/{fd}", f"{new_root}/dev/{name}", None, MS_BIND)
        os.close(fd)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{new_root}/dev/{name}")
    # Read-only, or code running as the user who owns this tmpfs (an unprivileged user's own uid)
    # could leave files in /dev for the next call. The device binds on it stay writable.
    mount(None, new_root + "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    for d in ("proc", "tmp", ".oldroot"):
        os.makedirs(f"{new_root}/{d}", exist_ok=True)
    # This pid namespace's /proc, mounted while the host's is still visible: in a user namespace the
    # kernel only allows a new proc mount where a fully visible one exists (calls mount theirs on top).
    mount("proc", f"{new_root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _check(_libc.syscall(SYS_PIVOT_ROOT, new_root.encode(), f"{new_root}/.oldroot".encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.oldroot", MNT_DETACH), "umount old root")
    os.rmdir("/.oldroot")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


class Isolation:
    """What this worker achieved; reported to the parent, which warns once about what is missing."""

    def __init__(self) -> None:
        self.user = "none"  # "root-drop": setuid to an unprivileged uid; "userns": own user namespace
        self.net = False
        self.mount = False
        self.pid = False
        self.warnings: list[str] = []
        self.pidns_fd: int | None = None  # the worker's own pid namespace, to re-enter before each call

    def as_dict(self) -> dict:
        return {
            "user": self.user,
            "net": self.net,
            "mount": self.mount,
            "pid": self.pid,
            "warnings": self.warnings,
        }


def _become_namespace_init() -> None:
    """After unshare(CLONE_NEWPID): fork; the child goes on as pid 1, this process waits and exits.

    Being the init of a pid namespace owned by our own user namespace lets the worker re-enter it
    with setns and unshare a fresh pid namespace before every call, so a call costs one fork.
    """
    child = os.fork()
    if child:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _, status = os.waitpid(child, 0)
        if os.WIFSIGNALED(status):  # die the same way, so the parent can say what killed the worker
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    # And the other way round: the worker dies with the process its parent knows it by.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _new_call_pid_namespace(iso: Isolation) -> None:
    """Make the next fork pid 1 of a fresh pid namespace."""
    _check(_libc.setns(iso.pidns_fd, CLONE_NEWPID), "setns(pid)")
    unshare(CLONE_NEWPID)


def isolate_worker(config: dict) -> Isolation:
    iso = Isolation()
    uid, gid = os.geteuid(), os.getegid()
    iso.user = "root-drop" if uid == 0 else "none"
    if config.get("container"):
        # The container is the boundary (no network, read-only root, its own pid namespace, an
        # unprivileged uid), so no namespaces of our own; `reset_container` clears what a call
        # leaves behind. The parent reports the container's guarantees.
        iso.user = "container"
        return iso
    if not config.get("namespaces", True):
        iso.warnings.append(
            "namespaces disabled by configuration: only rlimits, the scrubbed environment and "
            "a temporary directory apply (network and file system stay open)"
        )
        return iso
    flags = CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
    try:
        if uid == 0:
            unshare(flags | CLONE_NEWPID)
        else:
            unshare(CLONE_NEWUSER | flags | CLONE_NEWPID)
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
            iso.user = "userns"
            drop_bounding_set()
        iso.net = iso.mount = True
    except OSError as exc:
        iso.warnings.append(
            f"cannot create network/mount/pid namespaces ({exc}): network access is NOT blocked, "
            "files outside the working directory stay writable where permissions allow, and "
            "sandboxed code can see other processes of its user"
        )
        return iso
    _become_namespace_init()
    try:
        build_readonly_root(config.get("binds", []))
    except OSError as exc:
        iso.mount = False
        iso.warnings.append(
            f"cannot build the read-only root ({exc}): files outside the working directory stay "
            "writable where permissions allow"
        )
    try:
        if not iso.mount:  # still the host's /proc, in our private mount namespace
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        iso.pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        # Probe once that a call can get its own pid namespace.
        _new_call_pid_namespace(iso)
        probe = os.fork()
        if probe == 0:
            os._exit(0 if os.getpid() == 1 else 1)
        iso.pid = os.waitpid(probe, 0)[1] == 0
    except OSError as exc:
        iso.warnings.append(f"cannot create per-call pid namespaces ({exc})")
    if not iso.pid:
        iso.warnings.append(
            "without per-call pid namespaces, code can see the worker and other processes of its "
            "user, and processes that leave their process group may survive the timeout"
        )
    return iso


# ----------------------------------------------------------------------------------------------
# One call


def clean_env(workdir: str) -> dict[str, str]:
    """The whole environment sandboxed code sees (the worker is started with it as well)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }


def _set_limits(req: dict) -> None:
    mb = 1024 * 1024
    limits = [
        (resource.RLIMIT_AS, req["memory_mb"] * mb),
        (resource.RLIMIT_CPU, int(req["timeout_s"]) + 2),
        (resource.RLIMIT_FSIZE, req["fsize_mb"] * mb),
        (resource.RLIMIT_NPROC, req["nproc"]),
        (resource.RLIMIT_NOFILE, req["nofile"]),
        (resource.RLIMIT_CORE, 0),
    ]
    for which, value in limits:
        resource.setrlimit(which, (value, value))


LINGER_S = 1.0  # how long a call's child waits to be killed after reporting its status
LIMIT_FIELDS = ("timeout_s", "memory_mb", "fsize_mb", "nproc", "nofile", "uid", "gid")
STATUS = struct.Struct(">i")


def _close_fds_except(keep: set[int]) -> None:
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def _read_message(fd: int) -> bytes | None:
    header = _read_exact(fd, 4)
    return None if header is None else _read_exact(fd, struct.unpack(">I", header)[0])


def _warm_up(namespace: dict) -> None:
    """Compile and run a throwaway snippet while waiting for the code.

    The first run after fork writes to hundreds of shared interpreter pages (reference counts,
    caches), each a copy-on-write fault; paying them here takes ~0.4 ms off every call.
    """
    compiled, _ = compile_code("_ = [1]\n_")
    with contextlib.redirect_stdout(io.StringIO()):
        run_compiled(compiled, "", dict(namespace))
    sys.stdout.write("")


def isolate_child(req: dict, iso: Isolation, workdir: str, out_fd: int, err_fd: int, keep: set[int]) -> str:
    """In a freshly forked child: its own IPC and mount namespaces, a tmpfs working directory, /proc,
    output on `out_fd`/`err_fd`, no other descriptor but `keep`, rlimits, no privileges. Returns
    the working directory (a call's child and a session family's init both start this way)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setsid()
    if iso.net:  # the worker's namespaces exist; a call's SysV IPC objects must not reach the next
        unshare(CLONE_NEWIPC | (CLONE_NEWNS if iso.mount else 0))
    if iso.mount:
        kept = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC), _locked_flags(p)) for p in UNDER_TMP]
        mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0777,size={req['fsize_mb'] + 1}m")
        for path, fd, locked in kept:  # the Python install stays visible (read-only) above the tmpfs
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "w").close()
            _bind_readonly(fd, locked, path)
            os.close(fd)
        workdir = "/tmp"
        if kept:  # keep the working directory itself empty of those mount points
            workdir = "/tmp/work"
            os.mkdir(workdir)
            os.chmod(workdir, 0o777)  # the code may run as another uid; mkdir's mode is umasked
    if iso.pid and iso.mount:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(workdir)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    _close_fds_except(keep)
    _set_limits(req)
    if iso.user == "root-drop":
        uid, gid = req["uid"], req["gid"]
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    elif iso.user == "userns":
        clear_capabilities()  # the worker already emptied the bounding set
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if workdir != "/tmp":
        os.environ.update(HOME=workdir, TMPDIR=workdir)
    return workdir


def _child(req: dict, iso: Isolation, namespace: dict, workdir: str, fds: dict[str, int]) -> None:
    """Pid 1 of the call's pid namespace (or a plain child): set up, drop privileges, wait for the
    code, run it. Never returns."""
    try:
        isolate_child(req, iso, workdir, fds["out"], fds["err"], {fds["code"], fds["status"]})
    except BaseException as exc:
        os.write(2, f"sandbox setup failed: {exc}\n".encode())
        os._exit(EXIT_SETUP_FAILED)
    status = 1
    try:
        _warm_up(namespace)
        message = _read_message(fds["code"])
        os.close(fds["code"])
        if message is None:  # the worker discarded this child unused
            os._exit(0)
        status = run_compiled(*compile_code(message.decode("utf-8", "surrogatepass")), dict(namespace))
        # Report before exiting: tearing down this process and its namespaces takes longer than the
        # call itself and need not delay the reply. The code could write here too, but it can only
        # misreport its own exit status, which it controls anyway.
        os.close(1)
        os.close(2)
        os.write(fds["status"], STATUS.pack(status & 0xFF))
        # Then wait to be killed (the worker kills a call right after its reply): exiting now
        # would tear down the namespaces while the worker wakes to read the status, and on a
        # 2-core machine that delayed the reply by 0.27 ms, a third of a call. Bounded, in case.
        select.select([], [], [], LINGER_S)
    finally:
        os._exit(status)  # never return into the worker's loop


class Capture:
    """Keeps the first and last `limit` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            del self.tail[: max(0, len(self.tail) - self.limit)]

    def text(self) -> tuple[str, int]:
        """Decoded text, and how many bytes were dropped from the middle."""
        dropped = self.total - len(self.head) - len(self.tail)
        return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace"), dropped


class Call:
    """One call's child, forked and isolated before its request arrives (the worker prepares the
    next one right after replying), so a call costs a pipe write and the code's own run time.
    """

    def __init__(self, req: dict, iso: Isolation, namespace: dict) -> None:
        self.limits = tuple(req[k] for k in LIMIT_FIELDS)
        self.iso = iso
        self.workdir = "/tmp" if iso.mount else tempfile.mkdtemp(prefix="agent-envs-sandbox-", dir=_SCRATCH)
        if not iso.mount and iso.user == "root-drop":
            os.chown(self.workdir, req["uid"], req["gid"])
        code_r, self.code_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.status_r, status_w = os.pipe()
        if iso.pid:
            _new_call_pid_namespace(iso)
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            fds = {"code": code_r, "out": out_w, "err": err_w, "status": status_w}
            _child(req, iso, namespace, self.workdir, fds)
        for fd in (code_r, out_w, err_w, status_w):
            os.close(fd)
        self.pidfd = os.pidfd_open(self.pid)
        self.wait_status: int | None = None

    def run(self, req: dict) -> dict:
        """Send the code; collect output until the child reports (or dies) or the deadline passes."""
        start = time.monotonic()
        deadline = start + req["timeout_s"]
        data = req["code"].encode("utf-8", "surrogatepass")
        with contextlib.suppress(BrokenPipeError):  # the child died in set-up; its stderr says why
            _write_all(self.code_w, struct.pack(">I", len(data)) + data)
        os.close(self.code_w)
        self.code_w = -1
        captures = {
            self.out_r: Capture(req["max_capture_bytes"]),
            self.err_r: Capture(req["max_capture_bytes"]),
        }
        open_fds = {self.out_r, self.err_r}
        poller = select.poll()
        for fd in (self.out_r, self.err_r, self.status_r, self.pidfd):
            poller.register(fd, select.POLLIN)
        status: int | None = None
        exited = timed_out = False
        drain_deadline = deadline
        while open_fds or not (exited or status is not None):
            now = time.monotonic()
            if now >= drain_deadline:
                timed_out = not (exited or status is not None)
                break
            for fd, _ in poller.poll((drain_deadline - now) * 1000):
                if fd == self.status_r:
                    report = os.read(fd, STATUS.size)
                    poller.unregister(fd)
                    if len(report) == STATUS.size:
                        status = STATUS.unpack(report)[0]
                elif fd == self.pidfd:
                    exited = True
                    poller.unregister(fd)
                else:
                    chunk = os.read(fd, 65536)
                    if chunk:
                        captures[fd].feed(chunk)
                        continue
                    poller.unregister(fd)
                    open_fds.discard(fd)
                    continue
                # Once the code has ended, its pid namespace dies with it; without one, a background
                # process may hold the pipes: give it a short grace, not the whole deadline.
                drain_deadline = min(deadline, time.monotonic() + 0.2)
        elapsed = time.monotonic() - start
        if timed_out or open_fds:
            self.kill()
        if status is None:  # killed, timed out, or exited without reporting: the kernel knows
            status = os.waitstatus_to_exitcode(self.reap())
        stdout, out_dropped = captures[self.out_r].text()
        stderr, err_dropped = captures[self.err_r].text()
        return {
            "stdout": stdout,
            "stderr": stderr,
            "stdout_dropped": out_dropped,
            "stderr_dropped": err_dropped,
            "exit_code": None if timed_out else status,  # negative: killed by that signal
            "timed_out": timed_out,
            "setup_failed": status == EXIT_SETUP_FAILED and stderr.startswith("sandbox setup failed"),
            "elapsed_s": elapsed,
        }

    def kill(self) -> None:
        # Killing the pid namespace's init kills every process in it; the group kill covers the
        # no-namespace fallback.
        for kill, target in ((os.kill, self.pid), (os.killpg, self.pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(target, signal.SIGKILL)

    def reap(self) -> int:
        if self.wait_status is None:
            self.wait_status = os.waitpid(self.pid, 0)[1]
        return self.wait_status

    def close(self) -> None:
        """Kill (a child still waiting for code exits on EOF anyway), reap, free its resources."""
        self.kill()
        self.reap()
        for fd in (self.code_w, self.out_r, self.err_r, self.status_r, self.pidfd):
            if fd >= 0:
                os.close(fd)
        if not self.iso.mount:
            shutil.rmtree(self.workdir, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# Serving


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def send(fd: int, message: dict) -> None:
    data = json.dumps(message).encode()
    _write_all(fd, struct.pack(">I", len(data)) + data)


# Without a mount namespace each call works in its own directory under this one, which the
# worker's host removes with the worker: a worker killed with a call prepared leaves nothing.
_SCRATCH: str | None = None


def serve(config: dict) -> None:
    global _SCRATCH
    # The protocol owns fds 0/1; anything printed by imports goes to stderr instead.
    channel_in, channel_out = os.dup(0), os.dup(1)
    os.set_inheritable(channel_in, False)
    os.set_inheritable(channel_out, False)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    # Children reuse these objects on their own fds 1 and 2 (the buffers are empty at fork).
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="utf-8", errors="backslashreplace")
    try:
        namespace = import_preamble(config.get("preamble", []))
    except Exception as exc:
        send(channel_out, {"ready": False, "error": f"preamble import failed: {type(exc).__name__}: {exc}"})
        return
    # Stateful sessions (session_host.py) are loaded now: the isolated root may not show this directory.
    sessions = _load_session_host() if not config.get("container") else None
    iso = isolate_worker(config)
    if sessions is not None:
        sessions = sessions.SessionHost(sys.modules[__name__], iso, namespace)
    # Objects that exist now are never collected: children then do not touch (copy) their pages.
    gc.collect()
    gc.freeze()
    hello = {"ready": True, "pid": os.getpid(), "isolation": iso.as_dict()}
    if not iso.mount and iso.user != "container":  # a container's /tmp is emptied by reset_container
        _SCRATCH = hello["scratch"] = tempfile.mkdtemp(prefix="agent-envs-sandbox-")
        os.chmod(_SCRATCH, 0o711)  # a call's code may run as another uid: it may pass, not list
    send(channel_out, hello)
    prepared: list[Call] = []  # oldest first: the likeliest to have finished its set-up
    ended: dict[int, Call] = {}  # by pidfd: killed, reaped while waiting for the next request
    last: dict | None = None  # the limits of the last request, which the next one likely shares
    while True:
        message = _next_request(channel_in, ended, prepared, last, iso, namespace)
        if message is None:  # the parent closed the channel or died
            return
        req = json.loads(message or b"{}")
        if "op" in req:  # a request of a stateful session (session_host.py)
            send(channel_out, sessions.handle(req) if sessions else {"error": "no sessions in containers"})
            continue
        limits = tuple(req[k] for k in LIMIT_FIELDS)
        call = None
        try:
            # Background processes of an earlier call, still dying, count against this call's
            # RLIMIT_NPROC (same uid): wait for them. Usually they were reaped while idle.
            while ended:
                ended.popitem()[1].close()
            for stale in [c for c in prepared if c.limits != limits]:  # a per-call timeout override
                prepared.remove(stale)
                stale.close()
            call = prepared.pop(0) if prepared else Call(req, iso, namespace)
            reply = call.run(req)
        except OSError as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        send(channel_out, reply)
        if call is not None:
            call.kill()
            ended[call.pidfd] = call
        if config.get("container"):
            reset_container()
            while prepared:  # the reset killed them too
                prepared.pop().close()
        last = req
        if not prepared:
            with contextlib.suppress(OSError):  # a failure shows again, and is reported, on the next call
                _prepare(req, iso, namespace, prepared)


def _load_session_host() -> object:
    """session_host.py, beside this file (run with -I, so its directory is not on sys.path)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "session_host.py")
    spec = importlib.util.spec_from_file_location("agent_envs_session_host", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reset_container(scratch: tuple[str, ...] = ("/tmp", "/dev/shm")) -> None:
    """Between two calls in a container: kill every process the call left (all but this worker and
    the container's init, which reaps them) and empty the writable scratch space, so no state
    passes from one call to the next."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(-1, signal.SIGKILL)
    for root in scratch:
        with contextlib.suppress(OSError):
            for entry in os.scandir(root):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


# Children kept prepared per worker. A call that leaves none gets the next one forked right after
# its reply; the stock is topped up once the worker has been idle for STOCK_DELAY_S (the last
# call's teardown is usually done by then, so the two do not compete for the CPU, and the fork
# does not compete with the caller reading the reply), so a call arriving right after another
# still finds a child ready.
PREPARED_CHILDREN = 2
STOCK_DELAY_S = 0.002


def _prepare(req: dict, iso: Isolation, namespace: dict, prepared: list[Call]) -> None:
    """Fork and isolate the next call's child, then pre-fault the worker's reply path.

    After a fork every page of the worker is shared copy-on-write with the child, and the first
    write to each costs a fault. Left to the next request, decoding it, collecting the output and
    encoding the reply paid them: 0.05 ms of a 0.8 ms call, measured. Running the same steps on a
    copy of the last request while idle pays them off the clock.
    """
    prepared.append(Call(req, iso, namespace))
    json.loads(json.dumps(req).encode())
    capture = Capture(req["max_capture_bytes"])
    capture.feed(b"0\n")
    stdout, dropped = capture.text()
    json.dumps({"stdout": stdout, "stderr": "", "stdout_dropped": dropped, "exit_code": 0, "timed_out": False,
                "elapsed_s": time.monotonic()}).encode()


def _next_request(
    channel_in: int,
    ended: dict[int, Call],
    prepared: list[Call],
    last: dict | None,
    iso: Isolation,
    namespace: dict,
) -> bytes | None:
    """Wait for the next request. Meanwhile reap ended calls as their teardown (namespaces, memory)
    completes, which takes about as long as a call, and top up the prepared children."""
    poller = select.poll()
    for fd in (channel_in, *ended):
        poller.register(fd, select.POLLIN)
    while True:
        stock = last is not None and len(prepared) < PREPARED_CHILDREN
        events = poller.poll(STOCK_DELAY_S * 1000 if stock else None)
        if not events and stock:
            try:
                _prepare(last, iso, namespace, prepared)
            except OSError:
                last = None  # the next call prepares its own child and reports the failure
        for fd, _ in events:
            if fd == channel_in:
                return _read_message(channel_in)
            poller.unregister(fd)
            ended.pop(fd).close()


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "serve":
        serve(json.loads(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "once":
        preamble = json.loads(sys.argv[3]) if len(sys.argv) > 3 else []
        sys.exit(run_code(sys.argv[2], import_preamble(preamble)))
    else:
        sys.exit("usage: worker.py serve CONFIG_JSON | once CODE [PREAMBLE_JSON]")


if __name__ == "__main__":
    main()
