import json
import math
import subprocess
import sys
from itertools import combinations

import pytest

from rapid.evaluate import pass_at_k
from tests.test_train import REPO, command, env_for


@pytest.mark.parametrize(
    "n, c, k, want",
    [
        (8, 2, 1, 2 / 8),  # pass@1 = c / n
        (5, 1, 2, 1 - 6 / 10),  # 1 - C(4,2)/C(5,2)
        (8, 0, 8, 0.0),
        (8, 1, 8, 1.0),
        (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),
        (4, 3, 2, 1.0),  # fewer than k wrong samples: always a hit
    ],
)
def test_pass_at_k_by_hand(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_k_matches_enumeration():
    """The estimator equals the fraction of k-subsets of the n samples that hold a correct one."""
    for n, c, k in [(6, 2, 3), (7, 1, 2), (5, 4, 1)]:
        samples = [1] * c + [0] * (n - c)
        subsets = list(combinations(range(n), k))
        hits = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(hits, abs=1e-12)
    with pytest.raises(ValueError, match="pass@9"):
        pass_at_k(8, 1, 9)


@pytest.mark.slow
def test_evaluate_a_training_checkpoint(tmp_path):
    run = tmp_path / "run"
    subprocess.run(
        command(["+experiment=smoke", "rounds=1", f"hydra.run.dir={run}"], tmp_path),
        cwd=REPO,
        env=env_for(tmp_path),
        check=True,
        capture_output=True,
        timeout=300,
    )
    ckpt = run / "checkpoints" / "round_000001"
    out = tmp_path / "eval"
    args = [
        f"eval.checkpoint={ckpt}",
        "+experiment=smoke",
        "sampler=hf",
        "eval.n_samples=4",
        "eval.ks=[1,2,8]",
        f"hydra.run.dir={out}",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "rapid.evaluate", *args],
        cwd=REPO,
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads((out / "eval.json").read_text())
    assert row["eval/n"] == 16 and row["task"] == "arithmetic" and row["model"].endswith("model")
    assert set(k for k in row if k.startswith("eval/pass@")) == {"eval/pass@1", "eval/pass@2"}  # 8 > n_samples
    assert 0.0 <= row["eval/pass@1"] <= row["eval/pass@2"] <= 1.0
