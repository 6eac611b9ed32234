"""The run's CUDA peaks: training's and validation's banked apart (``yolo_ckpt.train.run_stats.cuda_peak``)."""

from types import SimpleNamespace

import pytest
import torch

from yolo_ckpt.train.run_stats import RunStats, cuda_peak

MiB = 2**20


@pytest.mark.cuda
def test_cuda_peaks_of_training_and_validation_banked_apart():
    """A 64 MiB tensor before the validation block counts as training's peak; the 16 MiB one inside it as
    validation's, which the training peak does not reach (the allocator's peak is reset between them)."""
    device = torch.device("cuda")
    trainer = SimpleNamespace(device=device, ckpt_stats=RunStats())
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    train = torch.empty(64 * MiB, dtype=torch.uint8, device=device)
    del train
    with cuda_peak(trainer, "val"):
        val = torch.empty(16 * MiB, dtype=torch.uint8, device=device)
        del val
    stats = trainer.ckpt_stats
    assert stats.train_peak["allocated"] >= base + 64 * MiB
    assert base + 16 * MiB <= stats.val_peak["allocated"] < base + 64 * MiB
    assert stats.val_peak["reserved"] >= stats.val_peak["allocated"]
