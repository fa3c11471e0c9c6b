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
