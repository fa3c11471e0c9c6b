"""The benchmarks as the Hugging Face Hub stores them, read through the real `datasets` loader from small
local fixture files written in each Hub dataset's exact schema (parquet, as the Hub serves it), so that
a schema mistake fails here rather than at the start of a GPU run."""

from __future__ import annotations

import os

import pytest

from rapid.config import ConfigError
from rapid.tasks import mbpp_plus
from rapid.tasks.datasets import load_hub, mbppplus_from_hub

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("datasets")

# evalplus/mbppplus: the fields of EvalPlus's tools/mbpp/to_original_fmt.py; `test` in its template
HELPERS = """import numpy as np

def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(i, float) for i in x)
    return False

def assertion(out, exp, atol):
    exact_match = out == exp
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        np.testing.assert_allclose(out, exp, atol=atol)
    else:
        assert exact_match
"""


def hub_test(imports: str, inputs: str, results: str, atol) -> str:
    return (
        f"{imports}\n\n{HELPERS}\n\ninputs = {inputs}\nresults = {results}\n"
        f"for i, (inp, exp) in enumerate(zip(inputs, results)):\n    assertion(candidate(*inp), exp, {atol})\n"
    )


HUB_RECORDS = [
    {
        "task_id": 2,
        "code": "def similar_elements(test_tup1, test_tup2):\n  return tuple(set(test_tup1) & set(test_tup2))\n",
        "prompt": "Write a function to find the shared elements from the given two lists.",
        "source_file": "Benchmark Questions Verification V2.ipynb",
        "test_imports": [],
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
        ],
        # two base inputs (MBPP's asserts), then two plus inputs; tuples as repr() writes them
        "test": hub_test(
            "",
            "[((3, 4, 5, 6), (5, 7, 4, 10)), ((1, 2, 3, 4), (5, 4, 3, 7)), ((), ()), ((1, 2), (2,))]",
            "[(4, 5), (3, 4), (), (2,)]",
            0,
        ),  # fmt: skip
    },
    {
        "task_id": 17,
        "code": "def helper(a):\n    return a\n\ndef square_perimeter(a):\n  return 4 * helper(a)\n",
        "prompt": "Write a function that returns the perimeter of a square given its side length as input.",
        "source_file": "Mike's Copy of Benchmark Questions Verification V2.ipynb",
        "test_imports": [],
        "test_list": ["assert square_perimeter(10)==40", "assert square_perimeter(5)==20"],
        "test": hub_test("from math import inf", "[[10], [5], [-inf], [2.5]]", "[40, 20, -inf, 10.0]", 1e-06),
    },
]


def write_hub_parquet(folder, records):
    """The Hub's layout for a one-split dataset: data/<split>-00000-of-00001.parquet."""
    (folder / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(records), folder / "data" / "test-00000-of-00001.parquet")
    return folder


def test_mbppplus_hub_records_convert_to_evalplus_fields(tmp_path):
    folder = write_hub_parquet(tmp_path / "mbppplus", HUB_RECORDS)
    loaded = load_hub("mbpp_plus", f"{folder}@test")  # the `datasets` package, as for evalplus/mbppplus@test
    assert sorted(loaded[0]) == sorted(
        ["task_id", "code", "prompt", "source_file", "test_imports", "test_list", "test"]
    )
    first, second = (mbppplus_from_hub(r) for r in loaded)
    assert first == {
        "task_id": "Mbpp/2",
        "prompt": '"""\nWrite a function to find the shared elements from the given two lists.\n'
        'assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))\n"""\n',
        "entry_point": "similar_elements",
        "canonical_solution": HUB_RECORDS[0]["code"],
        "base_input": [[[3, 4, 5, 6], [5, 7, 4, 10]], [[1, 2, 3, 4], [5, 4, 3, 7]]],  # JSON form, as EvalPlus's
        "plus_input": [[[], []], [[1, 2], [2]]],
        "atol": 0,
    }
    assert second["entry_point"] == "square_perimeter"  # the function the asserts call, not the helper
    assert second["base_input"] == [[10], [5]] and second["plus_input"][1] == [2.5]
    assert second["plus_input"][0][0] == float("-inf") and second["atol"] == 1e-06


def test_mbpp_plus_loads_and_grades_the_hub_schema(tmp_path, monkeypatch):
    """Through mbpp_plus.load (the Hub source), and graded in the real sandbox: each reference solution
    scores 1, a wrong one 0 (its plus input 2.5 -> 10.0 is missed)."""
    from rapid.tasks.sandbox import check

    if check("bwrap"):
        pytest.skip(f"the bwrap sandbox cannot start here: {check('bwrap')}")
    folder = write_hub_parquet(tmp_path / "mbppplus", HUB_RECORDS)
    monkeypatch.setattr(mbpp_plus, "HUB", {"train": f"{folder}@test", "test": f"{folder}@test"})
    monkeypatch.setenv("RAPID_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RAPID_DATA_DIR", raising=False)
    records = mbpp_plus.load("train", n_eval=0, exclude=()) + mbpp_plus.load("test", n_eval=0, exclude=())
    assert sorted(r["task_id"] for r in records) == ["Mbpp/17", "Mbpp/2"]
    for r in records:
        assert mbpp_plus.reward(f"```python\n{r['canonical_solution']}\n```", r) == 1.0, r["task_id"]
    square = next(r for r in records if r["task_id"] == "Mbpp/17")
    assert mbpp_plus.reward("```python\ndef square_perimeter(a):\n    return 4 * int(a)\n```", square) == 0.0


def test_mbppplus_hub_test_code_that_is_not_literal_is_refused():
    bad = {**HUB_RECORDS[1], "test": hub_test("import os", "[[os.getcwd()]]", "[0]", 0)}
    with pytest.raises(ConfigError, match="task 17: its test inputs hold Call, not a literal"):
        mbppplus_from_hub(bad)


def write_splits(folder, splits: dict[str, list[dict]]):
    (folder / "data").mkdir(parents=True)
    for split, records in splits.items():
        pq.write_table(pa.Table.from_pylist(records), folder / "data" / f"{split}-00000-of-00001.parquet")
    return folder


def math_record(i: int, answer: str) -> dict:
    """nlile/hendrycks-MATH-benchmark and HuggingFaceH4/MATH-500: problem, solution, answer, subject,
    level (int64), unique_id."""
    return {
        "problem": f"What is ${i} + {i}$?",
        "solution": f"${i} + {i} = \\boxed{{{answer}}}$.",
        "answer": answer,
        "subject": "Prealgebra",
        "level": 1,
        "unique_id": f"train/prealgebra/{i}.json",
    }


def test_math_reads_the_hub_train_and_test_schema(tmp_path, monkeypatch):
    from rapid.tasks import math

    assert math.HUB["train"] == "nlile/hendrycks-MATH-benchmark@train"  # 12,000 train / 500 test on the Hub
    folder = write_splits(
        tmp_path / "math", {"train": [math_record(i, str(2 * i)) for i in range(3)], "test": [math_record(9, "18")]}
    )
    monkeypatch.setattr(math, "HUB", {"train": f"{folder}@train", "test": f"{folder}@test"})
    monkeypatch.delenv("RAPID_DATA_DIR", raising=False)
    train, test = math.load("train"), math.load("test")
    assert [r["answer"] for r in train] == ["0", "2", "4"] and test[0]["level"] == 1
    assert math.reward("so the answer is \\boxed{18}", test[0]) == 1.0
    assert math.reward("so the answer is \\boxed{17}", test[0]) == 0.0


def minif2f_record(name: str, split: str) -> dict:
    """DeepSeek-Prover's minif2f.jsonl fields, which rapid.tasks.minif2f reads."""
    return {
        "name": name,
        "split": split,
        "informal_prefix": "/-- Show that 1 + 1 = 2. -/\n",
        "formal_statement": f"theorem {name} : (1 : ℕ) + 1 = 2 := by\n",
        "goal": "⊢ 1 + 1 = 2",
        "header": "import Mathlib\n\n",
    }


@pytest.mark.parametrize("shared", [False, True])
def test_minif2f_hub_splits_must_be_different_problems(tmp_path, monkeypatch, shared):
    from rapid.tasks import minif2f

    bin_dir, project = tmp_path / "bin", tmp_path / "project"
    bin_dir.mkdir()
    project.mkdir()
    (project / "lakefile.lean").write_text("-- a Lake project\n")
    (bin_dir / "lake").write_text("#!/bin/sh\nexit 0\n")  # load only checks that a toolchain is there
    (bin_dir / "lake").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    valid = [minif2f_record(f"mathd_algebra_{i}", "valid") for i in range(3)]
    test = [minif2f_record(f"amc12_{i}", "test") for i in range(2)] + (valid[:1] if shared else [])
    folder = write_splits(tmp_path / "minif2f", {"valid": valid, "test": test})
    monkeypatch.setattr(minif2f, "HUB", {"train": f"{folder}@valid", "test": f"{folder}@test"})
    monkeypatch.delenv("RAPID_DATA_DIR", raising=False)
    config = {"project_dir": str(project), "lake": "lake"}
    if shared:
        with pytest.raises(ConfigError, match="share 1 of 3 theorems \\(e.g. mathd_algebra_0\\)"):
            minif2f.load("train", lean=config)
    else:
        assert [r["name"] for r in minif2f.load("train", lean=config)] == [r["name"] for r in valid]
        assert len(minif2f.load("test", lean=config)) == 2
