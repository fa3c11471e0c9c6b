"""Resume on GPUs: a checkpoint saved on cuda:0 reads back onto the CPU on every rank, and GRPO's KL
reference stays the initial policy across a resume."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rapid import checkpoint
from rapid.data import PromptStream
from tests.helpers import tiny_model

# state.pt records each storage's device; torch.load without map_location puts it back there. The
# tagger below writes "cuda:0" for the storages listed in CUDA_TAGGED (what a GPU run's optimizer
# moments record), so this CPU-only machine can make the file a GPU run leaves behind.
CUDA_TAGGED: set[int] = set()


def _tag(storage):
    return "cuda:0" if storage.data_ptr() in CUDA_TAGGED else None


torch.serialization.register_package(1, _tag, lambda storage, location: None)


def test_checkpoint_saved_on_cuda_loads_onto_the_cpu(tmp_path):
    model, tokenizer = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    stream = PromptStream(10, seed=0)
    model.train()
    model(input_ids=torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss.backward()
    optimizer.step()
    moments = {i: s["exp_avg"].clone() for i, s in optimizer.state_dict()["state"].items()}
    CUDA_TAGGED.update(s[k].untyped_storage().data_ptr() for s in optimizer.state.values() for k in s)
    try:
        path = checkpoint.save(
            tmp_path, 1, model, tokenizer, optimizer, scheduler, stream, OmegaConf.create({"seed": 0}), 0.0, keep=1
        )
    finally:
        CUDA_TAGGED.clear()
    assert not torch.cuda.is_available()  # else the file would load onto cuda:0 and prove nothing
    # the file does record cuda:0: loading it where it was saved needs CUDA
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(path / "state.pt", weights_only=False)

    assert checkpoint.latest(tmp_path) == path  # not passed over as unreadable
    assert checkpoint.load_config(path).seed == 0
    fresh, _ = tiny_model(seed=1)
    optimizer2 = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    scheduler2 = torch.optim.lr_scheduler.LambdaLR(optimizer2, lambda step: 1.0)
    checkpoint.load(path, fresh, optimizer2, scheduler2, PromptStream(10, seed=0))
    for i, s in optimizer2.state_dict()["state"].items():
        assert s["exp_avg"].device.type == "cpu"
        torch.testing.assert_close(s["exp_avg"], moments[i], rtol=0, atol=0)
