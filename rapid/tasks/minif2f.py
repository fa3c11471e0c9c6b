"""MiniF2F in Lean 4 (DeepSeek-Prover-V1.5 statements): train on `valid` (244), evaluate on `test` (244).

The completion is a Lean 4 proof appended to the theorem: the checked file is
`header + formal_statement + proof + "#print axioms <name>"`. Reward 1.0 only if
* the proof text holds no `sorry`, `admit` or `axiom` (nor `#exit`, `unsafe`, `extern`,
  `implemented_by`), and
* `lake env lean <file>`, run inside the Mathlib project `task.lean.project_dir` within
  `task.lean.timeout_s` seconds, exits 0 with no error, and
* `#print axioms` reports only the standard axioms (propext, Classical.choice, Quot.sound):
  a proof that uses `sorry` or a new axiom depends on it and fails here too.
The proof is the last ```lean4 (or ```lean) block of the completion, minus a repeated theorem
statement, else the text before a closing fence, else the whole completion.

Lean is not a Python dependency. To grade, install elan (the Lean toolchain manager:
https://github.com/leanprover/elan) and make a Lake project that requires Mathlib, built once
(`lake exe cache get && lake build`); DeepSeek-Prover-V1.5 used mathlib4 commit 2f65ba7f (some
statements use the older `∑ x in s` syntax). Then set `task.lean.project_dir` to it. Every check
starts `lean` afresh and imports Mathlib (seconds, several GB of memory): bound concurrency with
the reward workers.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rapid.config import ConfigError
from rapid.tasks import encode_prompts
from rapid.tasks.datasets import DATA_DIR_ENV, load_split, require_fields

FILES = {"train": "minif2f/valid.jsonl", "test": "minif2f/test.jsonl"}
HUB = {"train": "Slim205/minif2f@valid", "test": "Slim205/minif2f@test"}
STANDARD_AXIOMS = {"propext", "Classical.choice", "Quot.sound"}
FORBIDDEN = re.compile(r"\b(sorry|admit|axiom|unsafe|extern|implemented_by)\b|#exit")
_INSTALL = (
    "install elan (https://github.com/leanprover/elan) and build a Lake project that requires Mathlib, "
    "then set task.lean.project_dir to it"
)


def check_lean_available(cfg: Mapping) -> dict:
    """The `grading` settings {"project_dir", "lake", "timeout_s"} from the task config, or one
    ConfigError sentence saying what to install: elan (which provides `lake` and `lean`) and a Lake
    project with Mathlib, built once (`lake exe cache get && lake build`)."""
    lean = cfg.get("lean") or {}
    lake, project = lean.get("lake") or "lake", lean.get("project_dir")
    if shutil.which(lake) is None:
        raise ConfigError(f"MiniF2F needs a Lean 4 toolchain but `{lake}` is not on PATH: {_INSTALL}")
    if (
        not project
        or not (Path(project).expanduser() / "lakefile.lean").is_file()
        and not (Path(project).expanduser() / "lakefile.toml").is_file()
    ):
        raise ConfigError(
            f"task.lean.project_dir={project} is not a Lake project (no lakefile.lean or lakefile.toml): {_INSTALL}"
        )
    return {"project_dir": str(Path(project).expanduser()), "lake": lake, "timeout_s": lean.get("timeout_s", 300.0)}


def load(split: str, data_path: str | None = None, lean: Mapping | None = None, **_) -> list[dict]:
    """Records {"name", "header", "formal_statement", "informal_prefix", ..., "grading"} of 'train'
    (the valid split) or 'test'; stops with a ConfigError when no Lean toolchain is set up."""
    grading = check_lean_available({"lean": lean})
    records = load_split("minif2f", split, FILES, HUB, data_path)
    require_fields(records, ("name", "header", "formal_statement"), "minif2f")
    if not data_path and not os.environ.get(DATA_DIR_ENV):  # the Hub: its two splits must be different problems
        other = load_split("minif2f", "test" if split == "train" else "train", FILES, HUB, data_path)
        check_distinct_splits(records, other, HUB)
    return [{**r, "grading": grading} for r in records]


def check_distinct_splits(records: list[dict], other: list[dict], sources: Mapping[str, str]) -> None:
    """Training on the valid split and evaluating on the test split means nothing if they share
    theorems (as a Hub copy may, under two split names): one sentence naming how many."""
    shared = {r["name"] for r in records} & {r["name"] for r in other}
    if shared:
        raise ConfigError(
            f"MiniF2F's valid and test splits ({sources['train']}, {sources['test']}) share {len(shared)} of "
            f"{len(records)} theorems (e.g. {sorted(shared)[0]}): point task.data_path at a copy whose valid and "
            "test splits are different problems (DeepSeek-Prover's minif2f.jsonl, or ../shared/data/minif2f)"
        )


def build_prompts(
    records: list[dict], tokenizer, system: str = "", use_chat_template: bool = True, **_
) -> list[list[int]]:
    """Chat: the Lean file so far, asking for the tactic proof in a ```lean4 block. Plain: the Lean
    file itself (header, informal statement, theorem ending in `:= by`), for the model to continue."""
    files = [f"{r['header']}{r.get('informal_prefix', '')}{r['formal_statement']}" for r in records]
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        texts = [
            f"Complete the following Lean 4 proof.\n\n```lean4\n{f}```\n\n"
            "Answer with the tactic proof only, in one ```lean4 block."
            for f in files
        ]
        return encode_prompts(texts, tokenizer, system, use_chat_template=True)
    return encode_prompts(files, tokenizer, system, use_chat_template=False)


def extract_proof(completion: str, formal_statement: str) -> str:
    """The proof part of a completion (see the module docstring)."""
    blocks = re.findall(r"```(?:lean4?)[ \t]*\n(.*?)(?:```|\Z)", completion, re.S)
    proof = blocks[-1] if blocks else completion.split("```")[0]
    statement = formal_statement.strip()
    return proof.split(statement, 1)[1].lstrip("\n") if statement and statement in proof else proof


def lean_source(record: dict, proof: str) -> str:
    return f"{record['header']}{record['formal_statement']}{proof}\n\n#print axioms {record['name']}\n"


def reward(completion: str, record: dict) -> float:
    """1.0 if Lean accepts the proof with only the standard axioms, else 0.0."""
    proof = extract_proof(completion, record["formal_statement"])
    if not proof.strip() or FORBIDDEN.search(proof):
        return 0.0
    returncode, output = run_lean(lean_source(record, proof), **record["grading"])
    return float(returncode == 0 and accepted(output, record["name"]))


def accepted(output: str, name: str) -> bool:
    """Lean's output shows no error and `#print axioms name` lists only standard axioms."""
    if re.search(r"(^|:\d+:\d+: )error\b", output, re.M) or "declaration uses 'sorry'" in output:
        return False
    if f"'{name}' does not depend on any axioms" in output:
        return True
    found = re.search(rf"'{re.escape(name)}' depends on axioms: \[([^\]]*)\]", output)
    return bool(found) and {a.strip() for a in found.group(1).split(",")} <= STANDARD_AXIOMS


def run_lean(source: str, project_dir: str, lake: str = "lake", timeout_s: float = 300.0) -> tuple[int, str]:
    """(exit code, stdout+stderr) of `lake env lean <file>` in the project; (-1, "timeout") on timeout.
    Lean runs in its own session, killed as a group when the check ends."""
    with tempfile.TemporaryDirectory(prefix="rapid-lean-") as tmp:
        path = os.path.join(tmp, "Proof.lean")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        proc = subprocess.Popen(
            [lake, "env", "lean", path],
            cwd=project_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            return proc.returncode, out.decode(errors="replace")
        except subprocess.TimeoutExpired:
            return -1, "timeout"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
