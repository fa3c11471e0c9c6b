"""rapid's MBPP+ grader beside EvalPlus's own checker: the same programs must get the same verdict.

    python tools/evalplus_agreement.py                     # 40 tasks, seed 0
    python tools/evalplus_agreement.py --tasks 0 --slow    # every task, with the slow variant too

EvalPlus's side is evalplus 0.3.1 as `evalplus.evaluate` runs it: inputs deserialised by its
`mbpp_deserialize_inputs`, expected outputs and reference times from its `trusted_exec` of
prompt + canonical solution, then `untrusted_check` on the base and on the plus inputs (fast check,
per-test limits max(4 s, 4x the reference)); a program passes if both phases pass. rapid's side is
`rapid.tasks.mbpp_plus.reward` (bubblewrap sandbox) on the program in a ```python block.

Programs per task: the canonical solution; mutants (one AST mutation each: the first arithmetic
operator swapped, the first comparison flipped, the first integer constant plus one); and correct
programs written in ways that trip graders: results returned as numpy scalars (`numpy`), 20 MB
printed at import and 64 kB per call (`print`), and with --slow 0.25 s of sleep per call (`slow`).
Writes rows.csv (task, program, both verdicts) and summary.md into --out.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import platform
import random
import subprocess
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SLOW_REFERENCE_S = 5.0  # tasks whose reference takes longer in all are reported apart (timing-bound)

SWAP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
}
FLIP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


def evalplus():
    """EvalPlus's checker pieces. Installed with --no-deps, its data module imports two packages it
    does not use here (tempdir, appdirs): empty stand-ins are registered for them if absent."""
    for name in ("tempdir", "appdirs", "wget"):
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.user_cache_dir = lambda *a, **k: str(Path.home() / ".cache" / "evalplus")
            sys.modules[name] = stub
    from evalplus.data.mbpp import mbpp_deserialize_inputs
    from evalplus.eval import PASS, untrusted_check
    from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
    from evalplus.gen.util import trusted_exec

    return types.SimpleNamespace(
        deserialize=mbpp_deserialize_inputs,
        untrusted_check=untrusted_check,
        PASS=PASS,
        not_none=MBPP_OUTPUT_NOT_NONE_TASKS,
        trusted_exec=trusted_exec,
    )


def mutants(code: str) -> list[str]:
    """Up to three one-site mutants of `code` (the same program when a kind has no site)."""
    out = []
    for mutate in (_swap_operator, _flip_comparison, _bump_integer):
        tree = ast.parse(code)
        if mutate(tree):
            out.append(ast.unparse(tree))
    return out


def _swap_operator(tree) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in SWAP:
            node.op = SWAP[type(node.op)]()
            return True
    return False


def _flip_comparison(tree) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and type(node.ops[0]) in FLIP:
            node.ops[0] = FLIP[type(node.ops[0])]()
            return True
    return False


def _bump_integer(tree) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            node.value += 1
            return True
    return False


def _wrapped(code: str, entry: str, body: str, prelude: str = "") -> str:
    """`code` with `entry` replaced by a wrapper around the original (recursive calls go through it)."""
    body = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return f"{prelude}{code}\n\n_original = {entry}\n\n\ndef {entry}(*args):\n{body}\n"


def programs(record: dict, slow: bool = False) -> list[tuple[str, str]]:
    """(kind, code) for the canonical solution, its mutants and its correct variants."""
    code, entry = record["canonical_solution"], record["entry_point"]
    out = [("canonical", code)] + [(f"mutant{i}", m) for i, m in enumerate(mutants(code))]
    out.append(
        (
            "numpy",
            _wrapped(
                code,
                entry,
                """
import numpy as np
r = _original(*args)
if type(r) is bool:
    return np.bool_(r)
if type(r) is int and -2 ** 63 <= r < 2 ** 63:
    return np.int64(r)
if type(r) is float:
    return np.float64(r)
if type(r) is list and r and all(type(v) is float for v in r):
    return [np.float64(v) for v in r]
return r""",
            ),
        )
    )
    out.append(
        (
            "print",
            _wrapped(
                code, entry, "print('p' * (1 << 16))\nreturn _original(*args)", prelude="print('y' * (20 << 20))\n"
            ),
        )
    )
    if slow:
        out.append(("slow", _wrapped(code, entry, "import time\ntime.sleep(0.25)\nreturn _original(*args)")))
    return out


class EvalPlusJudge:
    """EvalPlus's verdict on a program for one task, its ground truth computed once."""

    def __init__(self, ep, record: dict):
        self.ep, self.record = ep, record
        self.inputs = {k: ep.deserialize(record["task_id"], record[f"{k}_input"]) for k in ("base", "plus")}
        self.expected, self.times = {}, {}
        for k, inputs in self.inputs.items():
            self.expected[k], self.times[k] = ep.trusted_exec(
                record["prompt"] + record["canonical_solution"],
                inputs,
                record["entry_point"],
                record_time=True,
                output_not_none=record["entry_point"] in ep.not_none,
            )

    def __call__(self, code: str) -> bool:
        for k in ("base", "plus"):
            status, _ = self.ep.untrusted_check(
                "mbpp",
                code,
                self.inputs[k],
                self.record["entry_point"],
                expected=self.expected[k],
                atol=self.record["atol"],
                ref_time=self.times[k],
                fast_check=True,
            )
            if status != self.ep.PASS:
                return False
        return True


def rapid_verdict(record: dict, code: str) -> bool:
    sys.path.insert(0, str(REPO))
    from rapid.tasks import mbpp_plus

    return mbpp_plus.reward(f"```python\n{code}\n```", {**record, "grading": {}}) == 1.0


def evalplus_verdicts(record: dict, codes: list[str]) -> tuple[list[bool], float]:
    """EvalPlus's verdicts, and its reference's seconds in all, from a fresh interpreter that
    imports only evalplus (as `evalplus.evaluate`'s workers do): its checker forks that process
    under a 4 GB address-space limit, so a grader holding torch would fail programs EvalPlus passes."""
    proc = subprocess.run(
        [sys.executable, __file__, "--judge"],
        input=json.dumps([record, codes]),
        capture_output=True,
        text=True,
        check=True,
    )
    verdicts, seconds = json.loads(proc.stdout.strip().splitlines()[-1])
    return verdicts, seconds


def _judge_main() -> None:
    record, codes = json.loads(sys.stdin.read())
    judge = EvalPlusJudge(evalplus(), record)
    verdicts = [judge(code) for code in codes]
    print(json.dumps([verdicts, sum(judge.times["base"]) + sum(judge.times["plus"])]))


def compare(records: list[dict], slow: bool = False, log=print) -> list[dict]:
    """One row per (task, program): both verdicts."""
    rows = []
    for record in records:
        start = time.monotonic()
        kinds_codes = programs(record, slow)
        verdicts, reference_s = evalplus_verdicts(record, [code for _, code in kinds_codes])
        for (kind, code), verdict in zip(kinds_codes, verdicts):
            rows.append(
                {
                    "task_id": record["task_id"],
                    "program": kind,
                    "evalplus": verdict,
                    "rapid": rapid_verdict(record, code),
                    "reference_s": round(reference_s, 3),
                }
            )
            log(
                f"{record['task_id']:>9} {kind:<10} evalplus={rows[-1]['evalplus']!s:<5} rapid={rows[-1]['rapid']!s:<5}"
            )
        log(f"{record['task_id']:>9} {time.monotonic() - start:.1f}s")
    return rows


def cpu() -> str:
    """The CPU model and its vector extensions (from /proc/cpuinfo)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    return f"{model}; {' '.join(sorted(f for f in flags if f.startswith(('avx', 'sse', 'fma', 'amx'))))}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "mbpp_plus" / "test.jsonl"))
    parser.add_argument("--tasks", type=int, default=40, help="tasks sampled (0: all but Mbpp/255)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow", action="store_true", help="add the 0.25 s-per-call variant")
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "evalplus_agreement"))
    args = parser.parse_args()
    records = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    records = sorted((r for r in records if r["task_id"] != "Mbpp/255"), key=lambda r: int(r["task_id"][5:]))
    if args.tasks:
        records = random.Random(args.seed).sample(records, args.tasks)
    start = time.monotonic()
    rows = compare(records, args.slow)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "rows.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    kinds = sorted({r["program"] for r in rows}, key=lambda k: (k.startswith("mutant"), k))
    lines = [
        f"# rapid vs EvalPlus 0.3.1 verdicts on MBPP+ ({len(records)} tasks, seed {args.seed})",
        "",
        f"CPU: {cpu()}",
        f"Python {platform.python_version()}; {time.monotonic() - start:.0f} s in all",
        "",
        "`python tools/evalplus_agreement.py " + " ".join(sys.argv[1:]) + "`",
        "",
        "| program | n | EvalPlus passes | rapid passes | verdicts agree |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind in kinds + ["all"]:
        sel = [r for r in rows if kind in ("all", r["program"])]
        lines.append(
            f"| {kind} | {len(sel)} | {sum(r['evalplus'] for r in sel)} | {sum(r['rapid'] for r in sel)} | "
            f"{sum(r['evalplus'] == r['rapid'] for r in sel)} |"
        )
    fast = [r for r in rows if r["reference_s"] <= SLOW_REFERENCE_S]
    lines += [
        "",
        f"Tasks whose reference solution takes at most {SLOW_REFERENCE_S:g} s on all its tests (in "
        f"EvalPlus's trusted_exec): {len({r['task_id'] for r in fast})}, programs {len(fast)}, verdicts agree "
        f"{sum(r['evalplus'] == r['rapid'] for r in fast)}. The others' verdicts depend on the machine's speed "
        "and load in both checkers (their whole-phase cap is min(60 s, the sum of the test limits)).",
        "",
    ]
    disagree = [r for r in rows if r["evalplus"] != r["rapid"]]
    lines += [
        "Disagreements: "
        + (
            ", ".join(
                f"{r['task_id']} {r['program']} (EvalPlus {'pass' if r['evalplus'] else 'fail'}, "
                f"reference {r['reference_s']:.1f} s)"
                for r in disagree
            )
            or "none"
        )
    ]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    _judge_main() if sys.argv[1:] == ["--judge"] else main()
