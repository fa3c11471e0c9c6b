"""Resume on GPUs: a checkpoint saved on cuda:0 reads back onto the CPU on every rank, and GRPO's KL
reference stays the initial policy across a resume."""

from __future__ import annotations

import shutil

import pytest
import torch
from omegaconf import OmegaConf

from rapid import checkpoint
from rapid.data import PromptStream
from tests.helpers import tiny_model
from tests.test_train import assert_rows_equal, launch, read_rows, rewind_to_round_2, train_rows

# state.pt records each storage's device; torch.load without map_location puts it back there. The
# tagger below writes "cuda:0" for the storages listed in CUDA_TAGGED (what a GPU run's optimizer
# moments record), so this CPU-only machine can make the file a GPU run leaves behind.
CUDA_TAGGED: set[int] = set()


def _tag(storage):
    return "cuda:0" if storage.data_ptr() in CUDA_TAGGED else None


torch.serialization.register_package(1, _tag, lambda storage, location: None)


def test_checkpoint_saved_on_cuda_loads_onto_the_cpu(tmp_path):
    """A checkpoint whose optimizer moments lie on cuda:0 restores onto a CPU model, moments on the CPU.
    With a GPU the moments really are on cuda:0; without one the tagger makes state.pt record cuda:0."""
    gpu = torch.cuda.is_available()
    model, tokenizer = tiny_model()
    if gpu:
        model.to("cuda:0")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    stream = PromptStream(10, seed=0)
    model.train()
    ids = torch.tensor([[1, 2, 3, 4]], device=next(model.parameters()).device)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    moments = {i: s["exp_avg"].cpu().clone() for i, s in optimizer.state_dict()["state"].items()}
    if not gpu:
        CUDA_TAGGED.update(s[k].untyped_storage().data_ptr() for s in optimizer.state.values() for k in s)
    try:
        path = checkpoint.save(
            tmp_path, 1, model, tokenizer, optimizer, scheduler, stream, OmegaConf.create({"seed": 0}), 0.0, keep=1
        )
    finally:
        CUDA_TAGGED.clear()
    # the file does record cuda:0: a plain torch.load puts the moments back there (or fails without CUDA)
    if gpu:
        raw = torch.load(path / "state.pt", weights_only=False)["optimizer"]["state"]
        assert {s["exp_avg"].device.type for s in raw.values()} == {"cuda"}
    else:
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(path / "state.pt", weights_only=False)

    assert checkpoint.latest(tmp_path) == path  # not passed over as unreadable
    assert checkpoint.load_config(path).seed == 0
    fresh, _ = tiny_model(seed=1)  # on the CPU, as a resumed run's rank that reads it
    optimizer2 = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    scheduler2 = torch.optim.lr_scheduler.LambdaLR(optimizer2, lambda step: 1.0)
    checkpoint.load(path, fresh, optimizer2, scheduler2, PromptStream(10, seed=0))
    for i, s in optimizer2.state_dict()["state"].items():
        assert s["exp_avg"].device.type == "cpu"
        torch.testing.assert_close(s["exp_avg"], moments[i], rtol=0, atol=0)


@pytest.mark.slow
def test_resumed_grpo_keeps_the_initial_policy_as_kl_reference(tmp_path):
    """A 4-round GRPO run killed after round 2 and resumed logs the same rows (its KL to the initial
    policy among them) as the run that was not interrupted. Anchored to the checkpoint instead, the
    resumed run's KL restarts near 0."""
    overrides = [
        "+experiment=smoke",
        "algorithm=grpo",
        "algorithm.H=1",
        "algorithm.n_step=16",
        "device=cpu",
        "rounds=4",
        "ckpt.every=2",
        "ckpt.keep=5",
        "optim.lr=1e-2",
        "eval.every=0",
    ]
    run_a = tmp_path / "a"
    launch([*overrides, f"hydra.run.dir={run_a}"], tmp_path, shaped=True)
    rows_a = read_rows(run_a)
    kl_a = [r["loss/kl_mean"] for r in train_rows(rows_a)]
    assert kl_a[2] > 1e-3, kl_a  # not vacuous: by round 3 the policy has left the reference

    run_b = tmp_path / "b"
    shutil.copytree(run_a, run_b)
    rewind_to_round_2(run_b, rows_a)
    proc = launch([f"resume={run_b}", f"hydra.run.dir={tmp_path / 'resume_hydra'}"], tmp_path, shaped=True)
    assert "at round 2" in proc.stdout
    rows_b = read_rows(run_b)
    kl_b = [r["loss/kl_mean"] for r in train_rows(rows_b)]
    assert kl_b == pytest.approx(kl_a, rel=1e-5, abs=1e-8)
    assert_rows_equal([r for r in rows_b if r["progress/round"] > 2], [r for r in rows_a if r["progress/round"] > 2])
