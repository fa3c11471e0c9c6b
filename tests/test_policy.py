import copy

import pytest
import torch

from rapid.buffer import ReplayBuffer, Rollout, collate
from rapid.iw_grpg import iw_grpg_loss, sequence_logprobs
from rapid.policy import CompletionLogprobs, accumulate_gradients, completion_logprobs, recompute_behavior_logprobs
from tests.helpers import encode, tiny_model

CPU = torch.device("cpu")


def make_rollouts(tokenizer, n_groups=3, group_size=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = encode(tokenizer, ["What is 2 + 3?", "Hi", "A much longer prompt than the others."])
    out = []
    for k in range(n_groups):
        for _ in range(group_size):
            length = int(torch.randint(1, 9, (), generator=g))
            comp = torch.randint(3, len(tokenizer), (length,), generator=g).tolist()
            out.append(
                Rollout(
                    prompt_ids=prompts[k % len(prompts)],
                    completion_ids=comp,
                    logp_mu=(-torch.rand(length, generator=g) * 3).tolist(),
                    reward=float(torch.randint(0, 2, (), generator=g)),
                    group_id=10 + k,
                    truncated=False,
                )
            )
    return out


@pytest.mark.parametrize("share_prompt", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completion_logprobs_equal_manual_log_softmax(temperature, share_prompt):
    model, tok = tiny_model()
    records = make_rollouts(tok)
    batch = collate(records, tok.pad_token_id)
    with torch.no_grad():
        got = completion_logprobs(CompletionLogprobs(model, temperature, share_prompt), batch)
        for i, r in enumerate(records):
            # unpadded, one sequence at a time, full logits: an independent computation
            ids = torch.tensor([r.prompt_ids + r.completion_ids])
            logits = model(input_ids=ids).logits[0].double() / temperature
            logp = torch.log_softmax(logits, -1)
            p, c = len(r.prompt_ids), len(r.completion_ids)
            want = torch.stack([logp[p - 1 + t, r.completion_ids[t]] for t in range(c)])
            torch.testing.assert_close(got[i, :c].double(), want, atol=2e-5, rtol=0)
            assert torch.all(got[i, c:] == 0)


def test_micro_batches_and_shared_prompts_equal_full_minibatch():
    model, tok = tiny_model()
    records = make_rollouts(tok, n_groups=4)
    # a behaviour policy near π_θ: its per-token log-probs plus noise, so the weights spread around 1
    with torch.no_grad():
        true = completion_logprobs(CompletionLogprobs(model, 1.0), collate(records, tok.pad_token_id))
    g = torch.Generator().manual_seed(1)
    for i, r in enumerate(records):
        c = len(r.completion_ids)
        r.logp_mu = (true[i, :c] + 0.7 * torch.randn(c, generator=g)).tolist()

    def loss_fn(token_logp, batch, normalizer, n_tokens):
        logp = sequence_logprobs(token_logp, batch.completion_mask)
        logp_mu = sequence_logprobs(batch.logp_mu, batch.completion_mask)
        return iw_grpg_loss(logp, logp_mu, batch.rewards, batch.group_ids, eta=2.0, normalizer=normalizer)

    grads, stats = [], []
    for micro, share in ((16, True), (4, True), (8, True), (16, False), (4, False)):
        m = copy.deepcopy(model)
        s = accumulate_gradients(
            CompletionLogprobs(m, 1.0, share),
            records,
            loss_fn,
            micro_batch=micro,
            pad_id=tok.pad_token_id,
            device=torch.device("cpu"),
            compute_dtype=torch.float32,
        )
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
        stats.append(s)
    assert grads[0].abs().max() > 0
    for g, s in zip(grads[1:], stats[1:]):
        torch.testing.assert_close(g, grads[0], atol=2e-6, rtol=1e-4)
        for key in ("loss", "clip_frac", "staleness", "iw_mean", "iw_max"):
            assert s[key] == pytest.approx(stats[0][key], rel=1e-5, abs=1e-7), key
    assert 0 < stats[0]["clip_frac"] < 1  # some weights above eta, not all


def test_gradient_checkpointing_gives_the_same_gradient():
    model, tok = tiny_model()
    records = make_rollouts(tok, n_groups=2)
    loss_fn = lambda token_logp, batch, normalizer, n_tokens: (
        (token_logp.sum(-1) * batch.rewards).sum() / normalizer,
        {},
    )
    grads = []
    for checkpointing in (False, True):
        m = copy.deepcopy(model).train()
        if checkpointing:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        accumulate_gradients(
            CompletionLogprobs(m, 1.0, share_prompt=not checkpointing),
            records,
            loss_fn,
            micro_batch=4,
            pad_id=tok.pad_token_id,
            device=torch.device("cpu"),
            compute_dtype=torch.float32,
        )
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], atol=2e-6, rtol=1e-4)


def test_recompute_runs_in_the_micro_batches_of_the_first_pass():
    """In bf16 a record's log-probs depend on the batch it is computed in, so the recomputed log μ
    must come from exactly the micro-batches accumulate_gradients will run: the same rows in the same
    order. The sampler's log-probs are kept in logp_engine."""
    model, tok = tiny_model()
    records = make_rollouts(tok, n_groups=4)
    engine = [list(r.logp_mu) for r in records]
    buffer = ReplayBuffer()
    buffer.add(records)
    minibatches = buffer.minibatches(8, torch.Generator().manual_seed(3))  # 2 minibatches of 2 groups
    assert [r.group_id for r in minibatches[0]] != [r.group_id for r in records[:8]]  # a shuffled order

    seen = {"recompute": [], "train": []}

    class Spy(CompletionLogprobs):
        phase = "recompute"

        def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask):
            seen[self.phase].append(completion_ids.clone())
            return super().forward(prompt_ids, prompt_mask, completion_ids, completion_mask)

    policy = Spy(model, 1.0)
    recompute_behavior_logprobs(
        policy, minibatches, micro_batch=8, pad_id=tok.pad_token_id, device=CPU, compute_dtype=torch.bfloat16
    )
    policy.phase = "train"
    logp = []
    for mb in minibatches:

        def loss_fn(token_logp, batch, n_records, n_tokens):
            logp.append((token_logp.detach().float(), batch.logp_mu))
            return token_logp.sum() * 0.0, {}

        accumulate_gradients(
            policy, mb, loss_fn, micro_batch=8, pad_id=tok.pad_token_id, device=CPU, compute_dtype=torch.bfloat16
        )
    assert len(seen["recompute"]) == len(seen["train"]) == 2
    for a, b in zip(seen["recompute"], seen["train"]):
        assert torch.equal(a, b)
    for pi, mu in logp:  # θ = μ: the first pass sees w = 1 exactly
        assert torch.equal(pi, mu)
    assert all(r.logp_engine == e for r, e in zip(records, engine))


@pytest.mark.parametrize(
    ("loss", "skip", "exact"),
    [
        ("iw_grpg", "zero_rewards", True),
        ("iw_grpg_loo", "zero_rewards", True),
        ("iw_grpg_plain_baseline", "equal_rewards", True),
        ("dapo", "equal_rewards", True),
        ("iw_grpg", "equal_rewards", False),  # the all-correct group has A = 1 − mean w̄ ≠ 0 off-policy
        ("grpo_kl", "equal_rewards", False),  # the KL term pulls on every group
    ],
)
def test_skipping_zero_advantage_groups_leaves_the_gradient_unchanged(loss, skip, exact):
    """Groups whose advantages are all 0 are not run; the gradient and the loss stay those of the
    whole minibatch. The two inexact cases are why rapid.train skips only all-zero groups under
    IW-GRPG's weighted baseline and nothing under GRPO's KL term."""
    from rapid.losses import dapo_loss, group_normalized_advantages, grpo_loss

    model, tok = tiny_model()
    records = make_rollouts(tok, n_groups=6, group_size=4, seed=3)
    for r in records[4:8] + records[16:20]:  # group 11 all correct, group 14 all wrong
        r.reward = 1.0 if r.group_id == 11 else 0.0
    for k in (0, 2, 3, 5):  # the others mixed
        records[4 * k].reward, records[4 * k + 1].reward = 1.0, 0.0
    with torch.no_grad():  # μ near π_θ, so the weights spread around 1 (some clipped at eta = 2)
        true = completion_logprobs(CompletionLogprobs(model, 1.0), collate(records, tok.pad_token_id))
    g = torch.Generator().manual_seed(4)
    for i, r in enumerate(records):
        c = len(r.completion_ids)
        r.logp_mu = (true[i, :c] + 0.5 * torch.randn(c, generator=g)).tolist()
    ref = copy.deepcopy(model)  # GRPO's reference: a policy one noisy step away, so k3 has a gradient
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    ref_policy = CompletionLogprobs(ref, 1.0)

    def loss_fn(token_logp, batch, n_records, n_tokens):
        mask = batch.completion_mask
        if loss.startswith("iw_grpg"):
            return iw_grpg_loss(
                sequence_logprobs(token_logp, mask),
                sequence_logprobs(batch.logp_mu, mask),
                batch.rewards,
                batch.group_ids,
                eta=2.0,
                leave_one_out=loss.endswith("loo"),
                normalizer=n_records,
                iw_baseline=not loss.endswith("plain_baseline"),
            )
        adv = group_normalized_advantages(batch.rewards, batch.group_ids)
        if loss == "dapo":
            return dapo_loss(token_logp, batch.logp_mu, adv, mask, normalizer=n_tokens)
        with torch.no_grad():
            logp_ref = completion_logprobs(ref_policy, batch)
        return grpo_loss(token_logp, batch.logp_mu, logp_ref, adv, mask, kl_coef=0.04, normalizer=n_records)

    grads, stats = [], []
    for skip_groups in (None, skip):
        m = copy.deepcopy(model)
        s = accumulate_gradients(
            CompletionLogprobs(m, 1.0),
            records,
            loss_fn,
            micro_batch=8,
            pad_id=tok.pad_token_id,
            device=CPU,
            compute_dtype=torch.float32,
            skip_groups=skip_groups,
        )
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
        stats.append(s)
    skipped = 1 if skip == "zero_rewards" else 2
    assert stats[0]["trained_frac"] == 1.0 and stats[1]["trained_frac"] == pytest.approx((6 - skipped) / 6)
    assert grads[0].abs().max() > 0
    if not exact:
        assert (grads[1] - grads[0]).abs().max() > 1e-3 * grads[0].abs().max()
        return
    torch.testing.assert_close(grads[1], grads[0], atol=2e-6, rtol=1e-4)
    assert stats[1]["loss"] == pytest.approx(stats[0]["loss"], rel=1e-5, abs=1e-7)


def test_a_minibatch_of_zero_advantage_groups_runs_nothing_and_steps_as_on_its_computed_zero_gradient():
    """Every group all-wrong: no forward, the gradient set to zeros, and AdamW (its moments and weight
    decay carried from an earlier step) then moves the weights exactly as after the full backward."""
    model, tok = tiny_model()
    records = make_rollouts(tok, n_groups=2, group_size=4)
    for r in records:
        r.reward = 0.0
    loss_fn = lambda token_logp, batch, n_records, n_tokens: iw_grpg_loss(
        sequence_logprobs(token_logp, batch.completion_mask),
        sequence_logprobs(batch.logp_mu, batch.completion_mask),
        batch.rewards,
        batch.group_ids,
        normalizer=n_records,
    )
    g = torch.Generator().manual_seed(7)
    earlier = [torch.randn(p.shape, generator=g) for p in model.parameters()]
    params, stats = [], []
    for skip_groups in (None, "zero_rewards"):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1)
        for p, e in zip(m.parameters(), earlier):  # an earlier step: non-zero moments
            p.grad = e.clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        s = accumulate_gradients(
            CompletionLogprobs(m, 1.0),
            records,
            loss_fn,
            micro_batch=4,
            pad_id=tok.pad_token_id,
            device=CPU,
            compute_dtype=torch.float32,
            skip_groups=skip_groups,
        )
        assert all(p.grad is not None and p.grad.abs().max() == 0 for p in m.parameters())
        opt.step()
        params.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
        stats.append(s)
    assert stats[0]["trained_frac"] == 1.0 and "staleness" in stats[0]
    assert stats[1] == {"trained_frac": 0.0, "loss": 0.0}  # nothing run, nothing else to report
    assert stats[0]["loss"] == 0.0
    assert torch.equal(params[0], params[1])
    assert (params[0] - torch.cat([p.detach().flatten() for p in model.parameters()])).abs().max() > 0


def test_token_statistics_combine_over_micro_batches_by_tokens():
    """DAPO's clip fraction, ratio mean and the token log-prob gap are means over completion tokens, so a
    minibatch's value must not depend on how it is cut into micro-batches. Two groups of two records,
    rewards (1, 0) in each (normalised advantages +0.707, -0.707). Group 10: one token per completion; the
    positive record's token has r = 2 (log μ = log π − ln 2: above 1 + 0.28, clipped high), the other r = 1.
    Group 11: three tokens per completion, every r = 1. Over the minibatch's 8 tokens, by hand:
        clip_frac  = 1 / 8 = 0.125            (per micro-batch 1/2 and 0; their record mean was 0.25)
        ratio_mean = (2 + 1 + 6 * 1) / 8 = 1.125                                   (record mean 1.25)
        token_logp_gap = ln 2 / 8 = 0.0866434                                  (record mean ln 2 / 4)
    One micro-batch of four and two of two (one group each) give these values."""
    import math

    from rapid import estimators
    from rapid.iw_grpg import masked_mean
    from rapid.policy import token_mean_stats

    model, tok = tiny_model()
    prompts = encode(tok, ["What is 2 + 3?", "Hi"])
    lengths = {10: (1, 1), 11: (3, 3)}
    records = [
        Rollout(prompts[k], list(range(5, 5 + n)), [0.0] * n, float(i == 0), group_id=g, truncated=False)
        for k, (g, ns) in enumerate(lengths.items())
        for i, n in enumerate(ns)
    ]
    with torch.no_grad():
        true = completion_logprobs(CompletionLogprobs(model, 1.0), collate(records, tok.pad_token_id))
    for i, r in enumerate(records):
        r.logp_mu = (true[i, : len(r.completion_ids)] - (math.log(2.0) if i == 0 else 0.0)).tolist()

    def loss_fn(token_logp, batch, n_records, n_tokens):
        x = estimators.LossInputs(
            token_logp, batch.logp_mu, batch.completion_mask, batch.rewards, batch.group_ids, None, n_records, n_tokens
        )
        loss, stats = estimators.compute("dapo", x, {"eps_low": 0.2, "eps_high": 0.28})
        gap = masked_mean((token_logp.detach() - batch.logp_mu).abs(), batch.completion_mask).item()
        return loss, stats | {"token_logp_gap": gap}

    for micro in (4, 2):
        s = accumulate_gradients(
            CompletionLogprobs(copy.deepcopy(model), 1.0),
            records,
            loss_fn,
            micro_batch=micro,
            pad_id=tok.pad_token_id,
            device=CPU,
            compute_dtype=torch.float32,
            token_stats=token_mean_stats("token"),
        )
        assert s["clip_frac"] == pytest.approx(0.125, abs=1e-6), micro
        assert s["clip_frac_high"] == pytest.approx(0.125, abs=1e-6) and s["clip_frac_low"] == 0.0
        assert s["ratio_mean"] == pytest.approx(1.125, abs=1e-5), micro
        assert s["token_logp_gap"] == pytest.approx(math.log(2.0) / 8, abs=1e-5), micro
        assert (s["records"], s["tokens"]) == (4, 8)


def test_token_mean_stats_names_the_token_means():
    from rapid.policy import token_mean_stats

    token, seq = token_mean_stats("token"), token_mean_stats("sequence", "token")
    assert token("clip_frac") and token("kl_mean") and token("token_logp_gap") and not token("loss")
    assert not token("correction_trunc_frac")  # engine_correction none or sequence: per record
    assert not seq("clip_frac") and not seq("staleness") and seq("correction_ratio_mean") and seq("token_logp_gap")
