"""Every canonical MBPP+ solution (378 tasks) scores 1.0 under the sandbox's limits and the
judge's comparisons: the bounds on what comes back, the strict number comparison and the late-answer
rule refuse nothing a reference solution does. One task's reference needs more than the default 1 GB
address space, before these bounds as after them (Mbpp/255: 1.66 million 77-tuples on one plus
input); it stops with the task.exclude sentence. Slow (315 s on two AVX-512 EPYC cores: two sandbox
runs per task, the reference's and the candidate's): `pytest -m slow tests/test_sandbox_canonical_sweep.py`."""

import time

import pytest

from rapid.config import ConfigError
from rapid.tasks import mbpp_plus as task
from tests.test_mbpp_plus import bwrap, fenced, fresh_cache, records_by_id  # noqa: F401 (fixtures)


@pytest.mark.slow
def test_every_canonical_solution_scores_one(bwrap):  # noqa: F811
    records = records_by_id()
    assert len(records) == task.N_TASKS
    start, failed, beyond_limits = time.monotonic(), [], []
    for task_id, record in records.items():
        record = {**record, "grading": {}}
        try:
            if task.reward(fenced(record["canonical_solution"]), record) != 1.0:
                failed.append(task_id)
        except ConfigError as e:
            assert "task.exclude" in str(e)
            beyond_limits.append(task_id)
    print(f"{len(records)} canonical solutions graded in {time.monotonic() - start:.0f} s")
    assert failed == [] and beyond_limits == ["Mbpp/255"]
