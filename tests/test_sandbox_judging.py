"""Judging an MBPP+ answer compares numbers with numbers: nothing passes by numpy broadcasting or by
an empty array standing for a number, and comparing costs linear time in the values' sizes, also for
values the program returns itself (hash-colliding elements for the set-equality tasks). Correct
answers in legitimate forms (numpy scalars, arrays of the right shape, lists for tuples where EvalPlus
allows them) still score."""

import time

import numpy as np
import pytest

from rapid.tasks import mbpp_plus as task
from tests.test_mbpp_plus import bwrap, fenced, fresh_cache, records_by_id  # noqa: F401 (fixtures)

P = 2**61 - 1  # every multiple hashes to 0


# --- pure comparison ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "out, exp",
    [
        ((([np.empty((0, 1))]), [np.empty((0, 1))]), (1.0, 0.5)),  # the answer
        ((np.empty((0, 1)), np.empty((0, 1))), (1.0, 0.5)),  # bare empty arrays
        ([np.zeros((1, 0)), np.zeros((1, 0)), np.zeros((1, 0))], [1.5, 2.5, 3.5]),
        ([np.full((2, 3), 1.5)], [1.5]),  # a filled array broadcast against one float
        ((np.float64(1.0), np.array([0.5, 0.5])), (1.0, 0.5)),  # an array where a number stands
        ([[], []], [1.5, 2.5]),  # empty lists for numbers
        ([(), ()], [1.5, 2.5]),
        ([[1.5], [2.5]], [1.5, 2.5]),  # one-element lists for numbers
        (np.array([[2.5]]), 2.5),  # a 2-d array for a float
        (np.array([2.5]), 2.5),  # a 1-element array for a float
        (np.array([[5]]), 5),  # ... or for an int (exact path)
        (np.array([[7]]), [7]),  # an extra axis
        (np.empty(0), 3),  # empty array for a number
        ([np.empty(0)], [3]),
        (np.float64(2.5), [2.5]),  # a numpy scalar broadcast against a list
        ({"a": np.empty((0, 1))}, {"a": 2.5}),  # inside a dict
        ([1.0, "2.0"], [1.0, 2.0]),  # a string for a number
        ([1.0, None], [1.0, 2.0]),
        ([1.0, 2.0 + 1e-9j], [1.0, 2.0]),  # a complex for a real
        ((1.0, (2.0, 3.0)), (1.0, (2.0, 3.0, 4.0))),  # a shorter inner tuple
    ],
)
def test_no_answer_passes_by_broadcasting(out, exp):
    assert task.outputs_match(out, exp, [], "f", 0)[0] is False
    assert task.outputs_match(out, exp, [], "f", 1e-4)[0] is False


@pytest.mark.parametrize(
    "out, exp, atol",
    [
        ((1.0000001, 0.5), (1.0, 0.5), 0),  # within 1e-6
        ([np.float64(1.5), np.float32(2.5)], [1.5, 2.5], 0),  # numpy floats inside a list
        ((np.float64(1.0), np.float64(0.5)), (1.0, 0.5), 0),
        (np.array([7.0]), np.array([7.0]), 0),  # an array for an array (EvalPlus: one element only)
        ([[1.0, 2.0], (3.0, 4.00001)], [[1.0, 2.0], [3.0, 4.0]], 1e-4),  # a tuple for an inner list
        (np.array([7]), [7], 0),  # EvalPlus: a one-element array's truth value
        ((1.00005, 2), (1.0, 2), 1e-4),  # ints beside floats, the task's atol
        (np.int64(3), 3, 0),
        (np.float64(0.5), 0.5, 0),
        ({"a": [1.0, 2.0]}, {"a": [1.0, 2.0]}, 0),
        ((1 + 2j, 3.0), (1 + 2j, 3.0), 0),
    ],
)
def test_numbers_in_legitimate_forms_still_match(out, exp, atol):
    assert task.outputs_match(out, exp, [], "f", atol)[0] is True


def test_set_equality_is_linear_on_colliding_values():
    colliding = [P * k for k in range(1, 40000)]
    start = time.perf_counter()
    assert task.outputs_match(colliding, (P, 2 * P), [], "similar_elements", 0)[0] is False
    assert task.outputs_match(tuple(colliding), tuple(colliding), [], "similar_elements", 0)[0] is False
    assert time.perf_counter() - start < 1.0
    # many copies of equal values are fine, and few collisions (-1 and -2 share a hash) too
    assert task.outputs_match([3, 4, 3, 4] * 10000, (4, 3), [], "similar_elements", 0)[0] is True
    assert task.outputs_match([-1, -2, 5], (5, -2, -1), [], "similar_elements", 0)[0] is True


def test_custom_oracles_take_numbers_only():
    assert task.outputs_match(np.array([[33]]), 33, [3, 4], "surface_Area", 0)[0] is False
    assert task.outputs_match(np.empty(0), 33, [3, 4], "surface_Area", 0)[0] is False
    assert task.outputs_match(np.int64(33), 33, [3, 4], "surface_Area", 0)[0] is True
    assert task.outputs_match(np.array([[16]]), 9, [123, 4567], "digit_distance_nums", 0)[0] is False


# --- real tasks -------------------------------------------------------------------------------------------
HIDE = """
import numpy as np
{canonical}
_real = {entry}
def _hide(x):
    if isinstance(x, float):
        return {stand_in}
    if isinstance(x, (list, tuple)):
        return type(x)(_hide(v) for v in x)
    return x
def {entry}(*args):
    return _hide(_real(*args))
"""


@pytest.mark.parametrize("task_id", ["Mbpp/252", "Mbpp/261", "Mbpp/615", "Mbpp/618"])
@pytest.mark.parametrize("stand_in", ["[np.empty((0, 1))]", "np.empty((0, 1))", "np.zeros((1, 0))"])
def test_broadcast_answers_score_zero_on_float_tasks(task_id, stand_in, bwrap):  # noqa: F811
    record = {**records_by_id()[task_id], "grading": {}}
    code = HIDE.format(canonical=record["canonical_solution"], entry=record["entry_point"], stand_in=stand_in)
    assert task.reward(fenced(code), record) == 0.0


@pytest.mark.parametrize("task_id", ["Mbpp/252", "Mbpp/261", "Mbpp/615", "Mbpp/618"])
def test_numpy_answers_score_one_on_float_tasks(task_id, bwrap):  # noqa: F811
    record = {**records_by_id()[task_id], "grading": {}}
    code = HIDE.format(canonical=record["canonical_solution"], entry=record["entry_point"], stand_in="np.float64(x)")
    assert task.reward(fenced(code), record) == 1.0


def test_a_returned_colliding_list_is_judged_fast(bwrap):  # noqa: F811
    """Mbpp/2 (set equality): 30k distinct ints that share one hash, returned by the program itself."""
    record = {**records_by_id()["Mbpp/2"], "grading": {}}
    task.reward(fenced(record["canonical_solution"]), record)  # the reference, outside the timing
    code = f"def similar_elements(a, b):\n    return tuple({P} * k for k in range(1, 30000))"
    start = time.monotonic()
    assert task.reward(fenced(code), record) == 0.0
    assert time.monotonic() - start < 5.0
