"""GSM8K and numeric-task grading, measured: every GSM8K reference solution (7,473 train + 1,319 test)
against its own record, the cases of tests/test_numeric_grading.py (wrong answers by class, correct
spellings), the 16 generated attacks of that file on every GSM8K gold, and the time of each grade.
It grades with whatever `rapid` is importable, so the same cases can be run through an older version:

    python tools/numeric_grading_bench.py --data ../shared/data
    git archive <commit> rapid | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before python tools/numeric_grading_bench.py --data ../shared/data --label "rapid at <commit>" \
        --out experiments/results/numeric_grading/baseline.md

Writes the table to --out (default experiments/results/numeric_grading/summary.md) and prints it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

from rapid.tasks import arithmetic, gsm8k, multistep

ROOT = Path(__file__).parents[1]


def cpu() -> str:
    """The CPU model and its vector extensions, as every results file names them (rapid.profiling)."""
    from rapid.profiling import cpu_description

    return cpu_description()


def cases():
    """The case tables of tests/test_numeric_grading.py, loaded by path (whatever `rapid` is imported)."""
    spec = importlib.util.spec_from_file_location("numeric_cases", ROOT / "tests" / "test_numeric_grading.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(completion: str, record: dict) -> tuple[float, float]:
    start = time.perf_counter()
    verdict = gsm8k.reward(completion, record)
    return verdict, time.perf_counter() - start


def ms(times: list[float]) -> str:
    times = sorted(times)
    return f"{statistics.mean(times) * 1e3:.3f} | {times[len(times) // 2] * 1e3:.3f} | {times[-1] * 1e3:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="folder holding gsm8k/")
    parser.add_argument("--out", default=str(ROOT / "experiments" / "results" / "numeric_grading" / "summary.md"))
    parser.add_argument("--label", default="rapid/tasks/gsm8k.py as checked out")
    args = parser.parse_args()
    c = cases()
    lines = [
        "# GSM8K and numeric grading, measured",
        "",
        f"`{' '.join(['python'] + sys.argv)}`; grader: {args.label}; CPU: {cpu()}.",
        "",
        "| what | grades | scored wrong | mean ms | median ms | max ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for cls, triples in sorted(c.WRONG.items()):
        graded = [timed(a, {"final_answer": g, "question": q}) for a, g, q in triples]
        paid = [a for (a, _, _), (v, _) in zip(triples, graded) if v != 0.0]
        lines.append(f"| wrong answers: {cls} | {len(graded)} | {len(paid)} scored 1 | {ms([t for _, t in graded])} |")
    graded = [timed(a, {"final_answer": g, "question": q}) for a, g, q in c.RIGHT]
    refused = [a for (a, _, _), (v, _) in zip(c.RIGHT, graded) if v != 1.0]
    lines.append(f"| correct spellings | {len(graded)} | {len(refused)} scored 0 | {ms([t for _, t in graded])} |")
    numeric = [("arithmetic", arithmetic.reward, {"answer": "12"}), ("multistep", multistep.reward, {"answer": "12"})]
    for name, reward, record in numeric:
        paid = [w for w in ("\\boxed{11 \\text{ or } \\boxed{12}}", "\\boxed{\\boxed{11}, 12}") if reward(w, record)]
        lines.append(f"| {name}: a box inside a box | 2 | {len(paid)} scored 1 | | | |")
    notes = []
    for split in ("train", "test"):
        path = Path(args.data) / "gsm8k" / f"{split}.jsonl"
        if not path.is_file():
            notes.append(f"GSM8K {split} not measured: {path} not found.")
            continue
        records = [json.loads(line) for line in path.read_text().splitlines()]
        graded = [timed(r["answer"], r) for r in records]
        refused = sum(v != 1.0 for v, _ in graded)
        lines.append(
            f"| GSM8K {split}: worked solutions (`#### N`) | {len(graded)} | {refused} scored 0 | {ms([t for _, t in graded])} |"
        )
        graded = [timed(gsm8k.reference(r)[0], r) for r in records]
        refused = sum(v != 1.0 for v, _ in graded)
        lines.append(
            f"| GSM8K {split}: `\\boxed{{N}}` | {len(graded)} | {refused} scored 0 | {ms([t for _, t in graded])} |"
        )
        graded, paid = [], {}
        for r in records:
            for i, attack in enumerate(c.attacks(r["final_answer"])):
                verdict, t = timed(attack, r)
                graded.append(t)
                if verdict != 0.0:
                    paid[i] = paid.get(i, 0) + 1
        shown = ", ".join(f"{c.attacks('G')[i]!r}: {n}" for i, n in sorted(paid.items())) or "none"
        lines.append(
            f"| GSM8K {split}: 16 attacks on each gold | {len(graded)} | {sum(paid.values())} scored 1 | {ms(graded)} |"
        )
        notes.append(f"Attacks on GSM8K {split} that scored 1, by form (G the gold, G1 the gold plus one): {shown}.")
    text = "\n".join(lines + [""] + notes) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
