"""MATH grading: the last \\boxed{} answer against the reference, by a hand-written table."""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rapid.config import ConfigError
from rapid.rewards import score
from rapid.tasks import math as task
from rapid.tasks.grading import GradingError

DATA = Path(__file__).parents[2] / "shared" / "data"  # ../shared/data beside the checkout


def need_data():
    if not (DATA / "math" / "train_12k.jsonl").is_file():
        pytest.skip(f"benchmark data not found at {DATA} (the ../shared/data folder beside the checkout)")


# (model's boxed answer, reference answer, equal?) — each normalisation and each symbolic case.
TABLE = [
    ("12", "12", True),
    ("13", "12", False),
    ("\\text{(C)}", "\\text{(C)}", True),  # multiple choice
    ("(C)", "\\text{(C)}", True),  # \text{} wrapper
    ("(B)", "\\text{(C)}", False),
    ("10", "10\\text{ inches}", True),  # units
    ("864", "864 \\mbox{ inches}^2", True),
    ("5.4", "5.4 \\text{ cents}", True),
    ("50\\%", "50", True),  # percent
    ("\\$18.90", "18.90", True),  # dollars
    ("18.9", "\\$18.90", True),  # trailing zero: exact decimal
    ("90^\\circ", "90", True),  # degrees
    ("90^{\\circ}", "91", False),
    ("x = 5", "5", True),  # variable prefix
    ("y = 2x + 3", "y=2x+3", True),
    ("10080", "10,\\!080", True),  # thousands separators
    ("1{,}000", "1000", True),
    ("1,001", "1000", False),
    ("\\dfrac{1}{2}", "\\frac12", True),  # \dfrac, \frac12 shorthand
    ("\\tfrac{3}{4}", "\\frac{3}{4}", True),
    ("0.5", "\\frac{1}{2}", True),  # fraction = exact decimal
    ("0.25", "\\frac14", True),
    ("0.333", "\\frac{1}{3}", False),  # not exactly equal
    (".5", "\\frac{1}{2}", True),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})", True),  # \left \right and spaces
    ("(3, \\frac{\\pi}{2})", "(\\frac{\\pi}{2}, 3)", False),  # tuple order matters
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),  # surds (symbolic)
    ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("\\sqrt{3}", "\\sqrt{2}", False),
    ("11\\sqrt2", "11\\sqrt{2}", True),
    ("[1, 2)", "[1,2)", True),  # intervals keep their brackets
    ("[1, 2]", "[1,2)", False),
    ("(-\\infty, 3]", "(-\\infty,3]", True),
    ("(-\\infty, 3)", "(-\\infty,3]", False),
    ("x^2+2x+1", "(x+1)^2", True),  # expressions
    ("x^2+2x", "(x+1)^2", False),
    ("\\frac{4}{6}", "\\frac{2}{3}", True),
    ("-\\frac{1}{2}", "\\frac{1}{2}", False),  # sign matters
    ("\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}", "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}", True),
    ("\\text{Evelyn}", "\\text{Evelyn}", True),
    ("Navin", "\\text{Evelyn}", False),
    ("", "5", False),
]


# a unit the gold lacks is allowed where the question asks for it (rule 5)
ASKS = {"50\\%": "What percent of the class passed?", "\\$18.90": "How many dollars did she pay?"}
ASKS["90^\\circ"] = "What is the measure, in degrees, of angle $A$?"


@pytest.mark.parametrize("pred, gold, equal", TABLE)
def test_answer_table(pred, gold, equal):
    # 60 s: a loaded machine must not turn a verdict into a timeout (which now raises, and is counted)
    record = {"answer": gold, "problem": ASKS.get(pred, ""), "grading": {"timeout_s": 60.0}}
    assert task.reward(f"so the answer is \\boxed{{{pred}}}.", record) == float(equal)


def test_table_is_big_and_balanced():
    assert len(TABLE) >= 30 and sum(e for *_, e in TABLE) >= 12 and sum(not e for *_, e in TABLE) >= 12


def test_only_the_last_box_counts_and_no_box_no_credit():
    assert task.reward("\\boxed{5} no wait \\boxed{6}", {"answer": "6"}) == 1.0
    assert task.reward("\\boxed{5} no wait \\boxed{6}", {"answer": "5"}) == 0.0
    assert task.reward("the answer is 5", {"answer": "5"}) == 0.0
    assert task.reward("\\boxed{5", {"answer": "5"}) == 0.0  # unbalanced


def test_pathological_expression_times_out_and_is_counted():
    start = time.monotonic()
    record = {"answer": "1", "grading": {"timeout_s": 1.0}}
    with pytest.raises(GradingError, match="math-verify took over 1 s"):
        task.reward("\\boxed{(x+1)^{9999}}", record)
    assert score(task, ["\\boxed{(x+1)^{9999}}"], [record]) == ([0.0], 1)  # scored 0, counted
    assert time.monotonic() - start < 16.0  # 2 x (1 s limit + killing and restarting the checker)
    assert task.reward("\\boxed{\\frac{\\sqrt{2}}{2}}", {"answer": "\\frac{1}{\\sqrt{2}}"}) == 1.0  # recovered


def test_degree_normalising_is_linear_time():
    degrees = [
        task.normalize(a).replace(" \\text", "\\text")
        for a in ("90^\\circ", "90^{\\circ}", "90 ^ { \\circ }", "30\\circ")
    ]
    assert degrees == ["90\\text{ degrees}"] * 3 + ["30\\text{ degrees}"]
    start = time.monotonic()
    task.normalize("1^" + " " * 60_000 + "x")  # the former pattern backtracked: ~11 s here
    task.normalize("^ {" * 20_000)
    assert time.monotonic() - start < 1.0


def alive(pid: int) -> bool:
    """Whether pid is a live process (a zombie waiting for its parent counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def test_symbolic_checker_dies_with_its_parent():
    """A grading process killed outright (SIGKILL, no clean-up) while sympy computes (holding the
    GIL, deaf to its closed stdin) does not leave it running."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from rapid.tasks.grading import SYMBOLIC\n"
            "SYMBOLIC.equal('1', '1', 120)\nprint(SYMBOLIC._proc.pid, flush=True)\n"
            "SYMBOLIC.equal('1', '9^{9^{9^{9}}}', 600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        server = int(parent.stdout.readline())
        time.sleep(1.0)  # the huge power is being computed now
        assert alive(server)
    finally:
        parent.kill()
        parent.wait()
    assert wait_gone(server)


def spawn_then_hang(completion: str, record: dict) -> float:
    """A checker that starts a helper process (in its worker's process group), then hangs."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path(record["pid_file"]).write_text(str(child.pid))
    time.sleep(600)
    return 1.0


@pytest.mark.slow
def test_a_hung_worker_is_killed_with_its_process_group(tmp_path):
    assert score(spawn_then_hang, ["x"], [{"pid_file": str(tmp_path / "pid")}], workers=1, timeout=5.0) == ([0.0], 1)
    assert wait_gone(int((tmp_path / "pid").read_text()))


def test_symbolic_check_is_safe_in_threads():
    cases = [row for row in TABLE if "sqrt" in row[0] or "x^2" in row[0]] * 3
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda row: task.is_equiv(row[0], row[1], 60.0), cases))
    assert got == [row[2] for row in cases]


def test_load_12k_train_and_math500(monkeypatch, capsys):
    need_data()
    monkeypatch.setenv("RAPID_DATA_DIR", str(DATA))
    train, test = task.load("train"), task.load("test", grading_timeout_s=3.0)
    assert len(train) == 11998 and task.DROPPED["train"] == 2  # two empty \boxed{} answers dropped
    assert "dropped 2 of 12000 train records" in capsys.readouterr().out
    assert len(test) == 500 and test[0]["grading"] == {"timeout_s": 3.0}
    assert not {r["unique_id"] for r in train} & {r["unique_id"] for r in test}
    # Every reference solution earns full reward (string path, no sympy needed).
    assert all(task.reward(r["solution"], r) == 1.0 for r in test[:100])


def test_load_from_a_single_file_derives_missing_answers(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"problem": "1+1?", "solution": "It is \\boxed{2}."}, {"problem": "?", "solution": "\\boxed{}"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = task.load("test", data_path=str(path), unknown_key=1)
    assert [r["answer"] for r in records] == ["2"] and task.DROPPED["test"] == 1


def test_offline_hub_is_one_config_error(monkeypatch):
    monkeypatch.delenv("RAPID_DATA_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as on CI: not installed (never download)
    with pytest.raises(ConfigError, match="RAPID_DATA_DIR"):
        task.load("test")


class PlainTokenizer:
    """A tokenizer without a chat template that remembers the texts it was given."""

    chat_template = None

    def __call__(self, texts, add_special_tokens):
        self.texts = texts
        return {"input_ids": [[0]] * len(texts)}


def test_prompts_plain_template():
    tok = PlainTokenizer()
    task.build_prompts([{"problem": "What is 1+1?"}], tok, system="Box it.", use_chat_template=True)
    assert tok.texts == ["Box it.\n\nProblem: What is 1+1?\nSolution:"]


# --- rewards in parallel (rapid.rewards.score) --------------------------------------------------------
def flaky_reward(completion: str, record: dict) -> float:
    """A checker that hangs, crashes its process, raises, or answers, as the completion says."""
    if completion == "hang":
        time.sleep(600)
    if completion == "die":
        os._exit(3)
    if completion == "raise":
        raise ValueError("broken checker")
    return float(completion == record["answer"])


@pytest.mark.slow
def test_score_counts_crashes_and_timeouts_as_zero():
    completions = ["1", "hang", "2", "die", "raise", "x", "3", "die", "3"]
    records = [{"answer": a} for a in ["1", "1", "2", "1", "1", "1", "3", "1", "4"]]
    start = time.monotonic()
    rewards, failed = score(flaky_reward, completions, records, workers=2, timeout=2.0)
    assert rewards == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0] and failed == 4
    # The pool survives (replaced workers) and is reused for the next call.
    rewards, failed = score(flaky_reward, ["5", "raise"], [{"answer": "5"}] * 2, workers=2, timeout=2.0)
    assert (rewards, failed) == ([1.0, 0.0], 1)
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_score_inline_and_with_a_task_module():
    rewards, failed = score(flaky_reward, ["1", "raise"], [{"answer": "1"}] * 2, workers=0)
    assert (rewards, failed) == ([1.0, 0.0], 1)
    records = [{"answer": "\\frac{1}{\\sqrt{2}}"}, {"answer": "1", "grading": {"timeout_s": 1.0}}]
    completions = ["\\boxed{\\frac{\\sqrt{2}}{2}}", "\\boxed{(x+1)^{9999}}"]
    assert score(task, completions, records, workers=2, timeout=30.0) == ([1.0, 0.0], 1)  # the timeout counted
