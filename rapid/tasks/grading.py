"""Answer extraction and comparison shared by the tasks graded on a final \\boxed{} answer:
`last_boxed`, `parse_number` (exact numbers as fractions), `boxed_number_reward`, and `SYMBOLIC`,
a time-bounded math-verify (sympy) equivalence check that is safe in threads and worker processes."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from fractions import Fraction

from rapid.config import ConfigError


class GradingError(RuntimeError):
    """The checker could not reach a verdict (it ran out of time, or its sandbox did not start): the
    completion scores 0 and `rapid.rewards.score` counts it in train/reward_failures."""


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) in `text`, braces balanced, or of a last
    `\\boxed 9` (one token, as in two MATH reference solutions); None if absent or unbalanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    bare = text.rfind("\\boxed ")
    if bare > start:
        token = re.match(r"\\boxed +([^\s${}]+)", text[bare : bare + 200])
        return token.group(1).rstrip(".,") if token else None
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


MAX_NUMBER_CHARS = 4000  # longer text is no number here (int() refuses over 4,300 digits anyway)
_STRIP = re.compile(r"\\(?:text|mathrm)\{([^{}]*)\}")
_GROUPED = re.compile(r"(?<![\d.,])(\d{1,3})((?:,\d{3})+)(?![\d,])")  # 1,234,567: one number
_PLAIN = re.compile(r"-?\d+(\.\d+)?(/-?\d+)?")
_FRAC = re.compile(r"(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}")


def parse_number(answer: str) -> Fraction | None:
    """A number written as an integer, decimal or simple fraction (\\frac{a}{b}, a/b), else None; never
    raises. `$`, `\\text{}` and a trailing `.` are ignored, and so are spaces around the number but not
    inside it (`1 2` is two numbers, not 12). Commas group thousands only in whole groups of three
    with nothing between (`1,000`, `1{,}000`, `1,\\!000`); `1, 000` is a list of two numbers."""
    if not isinstance(answer, str) or len(answer) > MAX_NUMBER_CHARS:
        return None
    s = _STRIP.sub(r"\1", answer).replace("\\$", "").replace("$", "").replace("\\!", "").replace("{,}", ",")
    s = s.strip().rstrip(".").strip()
    s = _GROUPED.sub(lambda m: m.group(1) + m.group(2).replace(",", ""), s)
    try:
        frac = _FRAC.fullmatch(s)
        if frac:
            sign, num, den = frac.groups()
            return None if int(den) == 0 else Fraction(int(num), int(den)) * (-1 if sign else 1)
        return Fraction(s) if _PLAIN.fullmatch(s) else None
    except (ValueError, ZeroDivisionError, OverflowError, MemoryError):  # e.g. over int()'s digit limit
        return None


def boxed_number_reward(completion: str, answer: str) -> float:
    """1.0 if the last \\boxed{} of `completion` holds a number equal to `answer`, else 0.0 (never raises)."""
    boxed = last_boxed(completion) if isinstance(completion, str) else None
    if boxed is None:
        return 0.0
    got, want = parse_number(boxed), parse_number(answer)
    return float(got is not None and want is not None and got == want)


# --- Symbolic equivalence (math-verify, i.e. sympy), bounded in time --------------------------------
# math-verify's own timeouts use signal.alarm, which works only in the main thread of a process. We
# disable them and run the check in a long-lived child interpreter instead: one per process, started
# on first use, fed one JSON line per check; a check that overruns its time kills the child (the next
# check starts a fresh one) and raises GradingError (scored 0, counted in train/reward_failures). A
# subprocess (not multiprocessing) is used so that this works in threads, in daemonic pool workers and
# after fork. The child stays in its parent's process group (a reward worker is killed with its
# group) and asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG), so that a sympy
# computation never outlives the grader: it may hold the GIL for minutes (huge powers, factorials).
# Its address space is limited (RLIMIT_AS, `memory_limit_bytes`): a power like 10^{10^{10}} raises
# MemoryError there (a verdict of "not equal") instead of taking the machine's memory. Numbers are
# compared to 60 digits, not math-verify's default of rounding floats to 6 places (the MATH task
# passes decimals as exact fractions anyway), and a match that math-verify finds numerically is
# confirmed by sympy's `equals` (a difference of 10^-100 is not 0).
_SYMBOLIC_SERVER = r"""
import json, logging, os, resource, sys
limit = int(sys.argv[2])
if limit > 0:                                               # sympy may not hold more address space than this
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, 9)          # PR_SET_PDEATHSIG, SIGKILL
except Exception:  # not Linux: the parent's kill on timeout and at exit still applies
    pass
if os.getppid() != int(sys.argv[1]):                        # the parent died before the line above
    sys.exit(0)
logging.disable(logging.CRITICAL)
from math_verify import parse, verify
from sympy import Expr, MatrixBase, Tuple


def exact(gold, pred):
    # math-verify accepts two values whose difference evaluates to 0 at its working precision, so
    # sqrt(2) + 10^-100 passes for sqrt(2); sympy's `equals` tells such a difference from a true 0
    if isinstance(gold, Tuple) and isinstance(pred, Tuple) or isinstance(gold, MatrixBase) and isinstance(pred, MatrixBase):
        g, p = list(gold), list(pred)
        return len(g) == len(p) and all(exact(a, b) for a, b in zip(g, p))
    if isinstance(gold, Expr) and isinstance(pred, Expr):
        return (gold - pred).equals(0) is not False
    return True


sys.stdout.write("ready\n"); sys.stdout.flush()
for line in sys.stdin:
    gold, pred = json.loads(line)
    try:
        gold, pred = parse(gold, parsing_timeout=None), parse(pred, parsing_timeout=None)
        ok = verify(gold, pred, float_rounding=60, numeric_precision=60, timeout_seconds=None)
        ok = ok and (not gold or not pred or exact(gold[0], pred[0]))
    except (Exception, MemoryError, RecursionError):
        ok = False
    sys.stdout.write("1\n" if ok else "0\n"); sys.stdout.flush()
"""


MEMORY_LIMIT_BYTES = 2 << 30  # the checker's address space (it peaked at ~70 MB over the answer table)


class SymbolicChecker:
    """`equal(gold, pred, timeout_s)`: math-verify's verdict on two LaTeX answers; GradingError when
    it takes longer than `timeout_s` seconds."""

    def __init__(self, startup_timeout_s: float = 120.0, memory_limit_bytes: int = MEMORY_LIMIT_BYTES):
        self.startup_timeout_s = startup_timeout_s
        self.memory_limit_bytes = memory_limit_bytes
        self._proc: subprocess.Popen | None = None
        self._pid = 0  # the process that started self._proc (reset after fork)
        self._lock = threading.Lock()
        self.timeouts = 0  # checks that ran out of time in this process

    def equal(self, gold: str, pred: str, timeout_s: float) -> bool:
        with self._lock:
            proc = self._server()
            try:
                os.write(proc.stdin.fileno(), (json.dumps([f"${gold}$", f"${pred}$"]) + "\n").encode())
                line = self._readline(proc, timeout_s)
            except OSError:
                line = None
            if line is None:
                self.timeouts += 1
                self.close()
                raise GradingError(f"math-verify took over {timeout_s:g} s")
            return line == "1"

    def close(self) -> None:
        if self._proc is not None and self._pid == os.getpid():
            try:
                self._proc.kill()
                self._proc.wait(timeout=30)
                self._proc.stdin.close()
                self._proc.stdout.close()
            except Exception:  # already gone: nothing to clean up
                pass
        self._proc = None

    def _server(self) -> subprocess.Popen:
        if self._proc is not None and self._pid == os.getpid() and self._proc.poll() is None:
            return self._proc
        if importlib.util.find_spec("math_verify") is None:
            raise ConfigError("symbolic answer checking needs math-verify: pip install math-verify")
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _SYMBOLIC_SERVER, str(os.getpid()), str(self.memory_limit_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._pid = os.getpid()
        if self._readline(self._proc, self.startup_timeout_s) != "ready":
            self.close()
            raise GradingError("the math-verify checker process did not start")
        return self._proc

    @staticmethod
    def _readline(proc: subprocess.Popen, timeout_s: float) -> str | None:
        """One line from the child's stdout within `timeout_s` seconds, else None."""
        fd, data, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout_s
        while not data.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 64)
            if not chunk:
                return None
            data += chunk
        return data.decode().strip()


SYMBOLIC = SymbolicChecker()
atexit.register(SYMBOLIC.close)
