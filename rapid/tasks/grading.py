"""Answer extraction and comparison shared by the tasks graded on a final \\boxed{} answer:
`last_boxed`, `read_number` (exactly one number and the words after it, or nothing), `parse_number`
(the number alone), `boxed_number_reward`, and `SYMBOLIC`, a time-bounded math-verify (sympy)
equivalence check that is safe in threads and worker processes."""

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
from rapid.tasks.math_answer import normalize, tokenize, unwrap_text


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
_TILDE_FIRST = re.compile(r"[^0-9~]*~")  # `~5`, `\$~5`: a tilde before the number is "about", not a space
_FIRST_GROUP = re.compile(r"[1-9][0-9]{0,2}")  # 1,234: the first group of a grouped number
_GROUP = re.compile(r"[0-9]{3}(?:\.[0-9]+)?")  # ... and each later one (a decimal part on the last only)
_UNIT_WORD = re.compile(r"[A-Za-z]+")


def read_number(answer: str) -> tuple[Fraction, str] | None:
    """(the one number `answer` is, the unit words after it) or None; never raises.

    The grammar, on the tokens of `rapid.tasks.math_answer` (after its presentation-only `normalize`:
    spacing, `$` delimiters, `\\dfrac`, thousands marks `1{,}000` `10,\\!080` `10\\,000`, a final full
    stop, `%` as the word percent), with `\\text{}` wrappers read as the words inside them:

        answer := [-] [\\$] number unit*  |  \\$ - number unit*
        number := integer | decimal | grouped | \\frac{[-]integer}{[-]integer} | integer / integer
        grouped:= 1-3 digits (`,` 3 digits)+ [. digits]       commas without spaces: `1,234.5`
        unit   := a word (letters only)

    Anything else, anywhere, gives None: a second number (`5 6`, `5 or 6`, `5-6`, `1, 000`), an operator
    or relation (`x = 5`, `5+`, `\\approx 5`, `2 \\times 10^6`), a tilde before the number, a character
    outside ASCII. The unit is returned for the caller to judge (`boxed_number_reward` takes none)."""
    if not isinstance(answer, str) or len(answer) > MAX_NUMBER_CHARS or _TILDE_FIRST.match(answer):
        return None
    tokens = tokenize(unwrap_text(re.sub(r"\\text\{([^{}]*)\}", r" \1 ", normalize(answer))).strip())
    if not tokens:
        return None
    try:
        return _read(tokens)
    except (ValueError, ZeroDivisionError, OverflowError, MemoryError):  # e.g. over int()'s digit limit
        return None


def _read(t: list) -> tuple[Fraction, str] | None:
    i, negative = 0, False
    if t[i].value == "-" and t[i].kind == "op":
        negative, i = True, i + 1
    if i < len(t) and t[i].value == "\\$":
        i += 1
        if not negative and i < len(t) and t[i].value == "-" and t[i].kind == "op":
            negative, i = True, i + 1
    if i >= len(t):
        return None
    value, i = _magnitude(t, i)
    if value is None:
        return None
    unit = t[i:]
    if not all(tok.kind == "word" and _UNIT_WORD.fullmatch(tok.value) for tok in unit):
        return None
    return (-value if negative else value), " ".join(tok.value for tok in unit)


def _int(t: list, i: int) -> tuple[int | None, int]:
    """An integer at t[i] (a sign allowed inside a fraction's braces), and the position after it."""
    sign = 1
    if i < len(t) and t[i].value == "-" and t[i].kind == "op":
        sign, i = -1, i + 1
    if i < len(t) and t[i].kind == "num" and "." not in t[i].value:
        return sign * int(t[i].value), i + 1
    return None, i


def _magnitude(t: list, i: int) -> tuple[Fraction | None, int]:
    def op(j: int, value: str, spaced: bool = True) -> bool:
        return j < len(t) and t[j].kind in ("op", "cmd") and t[j].value == value and (spaced or not t[j].space)

    if op(i, "\\frac"):  # \frac{a}{b}
        if not op(i + 1, "{"):
            return None, i
        num, j = _int(t, i + 2)
        if num is None or not op(j, "}") or not op(j + 1, "{"):
            return None, i
        den, j = _int(t, j + 2)
        if den is None or not op(j, "}") or den == 0:
            return None, i
        return Fraction(num, den), j + 1
    if i >= len(t) or t[i].kind != "num":
        return None, i
    digits, j = t[i].value, i + 1
    while op(j, ",", spaced=False) and j + 1 < len(t) and t[j + 1].kind == "num" and not t[j + 1].space:
        if not (_FIRST_GROUP.fullmatch(t[i].value) and "." not in digits and _GROUP.fullmatch(t[j + 1].value)):
            return None, i
        digits, j = digits + t[j + 1].value, j + 2
    if j == i + 1 and op(j, "/") and "." not in digits:  # a/b
        den, k = _int(t, j + 1)
        if den is None or den < 0 or den == 0:
            return None, i
        return Fraction(int(digits), den), k
    return Fraction(digits), j


def parse_number(answer: str) -> Fraction | None:
    """The number `answer` is (`read_number`), with no unit after it, else None; never raises. `\\$`
    before it and `\\text{}` around it are allowed: `\\$1,000`, `\\text{12}`, `\\frac{6}{4}`, `-0.5`."""
    read = read_number(answer)
    return read[0] if read is not None and not read[1] else None


def boxed_number_reward(completion: str, answer: str) -> float:
    """1.0 if the completion's final box (`rapid.tasks.math.final_answer`: the last one, not inside another)
    holds exactly the number `answer`, with nothing else but a leading `\\$`, else 0.0 (never raises)."""
    from rapid.tasks.math import final_answer  # math imports this module: a late import, not a cycle

    boxed = final_answer(completion) if isinstance(completion, str) else None
    got, want = parse_number(boxed) if boxed is not None else None, parse_number(answer)
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
