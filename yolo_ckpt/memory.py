"""Measure peak training memory: the CUDA allocator's peak, and peak live-tensor bytes on any device (CPU).

On CUDA the caching allocator keeps the peak (``torch.cuda.max_memory_allocated``). The CPU has no such counter,
so :class:`LiveTensorTracker` counts it the way the allocator would: it sees every tensor an operator creates
(a ``TorchDispatchMode``, forward and backward alike), adds its storage's bytes while the storage is alive and
subtracts them when the storage is freed (a ``weakref.finalize``). The same idea as PyTorch's private
``torch.distributed._tools.mem_tracker.MemTracker``, without its module bookkeeping.
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveTensorTracker(TorchDispatchMode):
    """Peak bytes of tensor storages alive while the mode is active.

    Storages created by operators inside the block are counted from creation to deallocation; tensors passed to
    :meth:`track` (parameters, inputs) are counted from then on. Views share their base's storage and are not
    counted twice.

    Attributes:
        live_bytes: bytes alive now.
        peak_bytes: the largest ``live_bytes`` seen, in bytes.
    """

    def __init__(self):
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, int] = {}

    def track(self, *tensors) -> None:
        """Count these tensors' storages (nested lists/dicts allowed) as alive from now on."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        if t.device.type == "meta" or t.is_sparse:
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._live:
            return
        self._live[key] = storage.nbytes()
        self.live_bytes += self._live[key]
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.track(out)
        return out


def probe_training_step(model: torch.nn.Module, batch: dict) -> int:
    """Peak live-tensor bytes of one training step (forward, loss with targets, backward) of a copy of ``model``.

    The live model, its BatchNorm statistics and the global RNG are untouched: the probe runs on a ``deepcopy``
    (which keeps any activation checkpointing applied to the model).

    Args:
        model: an Ultralytics ``BaseModel`` with ``.args`` set (its loss needs the hyperparameters).
        batch: a preprocessed training batch: ``img`` (B, 3, H, W) float in [0, 1] and the task's targets.

    Returns:
        Peak bytes: parameters, buffers, the batch, activations and gradients alive at the same time.
    """
    probe = copy.deepcopy(model).train()
    with torch.random.fork_rng(devices=[]), LiveTensorTracker() as tracker:
        tracker.track(list(probe.parameters()), list(probe.buffers()), batch)
        loss, _ = probe.loss(batch)
        loss.sum().backward()
    return tracker.peak_bytes


def probe_validation_step(model: torch.nn.Module, images: torch.Tensor) -> int:
    """Peak live-tensor bytes of one inference forward pass (validation) of ``model`` on ``images`` (B, 3, H, W)."""
    probe = copy.deepcopy(model).eval()
    with torch.inference_mode(), LiveTensorTracker() as tracker:
        tracker.track(list(probe.parameters()), list(probe.buffers()), images)
        probe(images)
    return tracker.peak_bytes
