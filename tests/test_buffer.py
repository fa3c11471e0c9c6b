import pytest
import torch

from rapid.buffer import ReplayBuffer, Rollout, collate


def rollouts(n_groups: int, group_size: int, ids=None) -> list[Rollout]:
    ids = ids or list(range(n_groups))
    out = []
    # interleave groups so that members of a group are not adjacent in insertion order
    for j in range(group_size):
        for g in ids:
            out.append(
                Rollout(
                    prompt_ids=[1, 2, g % 50 + 3],
                    completion_ids=[4] * (j + 1),
                    logp_mu=[-0.5] * (j + 1),
                    reward=float(j),
                    group_id=g,
                    truncated=False,
                )
            )
    return out


def test_minibatches_cover_round_once_with_whole_groups():
    buf = ReplayBuffer()
    buf.add(rollouts(8, 4, ids=[17, 3, 99, -2, 40, 5, 6, 1000]))
    batches = buf.minibatches(8, torch.Generator().manual_seed(0))
    assert len(batches) == 4  # H = 32 / 8
    seen = [id(r) for b in batches for r in b]
    assert len(seen) == 32 and len(set(seen)) == 32  # every record exactly once
    for b in batches:
        assert len(b) == 8
        counts = {}
        for r in b:
            counts[r.group_id] = counts.get(r.group_id, 0) + 1
        assert sorted(counts.values()) == [4, 4]  # two whole groups, never split
        # groups are contiguous inside a minibatch (micro-batching relies on it)
        assert [r.group_id for r in b][:4] == [b[0].group_id] * 4


def test_minibatch_order_reproducible_and_seed_dependent():
    buf = ReplayBuffer()
    buf.add(rollouts(16, 2))
    order = lambda seed: [[r.group_id for r in b] for b in buf.minibatches(4, torch.Generator().manual_seed(seed))]
    assert order(1) == order(1)
    assert order(1) != order(2)
    # shuffled: not the insertion order
    assert [g for b in order(1) for g in b][::2] != list(range(16))


def test_minibatches_reject_bad_sizes():
    buf = ReplayBuffer()
    buf.add(rollouts(3, 4))
    for n_step in (6, 8):  # 6 splits a group; 8 does not divide 12
        try:
            buf.minibatches(n_step, torch.Generator())
        except ValueError as e:
            assert "n_step" in str(e)
        else:
            raise AssertionError(f"n_step={n_step} accepted")


def test_collate_layout():
    mk = lambda p, c, gid: Rollout(
        prompt_ids=p,
        completion_ids=c,
        logp_mu=[-1.0 * (t + 1) for t in range(len(c))],
        reward=float(len(c)),
        group_id=gid,
        truncated=False,
    )
    records = [mk([5, 6, 7], [8, 9], 3), mk([5, 6, 7], [8], 3), mk([5], [8, 9, 10], 4), mk([5], [11], 4)]
    batch = collate(records, pad_id=0)
    assert batch.group_size == 2
    assert batch.prompt_ids.tolist() == [[5, 6, 7], [0, 0, 5]]  # one left-padded row per group
    assert batch.prompt_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.completion_ids.tolist() == [[8, 9, 0], [8, 0, 0], [8, 9, 10], [11, 0, 0]]
    assert batch.completion_mask.tolist() == [
        [True, True, False],
        [True, False, False],
        [True, True, True],
        [True, False, False],
    ]
    assert batch.logp_mu.tolist() == [[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0], [-1.0, -2.0, -3.0], [-1.0, 0.0, 0.0]]
    assert batch.rewards.tolist() == [2.0, 1.0, 3.0, 1.0] and batch.group_ids.tolist() == [3, 3, 4, 4]
    with pytest.raises(ValueError, match="whole groups"):
        collate(records[:3], pad_id=0)  # a split group


def test_keep_informative_groups_drops_exactly_the_all_equal_groups():
    from rapid.buffer import keep_informative_groups

    mk = lambda gid, r: Rollout(
        prompt_ids=[1], completion_ids=[2], logp_mu=[0.0], reward=r, group_id=gid, truncated=False
    )
    records = [mk(1, 0.0), mk(1, 0.0), mk(2, 1.0), mk(2, 0.0), mk(3, 1.0), mk(3, 1.0), mk(4, 0.5), mk(4, 0.0)]
    kept, dropped = keep_informative_groups(records)
    assert dropped == 2
    assert [(r.group_id, r.reward) for r in kept] == [(2, 1.0), (2, 0.0), (4, 0.5), (4, 0.0)]
    # members need not be adjacent; a group of one is dropped; unequal fractional rewards are kept
    ids, rewards = [4, 8, 4, 8, 4, 8, 2, 2, 6, 9, 9], [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.5, 0.25]
    kept, dropped = keep_informative_groups([mk(g, r) for g, r in zip(ids, rewards)])
    assert dropped == 3  # groups 4 (1, 1, 1), 2 (0, 0), 6 (one member)
    assert sorted((r.group_id, r.reward) for r in kept) == [(8, 0.0), (8, 0.0), (8, 1.0), (9, 0.25), (9, 0.5)]


def test_groups_with_gradient_keeps_what_each_baseline_needs():
    from rapid.buffer import groups_with_gradient

    mk = lambda gid, r: Rollout(
        prompt_ids=[1], completion_ids=[2], logp_mu=[0.0], reward=r, group_id=gid, truncated=False
    )
    records = [mk(1, 0.0), mk(1, 0.0), mk(2, 1.0), mk(2, 0.0), mk(3, 1.0), mk(3, 1.0), mk(4, -0.5), mk(4, -0.5)]
    ids = lambda recs: [r.group_id for r in recs]
    assert ids(groups_with_gradient(records, "equal_rewards")) == [2, 2]
    assert ids(groups_with_gradient(records, "zero_rewards")) == [2, 2, 3, 3, 4, 4]  # only the all-zero group goes
    all_zero = [mk(5, 0.0), mk(5, 0.0), mk(6, 0.0), mk(6, 0.0)]
    assert groups_with_gradient(all_zero, "zero_rewards") == []  # none left: the gradient is 0
    with pytest.raises(ValueError, match="equal_rewards"):
        groups_with_gradient(records, "uniform")


def test_dynamic_sampling_judges_groups_by_the_task_reward_not_the_overlong_penalty():
    """DAPO keeps a group with 0 < correct < G. With the overlong penalty added to the reward, a group
    that is all correct (or all wrong) but of different lengths has unequal rewards: it is still
    dropped. A group with correct and wrong answers is kept, whatever the penalties."""
    from rapid.buffer import keep_informative_groups

    def mk(gid, score, penalty):
        return Rollout(
            prompt_ids=[1],
            completion_ids=[2],
            logp_mu=[0.0],
            reward=score + penalty,
            group_id=gid,
            truncated=False,
            score=score,
        )

    records = [
        *[mk(1, 1.0, p) for p in (0.0, -0.1, 0.0, -0.2)],  # all correct, penalised unequally: dropped
        *[mk(2, 0.0, p) for p in (0.0, -0.5, 0.0, 0.0)],  # all wrong: dropped
        *[mk(3, s, p) for s, p in ((1.0, -1.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0))],  # 1 correct of 4: kept
    ]
    kept, dropped = keep_informative_groups(records)
    assert dropped == 2
    assert [(r.group_id, r.score, r.reward) for r in kept] == [
        (3, 1.0, 0.0),
        (3, 0.0, 0.0),
        (3, 0.0, 0.0),
        (3, 0.0, 0.0),
    ]
    # without a separate score (no shaping), the reward is the task's reward
    plain = Rollout(prompt_ids=[1], completion_ids=[2], logp_mu=[0.0], reward=0.5, group_id=0, truncated=False)
    assert plain.task_reward == 0.5


def group(gid: int, scores: list[float]) -> list[Rollout]:
    return [Rollout([1], [2], [0.0], s, group_id=gid, truncated=False) for s in scores]


def test_dynamic_sampling_samples_more_until_full_then_trims_to_whole_minibatches():
    """Target 8 records (4 groups of 2), minibatches of 4. The first batch keeps groups 0 and 2
    (1 and 3 are all-equal): 4 records. Attempt 1 adds group 10 (11 dropped): 6. Attempt 2 adds 20,
    21, 22: 12 >= 8, so no attempt 3. Trimmed to min(12, 8) // 4 * 4 = 8 records: groups 0, 2, 10, 20.
    Failures 1 + 2 + 0 = 3; dropped 2 + 1 + 0 = 3."""
    from rapid.buffer import dynamic_sampling

    first = group(0, [1, 0]) + group(1, [0, 0]) + group(2, [0, 1]) + group(3, [1, 1])
    more = {
        1: (group(10, [1, 0]) + group(11, [1, 1]), 2),
        2: (group(20, [0, 1]) + group(21, [1, 0]) + group(22, [1, 0]), 0),
        3: (group(30, [1, 0]), 0),
    }
    calls = []

    def sample_more(attempt, prompts):
        calls.append((attempt, prompts))
        return more[attempt]

    kept, failed, dropped, batches, generated = dynamic_sampling(
        first, 1, sample_more, 4, 8, 4, torch.device("cpu"), draw=4, n_group=2, budget=1000
    )
    assert calls == [(1, 4), (2, 4)]
    assert [r.group_id for r in kept] == [0, 0, 2, 2, 10, 10, 20, 20]
    assert (failed, dropped, batches, generated) == (3, 3, 3, 24)  # 3 draws of 4 prompts x 2 samples


def test_dynamic_sampling_trains_on_what_its_tries_found():
    """tries=2: one more batch at most. Kept 2 + 1 groups = 6 records of the 8 wanted, trimmed to one
    minibatch of 4 (groups 0 and 2; group 10 waits for no one). No informative group at all: a clear error."""
    from rapid.buffer import dynamic_sampling

    first = group(0, [1, 0]) + group(1, [0, 0]) + group(2, [0, 1])
    kept, failed, dropped, batches, generated = dynamic_sampling(
        first, 0, lambda attempt, k: (group(10, [1, 0]) + group(11, [0, 0]), 1), 2, 8, 4, torch.device("cpu"),
        draw=4, n_group=2, budget=1000,
    )  # fmt: skip
    assert [r.group_id for r in kept] == [0, 0, 2, 2]
    assert (failed, dropped, batches, generated) == (1, 2, 2, 16)
    with pytest.raises(RuntimeError, match="dynamic_sampling_tries"):
        dynamic_sampling(
            group(0, [0, 0]), 0, lambda attempt, k: (group(5, [1, 1]), 0), 3, 8, 4, torch.device("cpu"),
            draw=4, n_group=2, budget=1000,
        )  # fmt: skip


def test_dynamic_sampling_never_generates_past_the_budget():
    """The first batch is 4 prompts x 2 samples = 8 of a budget of 14: one more draw of min(4, (14 - 8) // 2)
    = 3 prompts, then the budget is spent (14 generated), although the round holds 6 records of the 8 wanted
    and tries remain. Kept: groups 0, 10, 12; trimmed to one minibatch of 4 (groups 0 and 10). Under two
    ranks a draw is a multiple of 2 prompts (every rank the same share): 2 prompts, 12 generated. Before,
    every draw was a whole batch of 4 prompts, so this round generated 16 (and up to 8 x tries)."""
    from rapid.buffer import dynamic_sampling

    first = group(0, [1, 0]) + group(1, [0, 0]) + group(2, [1, 1]) + group(3, [0, 0])
    calls = []

    def sample_more(attempt, prompts):
        calls.append((attempt, prompts))
        return group(10, [0, 1]) + group(11, [1, 1]) + group(12, [1, 0])[: 2 * prompts], 0

    kept, _, dropped, batches, generated = dynamic_sampling(
        first, 0, sample_more, 4, 8, 4, torch.device("cpu"), draw=4, n_group=2, budget=14
    )
    assert calls == [(1, 3)]
    assert [r.group_id for r in kept] == [0, 0, 10, 10]
    assert (dropped, batches, generated) == (4, 2, 14)
    calls.clear()
    *_, generated = dynamic_sampling(
        first, 0, sample_more, 4, 8, 4, torch.device("cpu"), draw=4, n_group=2, budget=14, world=2
    )
    assert calls == [(1, 2)] and generated == 12


def test_dynamic_sampling_ends_the_run_without_a_step_when_the_budget_is_spent():
    """The budget is the first batch (8 samples) and it keeps one group (2 records), less than one
    minibatch of 4: no draw, no error, no record (the run is over). With budget left but no tries left, the
    same round is an error that names the setting to raise."""
    from rapid.buffer import dynamic_sampling

    first = group(0, [1, 0]) + group(1, [0, 0]) + group(2, [1, 1]) + group(3, [0, 0])
    never = lambda attempt, k: pytest.fail("drew past the budget")  # noqa: E731
    kept, _, dropped, batches, generated = dynamic_sampling(
        first, 0, never, 4, 8, 4, torch.device("cpu"), draw=4, n_group=2, budget=8
    )
    assert (kept, dropped, batches, generated) == ([], 3, 1, 8)
    with pytest.raises(RuntimeError, match="dynamic_sampling_tries"):
        dynamic_sampling(first, 0, never, 1, 8, 4, torch.device("cpu"), draw=4, n_group=2, budget=100)


def test_schedule_positions_follow_the_samples_generated():
    """n_step 32, so the schedule's unit is 32 samples and 1,024 samples span 32 units.
    A fixed-H round (256 samples, 8 steps) from 256 samples: steps at 8, 9, ..., 15, round ends at 16 (what a
    step counter gives). DAPO's first round generated 768 samples (3 draws) and trains 8 steps: 24 units
    over 8 steps, steps at 0, 3, 6, ..., 21, end at 24. Its last round, 256 samples and 4 steps kept: 24, 26,
    28, 30, end at 32 = the budget. num_iterations 2 doubles the steps per sample: unit 16 samples.
    Three steps over 256 samples from 0: 0, 16/3, 32/3, end 16 (units of 16 samples)."""
    from rapid.buffer import schedule_positions

    assert schedule_positions(256, 256, 8, 32, 1) == [8, 9, 10, 11, 12, 13, 14, 15, 16]
    assert schedule_positions(0, 768, 8, 32, 1) == [0, 3, 6, 9, 12, 15, 18, 21, 24]
    assert schedule_positions(768, 256, 4, 32, 1) == [24, 26, 28, 30, 32]
    assert schedule_positions(0, 256, 16, 32, 2) == list(range(17))
    assert schedule_positions(0, 256, 3, 16, 1) == pytest.approx([0, 16 / 3, 32 / 3, 16], abs=1e-12)
    assert schedule_positions(992, 32, 0, 32, 1) == [32]  # no step: the round's end only


def test_set_schedule_position_applies_the_schedule_at_a_fractional_position():
    """Cosine over 32 units, lr 2e-5: at position 3, 2e-5 * (1 + cos(3 pi / 32)) / 2; cos(0.2945243) =
    0.9569403, so 1.9569403e-5; at 16/3, cos(0.5235988) = 0.8660254 (pi / 6): 1.8660254e-5; at 32, 0."""
    from rapid.buffer import set_schedule_position
    from rapid.train import lr_lambda

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2e-5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda("cosine", 0, 32))
    opt.step()
    for position, lr in ((3, 1.9569403e-5), (16 / 3, 1.8660254e-5), (32, 0.0)):
        set_schedule_position(sched, position)
        assert sched.last_epoch == position
        assert (
            opt.param_groups[0]["lr"] == pytest.approx(lr, abs=1e-12)
            and sched.get_last_lr()[0] == opt.param_groups[0]["lr"]
        )


def _dynamic_sampling_rank(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from rapid import distributed
    from rapid.buffer import dynamic_sampling

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    distributed._owned = distributed._ranks = True
    try:
        # rank 0 is full at once (two informative groups); rank 1 keeps one group per batch
        first = group(0, [1, 0]) + group(1, [0, 1]) if rank == 0 else group(0, [1, 0]) + group(1, [0, 0])
        calls = []

        def sample_more(attempt, prompts):
            calls.append(attempt)
            return group(10 * attempt, [0, 1]) + group(10 * attempt + 1, [1, 1]), 0

        kept, failed, dropped, batches, _ = dynamic_sampling(
            first, 0, sample_more, 5, 4, 2, torch.device("cpu"), draw=4, n_group=2, budget=1000, world=world
        )
        torch.save({"calls": calls, "kept": [r.group_id for r in kept], "batches": batches}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_dynamic_sampling_draws_alike_on_every_rank(tmp_path):
    """Under DDP every rank draws the same number of extra batches (its prompt stream stays aligned
    with the others'): rank 0, full after its first batch, samples as long as rank 1 needs to, and
    both report the batches the round generated. Each keeps (and trims to) its own records."""
    import torch.multiprocessing as mp

    mp.spawn(_dynamic_sampling_rank, args=(2, str(tmp_path / "store"), str(tmp_path / "out")), nprocs=2, join=True)
    r0, r1 = torch.load(f"{tmp_path}/out.0"), torch.load(f"{tmp_path}/out.1")
    assert r0["calls"] == r1["calls"] == [1]
    assert r0["batches"] == r1["batches"] == 2
    assert r0["kept"] == [0, 0, 1, 1]  # its first batch filled it; the extra batch is trimmed away
    assert r1["kept"] == [0, 0, 10, 10]


def test_lr_schedule_never_passes_its_end():
    """A last round that overshoots the planned steps keeps the final lr (0 for linear and cosine),
    rather than a negative lr (linear: gradient ascent) or a rising one (cosine)."""
    from rapid.train import lr_lambda

    for schedule in ("linear", "cosine"):
        f = lr_lambda(schedule, 2, 10)
        assert f(0) == pytest.approx(0.5) and f(2) == pytest.approx(1.0)
        assert f(10) == pytest.approx(0.0, abs=1e-12)
        assert f(13) == pytest.approx(0.0, abs=1e-12) and f(20) == pytest.approx(0.0, abs=1e-12)
    assert lr_lambda("linear", 0, 10)(5) == pytest.approx(0.5)
    assert lr_lambda("cosine", 0, 10)(5) == pytest.approx(0.5)
    assert lr_lambda("constant", 0, 10)(30) == 1.0
