"""The loss registry (rapid/estimators.py): what config validation accepts and refuses, what each loss
declares (reference model, skippable groups), the yaml that selects it, and adding a new loss."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from rapid import estimators
from rapid.config import ConfigError, register_resolvers, skipped_groups, validate, with_current_defaults
from rapid.estimators import LossInputs
from tests.test_estimators import SETTINGS

REPO = Path(__file__).resolve().parents[1]
NEW = ("cispo", "gspo", "dr_grpo", "topr", "rapid_mask")


def config(*overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=["+experiment=smoke", *overrides])


def test_every_registered_loss_has_its_yaml_and_every_yaml_a_registered_loss():
    yamls = [p.stem for p in (REPO / "conf" / "algorithm").glob("*.yaml") if p.stem != "sft"]
    selected = {config(f"algorithm={y}").algorithm.loss for y in yamls}
    assert selected == set(estimators.names()) == set(SETTINGS)  # algorithm=rapid and pg select iw_grpg
    for name in estimators.names():
        a = config(f"algorithm={'rapid' if name == 'iw_grpg' else name}").algorithm
        assert a.loss == name
        assert {k: a[k] for k in SETTINGS[name]} == SETTINGS[name]  # the values tests/test_estimators.py uses


@pytest.mark.parametrize("name", [*NEW, "rapid", "pg", "grpo", "grpo_multistep", "dapo"])
def test_validation_accepts_each_loss(name):
    cfg = config(f"algorithm={name}")
    validate(cfg, 1)


def test_unknown_loss_is_one_sentence_listing_the_known_ones():
    cfg = config("algorithm.loss=cispo_typo")
    with pytest.raises(ConfigError) as e:
        validate(cfg, 1)
    msg = str(e.value)
    assert msg.startswith("algorithm.loss=cispo_typo is not a registered loss: use one of ") and "\n" not in msg
    assert all(name in msg for name in estimators.names())
    with pytest.raises(KeyError, match="cispo, dapo, dr_grpo, grpo, gspo, iw_grpg, rapid_mask, topr"):
        estimators.get("nope")


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["algorithm.loss=cispo"], "algorithm.loss=cispo reads algorithm.eps_high, algorithm.eps_low"),
        (["algorithm=cispo", "algorithm.eps_high=0"], "algorithm.eps_high=0 must be a number > 0"),
        (["algorithm=cispo", "algorithm.eps_low=-1"], "algorithm.eps_low=-1 must be a number > 0"),
        (["algorithm=gspo", "algorithm.eps_low=1.5"], "algorithm.eps_low=1.5 must be < 1"),
        (["algorithm=gspo", "algorithm.eps_high=-1"], "algorithm.eps_high=-1 must be a number > 0"),
        (["algorithm=dr_grpo", "algorithm.beta=-0.1"], "algorithm.beta=-0.1 must be >= 0"),
        (["algorithm=grpo", "algorithm.eps_low=1"], "algorithm.eps_low=1 must be < 1"),
        (["algorithm=topr", "algorithm.baseline=mean"], "algorithm.baseline=mean must be a number"),
        (["algorithm=rapid_mask", "algorithm.eta=null"], "algorithm.eta=None must be a number >= 1"),
        (
            ["algorithm=topr", "algorithm.H=auto", "samples=64"],
            "algorithm.H=auto reads the loss's importance weights, which algorithm.loss=topr does not report: "
            "use algorithm.loss=iw_grpg or rapid_mask",
        ),
    ],
)
def test_bad_combinations_are_one_sentence(overrides, words):
    cfg = config(*overrides)
    with pytest.raises(ConfigError) as e:
        validate(cfg, 1)
    assert str(e.value).startswith(words) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "overrides, skip, reference",
    [
        (["algorithm=rapid"], "zero_rewards", False),
        (["algorithm=pg", "algorithm.iw_baseline=false"], "equal_rewards", False),
        (["algorithm=grpo"], None, True),  # the KL term pulls on every group
        (["algorithm=grpo", "algorithm.beta=0"], "equal_rewards", False),
        (["algorithm=dapo"], "equal_rewards", False),
        (["algorithm=dr_grpo"], "equal_rewards", False),
        (["algorithm=dr_grpo", "algorithm.beta=0.04"], None, True),
        (["algorithm=cispo"], "equal_rewards", False),
        (["algorithm=gspo"], "equal_rewards", False),
        (["algorithm=topr"], None, False),  # A = R − 0.5 is never 0
        (["algorithm=topr", "algorithm.baseline=group_mean"], "equal_rewards", False),
        (["algorithm=rapid_mask"], "zero_rewards", False),
    ],
)
def test_skipped_groups_and_reference_come_from_the_loss(overrides, skip, reference):
    cfg = config(*overrides, "train.skip_zero_advantage=true")
    assert skipped_groups(cfg) == skip
    assert estimators.get(cfg.algorithm.loss).reference(cfg.algorithm) is reference
    cfg.train.skip_zero_advantage = False
    assert skipped_groups(cfg) is None


def test_adding_a_loss_is_one_function():
    """A new estimator: register a function, and validation, skipping and the loss call know it."""

    @estimators.register("half_reinforce", level="sequence", keys=("scale",), skip="equal_rewards")
    def half_reinforce(x: LossInputs, a):
        seq = (x.logp * x.mask).sum(-1)
        adv = x.rewards - x.rewards.mean()
        return -(a["scale"] * adv * seq).sum() / x.n_records, {}

    try:
        cfg = config("algorithm.loss=half_reinforce", "+algorithm.scale=0.5")
        validate(cfg, 1)
        logp = torch.tensor([[-1.0], [-2.0]], requires_grad=True)
        x = LossInputs(logp, logp.detach(), torch.ones(2, 1), torch.tensor([1.0, 0.0]), torch.zeros(2), n_records=2)
        loss, _ = estimators.compute("half_reinforce", x, cfg.algorithm)
        loss.backward()
        torch.testing.assert_close(logp.grad, torch.tensor([[-0.125], [0.125]]))  # −0.5 · (±0.5) / 2
        with pytest.raises(ValueError, match="already registered"):
            estimators.register("half_reinforce", level="sequence")(half_reinforce)
        with pytest.raises(ConfigError, match="reads algorithm.scale"):
            validate(config("algorithm.loss=half_reinforce"), 1)
    finally:
        del estimators.REGISTRY["half_reinforce"]
    with pytest.raises(ValueError, match="level must be"):
        estimators.register("x", level="tokens")
    with pytest.raises(ValueError, match="skip must be one of"):
        estimators.register("x", level="token", skip="all")
    assert "x" not in estimators.REGISTRY


def test_what_a_loss_declares_decides_the_loop_and_the_checks():
    """iw (importance-weight statistics: ESS, iw/ names, H=auto), group_relative (the n_group = 1 warning) and a
    program of its own (SFT) are declared on the estimator, so no check names a loss."""
    assert [n for n in estimators.names() if estimators.get(n).iw] == ["iw_grpg", "rapid_mask"]
    topr = estimators.get("topr")
    assert not topr.group_relative({"baseline": 0.5}) and topr.group_relative({"baseline": "group_mean"})
    assert estimators.get("grpo").group_relative({}) and "sft" not in estimators.names()
    from rapid.sft import distill_and_sft

    assert estimators.program("sft") is distill_and_sft and estimators.program("iw_grpg") is None
    validate(config("algorithm=rapid_mask", "algorithm.H=auto", "samples=64", "rounds=null"), 1)

    @estimators.register("weighted", level="sequence", iw=True, group_relative=lambda a: False)
    def weighted(x: LossInputs, a):
        return x.logp.sum() * 0, {}

    try:  # a new loss that reports importance weights runs with H=auto; one of its own baseline warns nothing
        validate(config("algorithm.loss=weighted", "algorithm.H=auto", "samples=64", "rounds=null"), 1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            validate(config("algorithm.loss=weighted", "algorithm.n_group=1", "algorithm.n_step=8"), 1)
        with pytest.warns(UserWarning, match="learns nothing"):
            validate(config("algorithm=gspo", "algorithm.n_group=1", "algorithm.n_step=8"), 1)
    finally:
        del estimators.REGISTRY["weighted"]


def test_earlier_setting_names_are_read_as_todays():
    """One name per knob: clip_eps, clip_low, clip_high and kl_coef still work, each with one line saying
    what it was read as; an unset earlier name (null in conf/algorithm/rapid.yaml) says nothing."""
    cfg = config("algorithm=grpo", "algorithm.clip_eps=0.3", "algorithm.kl_coef=0.1")
    with open_dict(cfg):
        notices = estimators.upgrade_settings(cfg.algorithm)
    a = cfg.algorithm
    assert (a.eps_low, a.eps_high, a.beta) == (0.3, 0.3, 0.1)
    assert all(a[k] is None for k in ("clip_eps", "clip_low", "clip_high", "kl_coef"))
    assert notices == [
        "algorithm.clip_eps is an earlier name: read as algorithm.eps_low=0.3 algorithm.eps_high=0.3 "
        "(set those instead)",
        "algorithm.kl_coef is an earlier name: read as algorithm.beta=0.1 (set those instead)",
    ]
    validate(cfg, 1)
    cfg = config("algorithm=dapo", "algorithm.clip_high=0.3")
    with open_dict(cfg):
        assert len(estimators.upgrade_settings(cfg.algorithm)) == 1
    assert (cfg.algorithm.eps_low, cfg.algorithm.eps_high) == (0.2, 0.3)
    cfg = config("algorithm=gspo")
    with open_dict(cfg):
        assert estimators.upgrade_settings(cfg.algorithm) == []
    assert (cfg.algorithm.eps_low, cfg.algorithm.eps_high) == (3e-4, 4e-4)
    # a run saved under the earlier names resumes, replays and reports under today's
    saved = OmegaConf.create({"algorithm": {"name": "grpo", "loss": "grpo", "clip_eps": 0.25, "kl_coef": 0.02}})
    a = with_current_defaults(saved).algorithm
    assert (a.eps_low, a.eps_high, a.beta) == (0.25, 0.25, 0.02) and a.clip_eps is None


def test_grpo_takes_an_upper_bound_of_its_own():
    """algorithm=grpo with eps_high != eps_low: the token-mean GRPO loss without KL is DAPO's clip-higher
    surrogate (rapid.losses.dapo_loss, checked by hand in tests/test_losses.py), value and gradient; with
    eps_high = eps_low it is the symmetric clip it was."""
    from rapid.losses import dapo_loss, grpo_loss

    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(3, 5, generator=g) - 0.1
    logp = (logp_old + 0.4 * torch.randn(3, 5, generator=g)).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    adv = torch.tensor([1.0, -0.5, 0.7])
    kw = dict(aggregation="token_mean", kl_coef=0.0)
    loss, stats = grpo_loss(logp, logp_old, None, adv, mask, clip_eps=0.2, clip_eps_high=0.28, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    want, want_stats = dapo_loss(logp, logp_old, adv, mask, clip_low=0.2, clip_high=0.28)
    (want_grad,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close((loss, grad), (want, want_grad))
    assert stats["clip_frac_high"] == want_stats["clip_frac_high"] and stats["clip_frac"] == want_stats["clip_frac"]
    symmetric, _ = grpo_loss(logp, logp_old, None, adv, mask, clip_eps=0.2, **kw)
    torch.testing.assert_close(
        symmetric, grpo_loss(logp, logp_old, None, adv, mask, clip_eps=0.2, clip_eps_high=0.2, **kw)[0]
    )
    assert not torch.isclose(symmetric, loss)  # the upper bound matters on these ratios
