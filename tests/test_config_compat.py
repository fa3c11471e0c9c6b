"""Runs saved by an older rapid (before a config key existed) still resume, replay and report."""

from omegaconf import OmegaConf

from rapid.config import with_current_defaults


def test_an_older_runs_config_gets_the_new_keys_at_their_defaults():
    saved = OmegaConf.create(
        {
            "seed": 3,
            "algorithm": {"name": "grpo", "loss": "grpo", "H": 2, "n_step": 4, "n_inference": 8, "num_iterations": 2},
            "eval": {"n": 5, "every": 0},
        }
    )
    cfg = with_current_defaults(saved)
    a = cfg.algorithm
    assert (a.name, a.H, a.n_inference, a.num_iterations) == ("grpo", 2, 8, 2)  # the run's own values win
    assert a.dynamic_sampling is False and a.overlong_cache == 0 and a.eta == 2.0  # keys it lacked: defaults
    assert (cfg.eval.n, cfg.eval.every, cfg.eval.at_start) == (5, 0, True)
    assert cfg.seed == 3 and "hydra" not in cfg
    OmegaConf.to_container(cfg, resolve=True)  # nothing left unresolvable


def test_every_key_conf_leaves_null_has_a_declared_kind():
    """A key whose only value in conf/ is null says nothing of what it may hold, so the schema would
    refuse every value a user gives it (`algorithm.distill.n_prompts=24 must be null`): each such key
    is declared in rapid.config.KINDS."""
    from rapid.config import KINDS, conf_kinds

    undeclared = [k for k, v in conf_kinds().items() if v == {"null"} and not k.startswith("hydra.") and k not in KINDS]
    assert not undeclared, f"declare these keys' kinds in rapid.config.KINDS: {', '.join(sorted(undeclared))}"
