"""Count a training step's memory as it runs: live tensor storages on any device, or the CUDA allocator.

On CUDA the caching allocator keeps the peak (``torch.cuda.max_memory_allocated``): :class:`CudaAllocator` reads it.
The CPU has no such counter, so :class:`LiveTensorTracker` counts it the way the allocator would: it sees every
tensor an operator creates (a ``TorchDispatchMode``, forward and backward alike), adds its storage's bytes while the
storage is alive and subtracts them when the storage is freed (a ``weakref.finalize``). The same idea as PyTorch's
``torch.distributed._tools.mem_tracker.MemTracker``, which is private API (it may change in any release) and fails
on parameters that do not require grad, as YOLO's DFL convolution does; hence this small tracker.

Both are counters of :func:`yolo_ckpt.memory.step.run_step`: ``live_bytes``, ``phase_peak_bytes`` and
``start_phase()``.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_DEVICE = torch.ops.prim.device.default


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
        self.phase_peak_bytes = 0
        self.mark_peak_bytes = 0
        self._live: dict[int, int] = {}

    def start_phase(self) -> int:
        """Restart ``phase_peak_bytes`` from the bytes alive now, and return them."""
        self.phase_peak_bytes = self.live_bytes
        return self.live_bytes

    def mark(self) -> int:
        """The peak bytes since the last mark (or since the tracker began); the next mark's starts from now."""
        peak, self.mark_peak_bytes = self.mark_peak_bytes, self.live_bytes
        return peak

    def track(self, *tensors) -> None:
        """Count these tensors' storages (nested lists/dicts allowed) as alive from now on."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        if t.is_meta or t.is_sparse:
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._live:
            return
        self._live[key] = nbytes = storage.nbytes()
        self.live_bytes = live = self.live_bytes + nbytes
        self.peak_bytes = max(self.peak_bytes, live)
        self.phase_peak_bytes = max(self.phase_peak_bytes, live)
        self.mark_peak_bytes = max(self.mark_peak_bytes, live)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE:  # a fake tensor's device query (most calls on fake tensors): no storage, answered here
            return args[0].device
        out = func(*args, **(kwargs or {}))
        # an operator returns a tensor or a tuple or list of them (and of other values): no pytree walk, the
        # tracker's largest cost on small real tensors (a loss calibration's)
        if isinstance(out, torch.Tensor):
            self._add(out)
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, torch.Tensor):
                    self._add(t)
                elif isinstance(t, (tuple, list, dict)):
                    self.track(t)
        return out


class CudaAllocator:
    """The CUDA caching allocator as :func:`yolo_ckpt.memory.step.run_step`'s counter (``live_bytes``,
    ``phase_peak_bytes``)."""

    live_bytes = property(lambda self: torch.cuda.memory_allocated())
    phase_peak_bytes = property(lambda self: torch.cuda.max_memory_allocated())

    def start_phase(self) -> int:
        """Restart the allocator's peak from the bytes allocated now, and return them."""
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()


def tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages of these tensors (nested lists/dicts allowed)."""
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tree_leaves(tensors) if isinstance(t, torch.Tensor)}
    return sum(storages.values())
