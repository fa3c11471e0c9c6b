"""Run untrusted Python (model-written code) in a separate, locked-down process: one function here,
`call_function(code, entry_point, inputs, limits)`, which returns the function's outputs for the
inputs. Comparing outputs with expected values happens in the caller, outside the sandbox, and the
expected values never enter it: a program can only score by computing the right outputs.

What is enforced, outermost first (Linux):

* a fresh `python -I` interpreter (no environment variables, no user site, a minimal env) in a
  fresh temporary directory, removed afterwards; stdin is empty;
* `unshare` namespaces when the machine allows them (probed once per process): a new network
  namespace (no network at all) and a new PID namespace (the program sees only itself:
  `os.getppid()` is 0, `kill(-1)` reaches nothing outside, and every process it starts dies
  with it); when run as root and the interpreter is readable by `nobody`, uid/gid nobody as well.
  `SANDBOX_MODE` says which of these were available;
* its own session and process group, killed with SIGKILL when the call ends, timed out or not;
* resource limits set by the driver before the program runs: RLIMIT_CPU, RLIMIT_AS (memory),
  RLIMIT_FSIZE (largest file written, stdout/stderr included), RLIMIT_NPROC (0: no new processes,
  not enforced for root), RLIMIT_CORE 0; a wall-clock timeout in the parent;
* an audit hook (which Python code cannot remove) refusing sockets, fork/exec/subprocess, signals,
  ctypes, and creating/changing/deleting files outside the temporary directory. This is a guard
  against accidents and naive attacks, not a boundary: code in the same interpreter can subvert
  it (e.g. by patching the modules it uses). The boundaries are the process, namespaces and limits;
* results travel on a dedicated pipe (not stdout), one tagged-JSON line per input plus a final
  `done` line (`encode`/`decode`: tuples, sets, complex, nan/inf, bytes, non-string dict keys;
  only exact built-in types, so an object with a rigged `__eq__` cannot be sent). Missing,
  extra or malformed lines make the whole run a failure.

Not enforced: reading files the user may read (e.g. the benchmark data). Without namespaces, the
network is closed only by the audit hook.
"""
from __future__ import annotations

import functools
import inspect
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0       # wall-clock seconds for the whole run (start-up included)
    memory_mb: int = 1024         # RLIMIT_AS
    file_mb: int = 16             # RLIMIT_FSIZE: largest file it may write (its stdout/stderr too)
    results_mb: int = 64          # the most result bytes read back; more is a failure


@dataclass
class RunResult:
    status: str                   # ok | timeout | crashed | bad_results | results_too_large | setup_error
    outputs: list | None          # per input: ("ok", value) or ("error", exception name); None unless ok
    log: str = ""                 # the last 2 kB of the program's stdout/stderr


# --- tagged JSON: used by the driver inside the sandbox and by the parent (source shared) -----------
def encode(x, depth=0):
    """A JSON-able form of a value made of built-in types; TypeError for anything else (scalars must
    be exactly int/float/str/bool/complex/bytes/None)."""
    if depth > 200:
        raise TypeError("value nested too deeply")
    t = type(x)
    if x is None or t is bool or t is int or t is str:
        return x
    if t is float:
        return x if x == x and x not in (float("inf"), float("-inf")) else {"float": repr(x)}
    # Containers: subclasses (Counter, namedtuple, ...) travel as their base type, read through the
    # base type's own methods, so only data crosses, never behaviour such as a rigged __eq__.
    if isinstance(x, list):
        return [encode(v, depth + 1) for v in list.__iter__(x)]
    for base in (tuple, set, frozenset):
        if isinstance(x, base):
            return {base.__name__: [encode(v, depth + 1) for v in base.__iter__(x)]}
    if isinstance(x, dict):
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(x)]}
    if t is complex:
        return {"complex": [encode(x.real), encode(x.imag)]}
    if t is bytes:
        return {"bytes": x.hex()}
    raise TypeError(f"cannot send a {t.__name__}")


def decode(x):
    """The value `encode` was given; ValueError for anything `encode` cannot produce."""
    t = type(x)
    if x is None or t in (bool, int, str):
        return x
    if t is float:
        return x
    if t is list:
        return [decode(v) for v in x]
    if t is dict and len(x) == 1:
        (tag, v), = x.items()
        if tag == "float" and v in ("nan", "inf", "-inf"):
            return float(v)
        if tag in ("tuple", "set", "frozenset") and type(v) is list:
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](decode(i) for i in v)
        if tag == "dict" and type(v) is list and all(type(p) is list and len(p) == 2 for p in v):
            return {decode(k): decode(val) for k, val in v}
        if tag == "complex" and type(v) is list and len(v) == 2:
            re_, im = decode(v[0]), decode(v[1])
            if type(re_) is float and type(im) is float:
                return complex(re_, im)
        if tag == "bytes" and type(v) is str:
            return bytes.fromhex(v)
    raise ValueError(f"not a tagged value: {str(x)[:80]}")


# --- the driver: runs inside the sandbox, trusted until it hands over to the program -----------------
def _driver(results_fd, root, cpu_s, memory_mb, file_mb):
    import copy
    import json
    import os
    import resource
    import sys

    for limit, value in ((resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)), (resource.RLIMIT_CORE, (0, 0)),
                         (resource.RLIMIT_AS, (memory_mb << 20,) * 2), (resource.RLIMIT_FSIZE, (file_mb << 20,) * 2),
                         (resource.RLIMIT_NPROC, (0, 0))):
        resource.setrlimit(limit, value)
    with open("job.json") as f:
        job = json.load(f)
    os.remove("job.json")
    inputs = [decode(x) for x in job["inputs"]]
    write, dumps, deepcopy, transform = os.write, json.dumps, copy.deepcopy, job["transform"]

    def emit(obj):
        data = (dumps(obj) + "\n").encode()
        while data:
            data = data[write(results_fd, data):]

    sys.addaudithook(_audit_hook(root))
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(job["code"], "<candidate>", "exec"), namespace)
        fn = namespace[job["entry_point"]]
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: the program does not get to stop us
        emit({"setup_error": type(e).__name__ if isinstance(type(e).__name__, str) else "?"})
        return
    for args in inputs:
        try:
            out = fn(*deepcopy(args))
            if transform == "is_not_none":
                out = out is not None
            elif transform == "bool_or_not_none":
                out = out if type(out) is bool else out is not None
            item = {"ok": encode(out)}
        except BaseException as e:
            name = type(e).__name__
            item = {"error": name if type(name) is str else "?"}
        emit(item)
    emit({"done": len(inputs)})


def _audit_hook(root):
    import os

    refused = frozenset({
        "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "os.fork", "os.forkpty",
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen", "os.kill", "os.killpg",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "os.setuid", "os.chroot", "resource.setrlimit",
        "resource.prlimit", "sys.remote_exec"})
    path_events = frozenset({
        "os.remove", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
        "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"})
    modules = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "pty", "multiprocessing", "_multiprocessing",
                         "socket", "_socket", "signal", "_signal"})
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    realpath, isdir = os.path.realpath, os.path.isdir

    def outside(path):
        if isinstance(path, int):
            return False
        p = realpath(os.fsdecode(path))
        return p != root and not p.startswith(root + os.sep)

    def hook(event, args):
        if event in refused:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and str(args[0]).split(".")[0] in modules:
            raise ImportError(f"sandbox: import {args[0]} is not allowed")
        if event == "open" and args[0] is not None:
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & writes)
            if (writing or isdir(os.fsdecode(path) if not isinstance(path, int) else ".")) and outside(path):
                raise PermissionError("sandbox: only the working directory may be written")
        if event in path_events and any(outside(a) for a in args if isinstance(a, (str, bytes, os.PathLike))):
            raise PermissionError(f"sandbox: {event} outside the working directory is not allowed")
    return hook


@functools.cache
def _driver_source() -> str:
    parts = [inspect.getsource(f) for f in (encode, decode, _audit_hook, _driver)]
    return "\n".join(parts) + "\nimport sys\n_driver(int(sys.argv[1]), sys.argv[2], *map(int, sys.argv[3:6]))\n"


# --- the parent side ----------------------------------------------------------------------------------
_NOBODY = 65534


@functools.cache
def sandbox_prefix() -> tuple[str, ...]:
    """The command prefix that isolates the child best on this machine (probed once, then cached)."""
    unshare = shutil.which("unshare")
    candidates = []
    if unshare:
        ns = (unshare, "--pid", "--net", "--fork", "--kill-child")
        if os.geteuid() == 0:
            candidates += [ns + ("--setuid", str(_NOBODY), "--setgid", str(_NOBODY)), ns]
        else:
            candidates += [ns + ("--user", "--map-root-user")]
    for prefix in candidates:
        try:
            with tempfile.TemporaryDirectory() as tmp:
                if "--setuid" in prefix:
                    os.chown(tmp, _NOBODY, _NOBODY)
                ok = subprocess.run(prefix + (sys.executable, "-I", "-c", "open('probe', 'w')"), cwd=tmp,
                                    stdin=subprocess.DEVNULL, capture_output=True, timeout=30).returncode == 0
            if ok:
                return prefix
        except (OSError, subprocess.SubprocessError):
            pass
    return ()


def sandbox_mode() -> str:
    """In words: which isolation `call_function` gets here."""
    prefix = sandbox_prefix()
    if not prefix:
        return "process + rlimits + audit hook (no namespaces: unshare unavailable)"
    return ("pid+net namespaces" + (", uid nobody" if "--setuid" in prefix else "")
            + (", user namespace" if "--user" in prefix else "") + " + rlimits + audit hook")


def call_function(code: str, entry_point: str, inputs: list[list], limits: Limits = Limits(),
                  transform: str | None = None) -> RunResult:
    """Define `code` in a sandboxed interpreter and call `entry_point(*args)` for every args in
    `inputs` (each call gets a fresh copy). Never raises for anything the program does.
    `transform` is applied to each output before it is sent: None, "is_not_none" (send
    `out is not None`) or "bool_or_not_none" (a bool as is, anything else as `out is not None`)."""
    prefix = sandbox_prefix()
    root = os.path.realpath(tempfile.mkdtemp(prefix="rapid-sandbox-"))
    read_fd = write_fd = -1
    try:
        with open(os.path.join(root, "job.json"), "w") as f:
            json.dump({"code": code, "entry_point": entry_point, "transform": transform,
                       "inputs": [encode(list(a)) for a in inputs]}, f)
        if "--setuid" in prefix:
            for path in (root, os.path.join(root, "job.json")):
                os.chown(path, _NOBODY, _NOBODY)
        read_fd, write_fd = os.pipe()
        cpu_s = math.ceil(limits.timeout_s) + 1
        argv = [*prefix, sys.executable, "-I", "-c", _driver_source(), str(write_fd), root, str(cpu_s),
                str(limits.memory_mb), str(limits.file_mb)]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        with open(os.path.join(root, "output.log"), "wb") as log:
            proc = subprocess.Popen(argv, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        write_fd = -1
        try:
            done = (json.dumps({"done": len(inputs)}) + "\n").encode()     # the driver's last line
            data, status = _read_results(read_fd, limits, time.monotonic() + limits.timeout_s, done)
            if status == "ok":
                try:
                    proc.wait(timeout=max(0.5, limits.timeout_s / 10))
                except subprocess.TimeoutExpired:
                    pass                                 # results are complete; its exit does not matter
        finally:
            _kill_group(proc)
            if not prefix:
                _kill_leftovers(root)
        outputs, status = _parse(data, len(inputs)) if status == "ok" else (None, status)
        return RunResult(status, outputs, _tail(os.path.join(root, "output.log")))
    finally:
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(root, ignore_errors=True)


def _read_results(fd: int, limits: Limits, deadline: float, done: bytes) -> tuple[bytes, str]:
    """What is written to the results pipe until it closes or ends with the `done` line (children
    may hold the pipe open), within the deadline and the size cap."""
    chunks, size, cap = [], 0, limits.results_mb << 20
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return b"", "timeout"
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks), "ok"
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                return b"", "results_too_large"
            if chunk.endswith(done) or b"".join(chunks[-2:]).endswith(done):
                return b"".join(chunks), "ok"


def _parse(data: bytes, n: int) -> tuple[list | None, str]:
    """Per-input outcomes from the results lines; exactly n items and then `done: n`, or a failure."""
    try:
        lines = [json.loads(line) for line in data.split(b"\n") if line]
    except (ValueError, RecursionError):                 # bad UTF-8 or JSON
        return None, "bad_results"
    if len(lines) == 1 and isinstance(lines[0], dict) and "setup_error" in lines[0]:
        return None, "setup_error"
    if not lines or lines[-1] != {"done": n}:
        return None, "crashed"                          # exited, was killed or closed the pipe early
    outputs = []
    for item in lines[:-1]:
        if not (isinstance(item, dict) and len(item) == 1 and ("ok" in item or "error" in item)):
            return None, "bad_results"
        if "error" in item:
            outputs.append(("error", str(item["error"])))
            continue
        try:
            outputs.append(("ok", decode(item["ok"])))
        except (ValueError, TypeError, RecursionError):
            return None, "bad_results"
    return (outputs, "ok") if len(outputs) == n else (None, "bad_results")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)                 # its session's group: pid == pgid
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _kill_leftovers(root: str) -> None:
    """Without a PID namespace, children that left the process group are found by the sandbox
    directory in their command line (every copy of the driver carries it) and killed."""
    marker = root.encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def _tail(path: str, n: int = 2048) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
