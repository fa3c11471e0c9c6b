"""Groups that span ranks (the paper's n_step 4, n_group 4 on 4 GPUs): 2 and 4 gloo ranks each hold a
slice of one group per step and give the single-process update.

Three AdamW steps on one group each, n_step = n_group = 4: step 1 at θ = μ (w = 1), step 2 off-policy
(w != 1, so IW-GRPG's Eq. 4/5 baseline needs every member's current w̄, gathered from the other ranks
before the backward), step 3 on an all-zero group (skipped by IW-GRPG: its statistics must not enter
the ESS). Each rank's slice of a group is run alone; without the gathered group (each rank baselining
its own slice) the parameters differ, which the test checks too, so that it can fail.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from rapid import estimators
from rapid.buffer import Rollout, collate, rank_share
from rapid.iw_grpg import normalized_ess
from rapid.policy import CompletionLogprobs, accumulate_gradients, completion_logprobs
from tests.helpers import own_groups, tiny_model

CPU = torch.device("cpu")
PAD = 0  # the character tokenizer's <pad>
LOSSES = {  # name: (registered loss, its settings, zero-advantage groups skipped)
    "iw_grpg": ("iw_grpg", dict(eta=2.0, leave_one_out=False, iw_baseline=True, iw_gradient=True), "zero_rewards"),
    "iw_grpg_loo": ("iw_grpg", dict(eta=2.0, leave_one_out=True, iw_baseline=True, iw_gradient=True), "zero_rewards"),
    "dapo": ("dapo", dict(eps_low=0.2, eps_high=0.28), "equal_rewards"),  # token-mean normaliser
}
LENGTHS = ([3, 7, 2, 5], [6, 1, 4, 8], [2, 3, 2, 3])
REWARDS = ([1.0, 0.0, 0.0, 1.0], [0.5, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0])  # the last: all zero
LR = 0.05  # plain SGD: parameter differences are gradient differences (Adam would magnify float noise)


def records(model, tokenizer) -> list[list[Rollout]]:
    """Three minibatches of one group of 4; log μ the model's own (θ = μ at the first step)."""
    return own_groups(model, tokenizer, ["What is 2 + 3?", "Hi there", "Name a prime"], LENGTHS, REWARDS, PAD)


def loss_fn_for(name: str):
    loss, settings, _ = LOSSES[name]
    a = {"loss": loss, **settings}

    def loss_fn(token_logp, batch, n_records, n_tokens, peers=None):
        x = estimators.LossInputs(
            token_logp,
            batch.logp_mu,
            batch.completion_mask,
            batch.rewards,
            batch.group_ids,
            None,
            n_records,
            n_tokens,
            16,
            peers,
        )
        return estimators.compute(loss, x, a)

    return loss_fn


def train(name: str, policy, model, minibatches, spanning: bool) -> tuple[dict, list]:
    """Three AdamW steps; the parameters after them and the (step, ESS) pairs over all ranks."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    ess = []
    for step, minibatch in enumerate(minibatches, 1):
        stats = accumulate_gradients(
            policy,
            minibatch,
            loss_fn_for(name),
            micro_batch=4,
            pad_id=PAD,
            device=CPU,
            compute_dtype=torch.float32,
            skip_groups=LOSSES[name][2],
            spanning=spanning,
        )
        if "w_bar_mean" in stats:
            n = stats["records"]
            moments = torch.tensor([stats["w_bar_mean"] * n, stats["w_bar_sq_mean"] * n, n], dtype=torch.float64)
            if isinstance(policy, DistributedDataParallel):  # ranks of this test, not any default group
                dist.all_reduce(moments, group=policy.process_group)
            w1, w2, n = moments.tolist()
            if n > 0:
                ess.append((step, normalized_ess(w1 / n, w2 / n)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, ess


def rank_main(rank: int, world: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for name in LOSSES:
            for spanning in (True, False) if name != "iw_grpg_loo" else (True,):
                # spanning=False: each rank's slice baselined as if it were the whole group (wrong)
                model, tok = tiny_model()
                mine = rank_share(records(model, tok), rank, world)
                policy = DistributedDataParallel(CompletionLogprobs(model, 1.0))
                results[name, spanning] = train(name, policy, model, mine, spanning)
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_groups_spanning_ranks_equal_single_process(tmp_path, world):
    out = tmp_path / "params.pt"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(rank_main, args=(world, str(tmp_path / "store"), str(out)), nprocs=world, join=True)
    ddp = torch.load(out)
    for name in LOSSES:
        model, tok = tiny_model()
        start = {k: v.clone() for k, v in model.state_dict().items()}
        minibatches = records(model, tok)
        # the second step is off-policy: its weights are not 1 under the parameters after step 1
        single, ess = train(name, CompletionLogprobs(model, 1.0), model, minibatches, spanning=False)
        assert max((single[k] - start[k]).abs().max().item() for k in start) > 1e-3  # not vacuous
        spanned, ess_spanned = ddp[name, True]
        for k in single:
            torch.testing.assert_close(spanned[k], single[k], rtol=1e-5, atol=1e-6, msg=f"{name} {k}")
        if (name, False) in ddp:
            naive, _ = ddp[name, False]  # slices baselined alone: a different update
            assert max((naive[k] - single[k]).abs().max().item() for k in single) > 1e-4, name
        if name.startswith("iw_grpg"):
            # the all-zero group (step 3) is skipped: no ESS entry, on one process and over ranks
            assert [s for s, _ in ess] == [1, 2] == [s for s, _ in ess_spanned]
            assert ess[0][1] == pytest.approx(1.0, abs=1e-6) and ess[1][1] < 1 - 1e-4  # step 2: w != 1
            assert ess_spanned[1][1] == pytest.approx(ess[1][1], rel=1e-5)


def test_off_policy_weights_of_the_second_step():
    """The test's second step really is off-policy for IW-GRPG: after one AdamW step at lr 3e-2 the
    group's weights w = π_θ/μ are far from 1 (so the gathered w̄ matter)."""
    model, tok = tiny_model()
    minibatches = records(model, tok)
    train("iw_grpg", CompletionLogprobs(model, 1.0), model, minibatches[:1], spanning=False)
    with torch.no_grad():
        batch = collate(minibatches[1], PAD)
        logp = completion_logprobs(CompletionLogprobs(model, 1.0), batch)
    log_w = ((logp - batch.logp_mu) * batch.completion_mask).sum(-1)
    assert log_w.abs().max() > 0.1, log_w


def placeholder_main(rank: int, world: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model, tok = tiny_model()
        groups = records(model, tok)
        mine = groups[1] if rank == 0 else groups[2]  # rank 1: the all-zero group, nothing to train
        stats = accumulate_gradients(
            DistributedDataParallel(CompletionLogprobs(model, 1.0)),
            mine,
            loss_fn_for("iw_grpg"),
            micro_batch=4,
            pad_id=PAD,
            device=CPU,
            compute_dtype=torch.float32,
            skip_groups="zero_rewards",
        )
        torch.save(stats, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_placeholder_group_reports_no_records(tmp_path):
    """Under DDP a rank whose groups are all skipped runs its first group (to join the all-reduce), but
    its stats describe no record: `records` 0 and `trained_frac` 0, so that rapid.train keeps its
    weights out of the ESS and the iw/* statistics."""
    out = tmp_path / "stats"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(placeholder_main, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    trained, placeholder = torch.load(f"{out}.0"), torch.load(f"{out}.1")
    assert trained["records"] == 4 and trained["trained_frac"] == 1.0
    assert placeholder["records"] == 0 and placeholder["trained_frac"] == 0.0
    assert "w_bar_mean" in placeholder  # it ran (the gradient all-reduce), but counts for nothing


def test_step_statistics_average_records_not_ranks():
    """Two ranks, two steps: rank 0 trains 3 records at step 1 (staleness 0.1), rank 1 one record (0.5) and
    then only a placeholder group (records 0, staleness 9.0) at step 2, where rank 0 has 0.2 over 4.
    Record-weighted per step: step 1 (3·0.1 + 0.5)/4 = 0.2, step 2 0.2 (the placeholder's 9.0 out);
    the round's mean over steps 0.2. `loss` and `trained_frac` are a rank's share of the minibatch's
    and average over ranks: loss (1.0 + 3.0)/2 = 2.0 and (2.0 + 0.0)/2 = 1.0, mean 1.5."""
    from rapid.logger import step_means, step_sums

    keys = ["staleness", "loss", "trained_frac"]
    rank0 = [
        {"staleness": 0.1, "loss": 1.0, "trained_frac": 0.75, "records": 3},
        {"staleness": 0.2, "loss": 2.0, "trained_frac": 1.0, "records": 4},
    ]
    rank1 = [
        {"staleness": 0.5, "loss": 3.0, "trained_frac": 0.25, "records": 1},
        {"staleness": 9.0, "loss": 0.0, "trained_frac": 0.0, "records": 0},
    ]
    a, b = step_sums(rank0, keys), step_sums(rank1, keys)
    sums = {k: a[k] + b[k] for k in a}  # what all_reduce_sum_dict returns
    assert step_means(sums, 2, "staleness", world=2) == pytest.approx(0.2, abs=1e-12)
    assert step_means(sums, 2, "loss", world=2) == pytest.approx(1.5, abs=1e-12)
    assert step_means(sums, 2, "trained_frac", world=2) == pytest.approx(0.5, abs=1e-12)


@pytest.mark.parametrize(
    ("world", "n_step", "n_group", "accepted"),
    [
        (4, 4, 4, True),  # the paper's: one record of one group per rank
        (2, 4, 4, True),  # two records of one group per rank
        (2, 16, 4, True),  # whole groups per rank, as before
        (4, 24, 8, False),  # 6 records per rank: neither whole groups nor equal slices of one
        (3, 4, 4, False),  # 4 records do not split over 3 ranks
    ],
)
def test_world_size_check(world, n_step, n_group, accepted):
    from hydra import compose, initialize_config_dir

    from rapid.config import ConfigError, register_resolvers, validate
    from tests.test_train import REPO

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(
            "config",
            overrides=[
                "+experiment=smoke",
                f"algorithm.n_step={n_step}",
                f"algorithm.n_group={n_group}",
                f"train.micro_batch={n_group}",
            ],
        )
    if accepted:
        validate(cfg, world=world)
    else:
        with pytest.raises(ConfigError, match=f"algorithm.n_step={n_step} must split over {world} ranks"):
            validate(cfg, world=world)
