"""MiniF2F: proof extraction, textual rejection and the Lean checker up to the process boundary.
Lean cannot be installed here, so a stand-in `lake` (a Python script put first on PATH) records its
arguments and the file it was given, and answers like Lean would."""

import json
import os
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rapid.config import ConfigError
from rapid.tasks import minif2f as task

DATA = Path(__file__).parents[2] / "shared" / "data"  # ../shared/data beside the checkout
RECORD = {
    "name": "mathd_algebra_10",
    "header": "import Mathlib\nimport Aesop\n\nopen Real\n\n",
    "formal_statement": "theorem mathd_algebra_10 : abs ((120 : ℝ) / 100 * 30 - 130 / 100 * 20) = 10 := by\n",
}

FAKE_LAKE = """\
#!{python}
# Stand-in for `lake env lean FILE`: logs its call, then answers from markers in the file.
import json, os, re, sys, time
source = open(sys.argv[-1], encoding="utf-8").read()
with open(os.environ["FAKE_LAKE_LOG"], "a") as log:
    log.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "source": source}}) + "\\n")
name = re.search(r"#print axioms (\\S+)", source).group(1)
if "SLOW" in source:
    time.sleep(60)
if "BAD" in source:
    print(f"{{sys.argv[-1]}}:7:2: error: unsolved goals")
    sys.exit(1)
if "WARN_SORRY" in source:
    print(f"{{sys.argv[-1]}}:6:8: warning: declaration uses 'sorry'")
axioms = "propext, sorryAx, Classical.choice" if "SORRY_AXIOM" in source else "propext, Classical.choice, Quot.sound"
print(f"'{{name}}' depends on axioms: [{{axioms}}]")
"""


@pytest.fixture
def lean(tmp_path, monkeypatch):
    """A stand-in `lake` first on PATH, a Lake project folder, and the task config pointing at it."""
    bin_dir, project = tmp_path / "bin", tmp_path / "project"
    bin_dir.mkdir()
    project.mkdir()
    (project / "lakefile.lean").write_text("-- a Lake project\n")
    lake = bin_dir / "lake"
    lake.write_text(FAKE_LAKE.format(python=sys.executable))
    lake.chmod(lake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LAKE_LOG", str(tmp_path / "calls.jsonl"))
    return {"lean": {"project_dir": str(project), "lake": "lake", "timeout_s": 20.0}}


def calls(tmp_path):
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def graded(lean_cfg):
    return {**RECORD, "grading": task.check_lean_available(lean_cfg)}


def test_accepted_proof_drives_lake_env_lean(lean, tmp_path):
    proof = "  norm_num [abs_of_nonneg]\n"
    assert task.reward(f"Sure.\n```lean4\n{proof}```", graded(lean)) == 1.0
    (call,) = calls(tmp_path)
    assert call["argv"][:2] == ["env", "lean"] and call["argv"][2].endswith(".lean")
    assert os.path.samefile(call["cwd"], lean["lean"]["project_dir"])
    assert (
        call["source"] == RECORD["header"] + RECORD["formal_statement"] + proof + "\n\n#print axioms mathd_algebra_10\n"
    )
    assert not Path(call["argv"][2]).exists()  # the temporary file is removed


@pytest.mark.parametrize(
    "proof",
    ["  sorry\n", "  admit\n", "  exact foo -- uses sorry\n", "  exact h\naxiom cheat : False\n", "  #exit\n", "   \n"],
)
def test_forbidden_text_is_rejected_without_running_lean(lean, tmp_path, proof):
    assert task.reward(f"```lean4\n{proof}```", graded(lean)) == 0.0
    assert calls(tmp_path) == []


@pytest.mark.parametrize("proof", ["  BAD\n", "  WARN_SORRY\n", "  SORRY_AXIOM\n"])
def test_lean_rejections(lean, proof):
    assert task.reward(f"```lean4\n{proof}```", graded(lean)) == 0.0


def test_timeout_is_zero_and_kills_lean(lean):
    record = graded({"lean": {**lean["lean"], "timeout_s": 1.0}})
    start = time.monotonic()
    assert task.reward("```lean\n  SLOW\n```", record) == 0.0
    assert time.monotonic() - start < 10


def test_extract_proof():
    statement = RECORD["formal_statement"]
    assert task.extract_proof("```lean4\n  simp\n```", statement) == "  simp\n"
    assert task.extract_proof(f"```lean4\n{statement}  simp\n```", statement) == "  simp\n"  # repeated statement
    assert task.extract_proof("  nlinarith\n```\nThat is all.", statement) == "  nlinarith\n"  # prompt opened it
    assert task.extract_proof("```lean\n  a\n```\n```lean4\n  b\n", statement) == "  b\n"  # last, unclosed


def test_accepted_output_parsing():
    assert task.accepted("'t' does not depend on any axioms\n", "t")
    assert task.accepted("'t' depends on axioms: [propext, Quot.sound]\n", "t")
    assert not task.accepted("'t' depends on axioms: [propext, my_axiom]\n", "t")
    assert not task.accepted("f.lean:3:0: error: unknown identifier\n't' depends on axioms: [propext]\n", "t")
    assert not task.accepted("", "t")  # no axioms line: #exit or crash


def test_missing_toolchain_is_one_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no lake anywhere
    with pytest.raises(ConfigError, match="`lake` is not on PATH: install elan") as err:
        task.check_lean_available({"lean": {"project_dir": str(tmp_path)}})
    assert "\n" not in str(err.value)


def test_missing_project_is_one_config_error(lean, tmp_path):
    with pytest.raises(ConfigError, match="is not a Lake project"):
        task.check_lean_available({"lean": {**lean["lean"], "project_dir": str(tmp_path / "nowhere")}})
    with pytest.raises(ConfigError, match="project_dir=None"):
        task.load("test", lean={"lake": "lake"})


def test_load_valid_for_train_and_test_for_eval(lean, monkeypatch):
    if not (DATA / "minif2f" / "valid.jsonl").is_file():
        pytest.skip(f"benchmark data not found at {DATA} (the ../shared/data folder beside the checkout)")
    monkeypatch.setenv("RAPID_DATA_DIR", str(DATA))
    train, test = task.load("train", **lean), task.load("test", **lean, unused=1)
    assert (len(train), len(test)) == (244, 244)
    assert {r["split"] for r in train} == {"valid"} and {r["split"] for r in test} == {"test"}
    assert train[0]["grading"]["project_dir"] == lean["lean"]["project_dir"]
    assert task.lean_source(train[0], "  simp\n").startswith("import Mathlib\n")


class PlainTokenizer:
    chat_template = None

    def __call__(self, texts, add_special_tokens):
        self.texts = texts
        return {"input_ids": [[0]] * len(texts)}


def test_plain_prompt_is_the_lean_file_to_continue():
    tok = PlainTokenizer()
    task.build_prompts([{**RECORD, "informal_prefix": "/-- Show it. -/\n"}], tok)
    assert tok.texts == [RECORD["header"] + "/-- Show it. -/\n" + RECORD["formal_statement"]]
    assert textwrap.dedent(tok.texts[0]).endswith(":= by\n")
