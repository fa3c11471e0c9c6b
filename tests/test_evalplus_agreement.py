"""rapid's MBPP+ grader and EvalPlus's own checker (evalplus 0.3.1, `make install` puts it in with
--no-deps) give the same verdict on the same programs: canonical solutions, one-site mutants, and
correct programs that return numpy scalars or print megabytes (tools/evalplus_agreement.py; the
tasks cover the set-equality, not-None, custom-oracle and tolerance paths)."""

import json

import pytest

from rapid.tasks import sandbox
from tests.test_mbpp_plus import DATA
from tools import evalplus_agreement as agreement

TASKS = ["Mbpp/2", "Mbpp/124", "Mbpp/581", "Mbpp/737"]  # set equality, tolerance, custom oracle, not None


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAPID_CACHE", str(tmp_path / "cache"))


def test_mutants_change_one_site():
    code = "def f(a, b):\n    if a < b:\n        return a + 2\n    return b"
    assert agreement.mutants(code) == [
        "def f(a, b):\n    if a < b:\n        return a - 2\n    return b",
        "def f(a, b):\n    if a <= b:\n        return a + 2\n    return b",
        "def f(a, b):\n    if a < b:\n        return a + 3\n    return b",
    ]


@pytest.mark.slow
def test_same_verdicts_as_evalplus():
    try:
        agreement.evalplus()
    except ImportError as e:
        pytest.skip(f"evalplus is not installed ({e}): pip install --no-deps evalplus==0.3.1 (make install does)")
    path = DATA / "mbpp_plus" / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"benchmark data not found at {DATA} (the ../shared/data folder beside the checkout)")
    problem = sandbox.check("bwrap")
    if problem:
        pytest.skip(f"bubblewrap cannot start here ({problem})")
    records = {r["task_id"]: r for r in map(json.loads, path.read_text().splitlines())}
    rows = agreement.compare([records[t] for t in TASKS], log=lambda *_: None)
    kinds = {r["program"] for r in rows}
    assert {"canonical", "numpy", "print", "mutant0"} <= kinds and len(rows) >= 3 * len(TASKS)
    assert all(r["evalplus"] for r in rows if r["program"] in ("canonical", "numpy", "print")), rows
    assert not all(r["evalplus"] for r in rows if r["program"].startswith("mutant"))  # mutants do fail
    assert [r for r in rows if r["evalplus"] != r["rapid"]] == []
