"""tools/cost_model.py: the prediction math against hand-computed values, and a smoke run of the measuring
tool on the tiny random model with the real vLLM engine (then a prediction from its saved JSON)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.test_train import REPO, env_for
from tools import cost_model


def made_up(**changes) -> dict:
    """A measurement with round numbers: a decoding step costs 0.1 s at 1 sequence, 0.15 at 2, 0.2 at 4, 0.25
    at 8; training micro-batches cost 0.05 + 0.01 * records + 0.002 * records * padded length (forward only: a
    third of each coefficient); the optimizer step 0.03 s, the weight sync 0.16 s, a reward 1 ms."""
    cm = {
        "completion_len": 3,
        "generation": {"sizes": [1, 2, 4, 8], "first_s": [0.5, 0.6, 0.8, 0.4], "step_s": [0.1, 0.15, 0.2, 0.1]},
        "train": {
            "fwd_bwd_fit": {"a": 0.05, "per_record": 0.01, "per_token": 0.002},
            "fwd_fit": {"a": 0.05 / 3, "per_record": 0.01 / 3, "per_token": 0.002 / 3},
            "optimizer_step_s": 0.03,
        },
        "sync_s": 0.16,
        "reward_s_per_sample": 0.001,
    }
    return cm | changes


def test_loglog_interpolation_follows_a_power_law_and_extrapolates_per_sequence():
    xs, ys = [1, 4, 16], [1.0, 16.0, 64.0]
    assert cost_model.interp_loglog(xs, ys, 2) == pytest.approx(4.0)  # y = x^2 between 1 and 4
    assert cost_model.interp_loglog(xs, ys, 8) == pytest.approx(32.0)  # y = 4x between 4 and 16
    assert cost_model.interp_loglog(xs, ys, 4) == pytest.approx(16.0)
    assert cost_model.interp_loglog(xs, ys, 0.5) == 1.0  # below: the smallest size's
    assert cost_model.interp_loglog(xs, ys, 64) == pytest.approx(256.0)  # above: 64 * (64 / 16)


def test_a_call_pays_for_every_step_of_its_running_sequences():
    g = made_up()["generation"]
    # fixed lengths: first_s(4) + 4 more steps at 4 sequences = 0.8 + 4 * 0.2
    assert cost_model.call_seconds(g, [5, 5, 5, 5]) == pytest.approx(1.6)
    # lengths 2, 2, 6, 10: first_s(4) = 0.8; step 2 with 4 running: 0.2; steps 3-6 with 2: 4 * 0.15;
    # steps 7-10 with 1: 4 * 0.1  ->  0.8 + 0.2 + 0.6 + 0.4 = 2.0
    assert cost_model.call_seconds(g, [10, 2, 6, 2]) == pytest.approx(2.0)
    assert cost_model.call_seconds(g, [1, 1]) == pytest.approx(0.6)  # one token each: first_s(2) only


def test_microbatch_fit_recovers_a_linear_cost():
    points = [
        {"records": m, "completion_len": c, "t": 0.1 + 0.02 * m + 0.001 * m * c}
        for m, c in ((4, 10), (4, 20), (8, 10), (8, 30), (4, 40))
    ]
    fit = cost_model.fit_microbatch(points, "t")
    assert fit == pytest.approx({"a": 0.1, "per_record": 0.02, "per_token": 0.001})
    assert cost_model.microbatch_seconds(fit, 16, 100) == pytest.approx(0.1 + 0.32 + 1.6)
    with pytest.raises(ValueError, match="two record counts"):
        cost_model.fit_microbatch([p for p in points if p["records"] == 4], "t")


def test_prediction_per_sample_by_hand():
    cm = made_up()
    # H = 2, n_step = 4, n_group = 4, completions of 3 tokens: one call of 8 sequences,
    # first_s(8) + 2 steps = 0.4 + 2 * 0.1 = 0.6 s -> 0.075 s per sample;
    # two minibatches of one micro-batch of 4 x 3: 0.05 + 0.04 + 0.024 = 0.114, plus the optimizer step
    # 0.03: 2 * 0.144 = 0.288 s -> 0.036 per sample; sync 0.16 / 8 = 0.02; reward 0.001.
    row = cost_model.predict(cm, H=2, n_step=4, n_group=4, micro_batch=32)
    assert row["generate"] == pytest.approx(0.075) and row["train"] == pytest.approx(0.036)
    assert row["sync"] == pytest.approx(0.02) and row["reward"] == pytest.approx(0.001)
    assert row["total"] == pytest.approx(0.132) and row["recompute"] == 0.0
    assert row["n_inference"] == 8 and not row["extrapolated"]
    # GRPO's reference forward adds a forward per micro-batch: 2 * 0.114 / 3 / 8 = 0.0095 per sample
    grpo = cost_model.predict(cm, H=2, n_step=4, n_group=4, micro_batch=32, reference=True)
    assert grpo["train"] - row["train"] == pytest.approx(0.0095)
    # the recompute forward runs once over the round's 8 records in micro-batches of 4: the same 0.0095
    again = cost_model.predict(cm, H=2, n_step=4, n_group=4, micro_batch=32, recompute=True)
    assert again["recompute"] == pytest.approx(0.0095)
    # micro-batches of 2 records (train.micro_batch = 2 < n_step): per minibatch 2 * (0.05 + 0.02 + 0.012)
    # + 0.03 = 0.194; two of them -> 0.388 / 8 = 0.0485
    assert cost_model.predict(cm, H=2, n_step=4, n_group=2, micro_batch=2)["train"] == pytest.approx(0.0485)
    # H = 1 (PG): a call of 4: first_s(4) + 2 steps = 1.2 -> 0.3 per sample; train 0.144 / 4; sync 0.04
    pg = cost_model.predict(cm, H=1, n_step=4, n_group=4, micro_batch=32)
    assert pg["total"] == pytest.approx(0.3 + 0.036 + 0.04 + 0.001)
    # 16 sequences lie beyond the measured 8: at the cost per sequence of 8 (first 0.8, step 0.2)
    big = cost_model.predict(cm, H=4, n_step=4, n_group=4, micro_batch=32)
    assert big["extrapolated"] and big["generate"] == pytest.approx((0.8 + 2 * 0.2) / 16)


def test_lengths_drawn_from_groups():
    cm = made_up()
    # one group of lengths 2, 2, 2, 10 (every draw is this group): the call costs first_s(4) + one step at 4
    # + 8 steps at 1 = 0.8 + 0.2 + 0.8 = 1.8; the micro-batch is padded to 10: 0.05 + 0.04 + 0.08 = 0.17, + 0.03
    row = cost_model.predict(
        cm, H=1, n_step=4, n_group=4, micro_batch=4, length_groups=[[2, 2, 2, 10]], completion_len=4
    )
    assert row["generate"] == pytest.approx(1.8 / 4) and row["train"] == pytest.approx(0.2 / 4)
    # rescaled to a mean of 8: lengths 4, 4, 4, 20
    assert cost_model.scaled_groups([[2, 2, 2, 10]], 8) == [[4, 4, 4, 20]]
    # two groups, all-2 or all-6, equally likely: the expectation is the mean of the two fixed-length rounds
    short = cost_model.predict(cm, H=1, n_step=4, n_group=4, micro_batch=4, completion_len=2)
    long = cost_model.predict(cm, H=1, n_step=4, n_group=4, micro_batch=4, completion_len=6)
    mixed = cost_model.predict(
        cm, H=1, n_step=4, n_group=4, micro_batch=4, length_groups=[[2] * 4, [6] * 4], completion_len=4, draws=4000
    )
    assert mixed["total"] == pytest.approx(
        (short["total"] + long["total"]) / 2, abs=0.05 * (long["total"] - short["total"])
    )
    # groups of another size than n_group: lengths drawn one by one
    assert len(cost_model.draw_lengths([[1, 2, 3]], 2, 4, __import__("numpy").random.default_rng(0))) == 8


def test_recommendation_is_the_smallest_h_within_tolerance():
    rows = [{"H": h, "total": t} for h, t in ((1, 10.0), (2, 6.0), (4, 5.1), (8, 5.0), (16, 4.9))]
    pick, best = cost_model.recommend(rows, 0.05)  # 4.9 * 1.05 = 5.145: H = 4 is the first below
    assert (pick["H"], best["H"]) == (4, 16)
    assert cost_model.recommend(rows, 0.0)[0]["H"] == 16


def test_controller_view_uses_adaptive_h_and_matches_a_linear_generation_cost():
    """Generation linear in the call size at the measured sizes: first_s(B) = 0.3 + 0.1 B, step_s(B) = 0.05 +
    0.01 B, 3 tokens -> a call of B costs 0.4 + 0.12 B, so adaptive_h's fit gives α 0.4, β 0.12. n_step 2,
    n_group 2: a step trains one micro-batch of 2 x 3 (0.05 + 0.02 + 0.012) + the optimizer 0.03 = 0.112 s,
    0.056 per sample, + reward 0.001: λ = 0.057; F = the sync 0.16. c(H) = 0.177 + 0.28 / H: 0.457, 0.317,
    0.247 for H = 1, 2, 4, the detailed prediction's totals too."""
    cm = made_up(
        generation={"sizes": [1, 2, 4, 8], "first_s": [0.4, 0.5, 0.7, 1.1], "step_s": [0.06, 0.07, 0.09, 0.13]}
    )
    block = [cost_model.predict(cm, H=h, n_step=2, n_group=2, micro_batch=32) for h in (1, 2, 4)]
    view = cost_model.controller_view(block, 0.05)
    assert (view["alpha_s"], view["beta_s"]) == (pytest.approx(0.4), pytest.approx(0.12))
    assert (view["per_sample_s"], view["per_round_s"]) == (pytest.approx(0.057), pytest.approx(0.16))
    assert view["cost"] == pytest.approx({1: 0.457, 2: 0.317, 4: 0.247})
    assert [view["cost"][r["H"]] for r in block] == pytest.approx([r["total"] for r in block])
    # 0.247 * 1.05 = 0.259: only H = 4; 0.247 * 1.3 = 0.321 takes H = 2 (0.317)
    assert view["H"] == 4 and cost_model.controller_view(block, 0.3)["H"] == 2
    assert cost_model.controller_view(block[:1]) is None  # one size: α and β cannot be told apart
    # made_up's own curve: calls of 2, 4, 8 cost 0.9, 1.2, 0.6 s; the slope is negative, so adaptive_h
    # puts it all per round: α = the mean 0.9, β = 0
    view = cost_model.controller_view(
        [cost_model.predict(made_up(), H=h, n_step=2, n_group=2, micro_batch=32) for h in (1, 2, 4)]
    )
    assert (view["alpha_s"], view["beta_s"]) == (pytest.approx(0.9), 0.0)
    table, _ = cost_model.prediction_table(cm, [1, 2, 4], [2], 2, 32)
    assert (
        "c(H) H=1: 457.0, H=2: 317.0, H=4: 247.0 s / 1k samples" in table
        and "cost choice without the staleness cap: H = 4" in table
    )


def test_hypothetical_memory_bound_profile():
    cm = made_up()
    hyp = cost_model.hypothetical(cm, decode_step_s=0.01, decode_saturation=4, train_scale=0.5, gen_scale=2.0)
    g = hyp["generation"]
    # a flat step of 0.01 up to 4 sequences, 0.01 * b / 4 beyond, then x2 for gen_scale
    assert cost_model.interp_loglog(g["sizes"], g["step_s"], 2) == pytest.approx(0.02)
    assert cost_model.interp_loglog(g["sizes"], g["step_s"], 16) == pytest.approx(0.08)
    # H = 1, n_step 4, length 3: call = 3 steps of 0.02 = 0.06 -> 0.015 per sample; train (0.114 + 0.03) / 2 / 4;
    # sync 0.08 / 4; reward 0.001 unchanged
    row = cost_model.predict(hyp, H=1, n_step=4, n_group=4, micro_batch=32)
    assert row["total"] == pytest.approx(0.015 + 0.018 + 0.02 + 0.001)
    assert cm["train"]["optimizer_step_s"] == 0.03  # the measurement itself is untouched
    table, rows = cost_model.prediction_table(hyp, [1, 2, 4, 8], [4], 4, 32)
    assert "Recommended H" in table and len(rows) == 4


def test_machine_info_names_the_cpu():
    info = cost_model.machine_info()
    assert info["cpu_model"] and info["cpu_cores"] >= 1
    if "avx2" in open("/proc/cpuinfo").read():
        assert "avx2" in info["vector_extensions"]


@pytest.mark.slow
def test_measures_the_tiny_model_then_predicts_from_its_json(tmp_path):
    """The real tool on the tiny random model and the vLLM engine: 2 call sizes, 4-token completions."""
    out = tmp_path / "cm.json"
    env = env_for(tmp_path, OMP_NUM_THREADS="2")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "cost_model.py"),
            "+experiment=smoke",
            "sampler=vllm",
            "--sizes",
            "1",
            "4",
            "--completion-len",
            "4",
            "--repeats",
            "1",
            "--h",
            "1",
            "2",
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cm = json.loads(out.read_text())
    assert cm["generation"]["sizes"] == [1, 4] and cm["completion_len"] == 4 and cm["sampler"] == "vllm"
    assert all(t > 0 for t in cm["generation"]["call_s"] + cm["generation"]["first_s"])
    assert cm["sync_s"] > 0 and cm["train"]["optimizer_step_s"] > 0 and len(cm["train"]["points"]) == 5
    assert cm["machine"]["cpu_model"] and cm["config"]["n_step"] == 8
    assert [r["H"] for r in cm["predictions"]] == [1, 2]
    # H = 1 at n_step 8: one call of 8 sequences, past the measured 4: at 4's cost per sequence
    g = cm["generation"]
    gen_per_sample = (g["first_s"][1] + 3 * g["step_s"][1]) / 4
    assert cm["predictions"][0]["generate"] == pytest.approx(gen_per_sample, rel=1e-6)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "cost_model.py"),
            "--predict",
            str(out),
            "--h",
            "1",
            "2",
            "--n-step",
            "8",
            "--out",
            str(tmp_path / "again.json"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = json.loads((tmp_path / "again.json").read_text())
    assert [r["total"] for r in again["predictions"]] == pytest.approx([r["total"] for r in cm["predictions"]])
    assert "Recommended H" in (tmp_path / "again.md").read_text()
    bad = subprocess.run(
        [sys.executable, str(REPO / "tools" / "cost_model.py"), "--predict", str(tmp_path / "none.json")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "does not exist" in bad.stdout and "Traceback" not in bad.stderr


def test_cpu_clock_needs_one_thread_on_one_core(tmp_path):
    """Process CPU time stands for wall time only with one thread on one core; otherwise one clear sentence
    (here OMP_NUM_THREADS=2, whatever cores the test may use)."""
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "cost_model.py"),
            "+experiment=smoke",
            "--clock",
            "cpu",
            "--out",
            str(tmp_path / "cm.json"),
        ],
        cwd=REPO,
        env=env_for(tmp_path, OMP_NUM_THREADS="2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "one thread on one core" in proc.stdout and "Traceback" not in proc.stderr


def test_the_reference_forward_is_predicted_from_the_loss_declaration():
    """Whether a prediction adds the reference model's forward comes from the loss's declaration in the
    registry (rapid.estimators `reference`), not its name: a loss registered here with a reference is
    predicted with one, and the earlier KL name (kl_coef) of a stored cost_model.json still reads."""
    from rapid import estimators

    assert cost_model.needs_reference({"loss": "grpo", "beta": 0.04})
    assert not cost_model.needs_reference({"loss": "grpo", "kl_coef": 0.0})  # a cost_model.json of before
    assert not cost_model.needs_reference({"loss": "iw_grpg", "beta": 0.0})
    estimators.register("always_anchored", level="token", reference=True)(lambda x, a: None)
    try:
        assert cost_model.needs_reference({"loss": "always_anchored"})
    finally:
        del estimators.REGISTRY["always_anchored"]
