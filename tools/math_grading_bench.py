"""MATH grading, measured: every reference solution of MATH (the 12k training split and MATH-500, which
together hold all 5,000 test problems) against its own record, the cases of
tests/test_math_grading_grammar.py (wrong answers of each class and correct forms), and the time of
each grade. With --baseline, the same cases through another version of rapid/tasks/math.py (e.g. one
taken from git history), to count what that version gets wrong.

    python tools/math_grading_bench.py --data ../shared/data --cross 1500
    git show <commit>:rapid/tasks/math.py > math_before.py
    python tools/math_grading_bench.py --baseline math_before.py --label "math.py at <commit>"

Writes <out>/summary.md (or <out>/baseline.md; counts, time per grade, the CPU) and prints it. A grade
that runs out of time (`GradingError`) counts as not 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import time
from pathlib import Path

from rapid.tasks import grading
from rapid.tasks import math as task

ROOT = Path(__file__).parents[1]
FILES = ("math/train_12k.jsonl", "math500/test.jsonl")


def cpu() -> str:
    """The CPU model and its vector extensions, as every results file names them (rapid.profiling)."""
    from rapid.profiling import cpu_description

    return cpu_description()


class Counting:
    """SYMBOLIC.equal, counting its calls (the grades that reached sympy)."""

    def __init__(self, equal):
        self.equal, self.calls = equal, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.equal(*args, **kwargs)


def grade(module, pred_or_completion: str, record: dict, boxed: bool) -> tuple[float | str, float]:
    completion = f"So the answer is $\\boxed{{{pred_or_completion}}}$." if boxed else pred_or_completion
    start = time.perf_counter()
    try:
        verdict = module.reward(completion, record)
    except grading.GradingError:
        verdict = "timeout"
    return verdict, time.perf_counter() - start


def percentiles(times: list[float]) -> str:
    times = sorted(times)
    p = lambda q: times[min(len(times) - 1, int(q * len(times)))] * 1e3  # noqa: E731
    return f"{statistics.mean(times) * 1e3:.2f} | {p(0.5):.2f} | {p(0.99):.1f} | {times[-1] * 1e3:.0f}"


def cross_check(data: Path, n_pairs: int, timeout_s: float, counter: Counting) -> list[str]:
    """Distinct MATH-500 answers against each other (no problem text): every pair decided in the grading
    process, and `n_pairs` random pairs of those that reach sympy (seed 0). Equal pairs are listed."""
    golds = sorted({json.loads(line)["answer"] for line in (data / FILES[1]).read_text().splitlines()})
    equal, to_sympy, real = [], [], counter.equal
    for a in golds:
        for b in golds:
            if a == b:
                continue
            counter.equal = lambda *_: to_sympy.append((a, b)) or False  # noqa: B023 (called at once)
            if task.is_equiv(a, b, timeout_s):
                equal.append((a, b))
    counter.equal = real
    sample = random.Random(0).sample(sorted(set(to_sympy)), min(n_pairs, len(set(to_sympy))))
    sympy_equal, timeouts = [], 0
    for a, b in sample:
        try:
            if task.is_equiv(a, b, timeout_s):
                sympy_equal.append((a, b))
        except grading.GradingError:
            timeouts += 1
    n = len(golds) * (len(golds) - 1)
    return [
        "## Distinct MATH-500 answers against each other\n",
        f"{n:,} ordered pairs of {len(golds)} distinct answers: {len(equal)} equal without sympy "
        f"({', '.join(f'`{a}` = `{b}`' for a, b in equal)}); {len(set(to_sympy)):,} pairs reach sympy, and "
        f"of {len(sample):,} of them drawn at random {len(sympy_equal)} are equal"
        + (f" ({', '.join(f'`{a}` = `{b}`' for a, b in sympy_equal)})" if sympy_equal else "")
        + f", {timeouts} ran out of time.\n",
    ]


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("math_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="folder with math/ and math500/")
    parser.add_argument("--out", default=str(ROOT / "experiments" / "results" / "math_grading"))
    parser.add_argument("--baseline", help="another rapid/tasks/math.py to grade the cases with")
    parser.add_argument("--label", default="the baseline", help="what to call the baseline in the summary")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="grading.timeout_s of each record")
    parser.add_argument("--cross", type=int, default=0, help="grade this many random pairs of distinct answers")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    import test_math_grading_grammar as cases  # the cases and their expected verdicts

    counter = Counting(grading.SYMBOLIC.equal)
    grading.SYMBOLIC.equal = counter
    grading.SYMBOLIC.equal("1", "1", 120.0)  # start the checker: its start-up is not grading time
    command = " ".join(["python", *sys.argv]).replace(args.baseline or "\0", "<baseline>")
    lines = [f"# MATH grading, measured\n\n`{command}`; CPU: {cpu()}.\n"]
    module = load_module(args.baseline) if args.baseline else task
    name = args.label if args.baseline else "rapid/tasks/math.py"

    if not args.baseline:
        data = Path(args.data)
        if not all((data / f).is_file() for f in FILES):
            sys.exit(f"the MATH data is not at {data}: pass --data with the folder holding {' and '.join(FILES)}")
        rows = [json.loads(line) for f in FILES for line in (data / f).read_text().splitlines()]
        rows = [{**r, "grading": {"timeout_s": args.timeout_s}} for r in rows if r["answer"].strip()]
        counter.calls = 0
        graded = [grade(module, r["solution"], r, boxed=False) for r in rows]
        accepted = sum(v == 1.0 for v, _ in graded)
        counter.calls, read, numerals, unread, tree_times = 0, 0, 0, set(), []  # through the grammar, spelling aside
        for r in rows:
            gold = task.normalize(r["answer"])
            if task._is_text_answer(gold) or "\\approx" in gold:
                continue
            for v in task._gold_values(gold, r["problem"])[0]:
                if task._NUMERAL.fullmatch(task.unwrap_text(v.text).replace(" ", "")):
                    numerals += 1
                    continue
                start = time.perf_counter()
                tree = task.parse(list(v.tokens))
                same = tree is not None and task._tree_equal(tree, tree, args.timeout_s, r["problem"])
                tree_times.append(time.perf_counter() - start)
                read += same
                if tree is None:
                    unread.add(r["answer"])
        lines += [
            "## Reference solutions against their own records\n",
            f"{accepted:,} of {len(rows):,} score 1 (train_12k + MATH-500, less the two empty answers); "
            f"{counter.calls} grades reached sympy. Read by the grammar and compared as trees (the spelling "
            f"rule aside): {read:,} values of {len(tree_times):,}, besides {numerals} numerals in a base (their "
            f"own rule); {len(unread)} distinct answers are matched by spelling only: "
            f"{', '.join(f'`{a}`' for a in sorted(unread))}.\n",
            "| grades | mean ms | median ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|",
            f"| {len(rows):,} reference solutions, full reward | {percentiles([t for _, t in graded])} |",
            f"| {len(tree_times):,} reference values, parse and compare as trees | {percentiles(tree_times)} |\n",
        ]

    if args.cross and not args.baseline:
        lines += cross_check(Path(args.data), args.cross, args.timeout_s, counter)

    lines += [
        f"## The cases of tests/test_math_grading_grammar.py through {name}\n",
        "| class | cases | wrong answers | scored 1 (wrong) | correct forms | scored 0 (wrong) | sympy calls "
        "| mean ms | median ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, group in cases.CLASSES.items():
        counter.calls, times, wrong_ones, refused = 0, [], 0, 0
        for case in group:
            pred, gold, want = case[0], case[1], case[-1]
            record = {
                "problem": case[2] if len(case) == 4 else cases.ONE,
                "answer": gold,
                "grading": {"timeout_s": args.timeout_s},
            }
            verdict, seconds = grade(module, pred, record, boxed=True)
            times.append(seconds)
            wrong_ones += want == 0.0 and verdict == 1.0
            refused += want == 1.0 and verdict != 1.0
        n_wrong = sum(case[-1] == 0.0 for case in group)
        lines.append(
            f"| {label} | {len(group)} | {n_wrong} | {wrong_ones} | {len(group) - n_wrong} | {refused} "
            f"| {counter.calls} | {percentiles(times)} |"
        )
    text = "\n".join(lines) + "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / ("baseline.md" if args.baseline else "summary.md")).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
