"""Count a training step's memory as it runs: live tensor storages on any device, or the CUDA allocator.

On CUDA the caching allocator keeps the peak (``torch.cuda.max_memory_allocated``): :class:`CudaAllocator` reads it.
The CPU has no such counter, so :class:`LiveTensorTracker` counts it the way the allocator would: it sees every
tensor an operator creates (a ``TorchDispatchMode``, forward and backward alike), adds its storage's bytes while the
storage is alive and subtracts them when the storage is freed (a weak reference's callback). The same idea as PyTorch's
``torch.distributed._tools.mem_tracker.MemTracker``, which is private API (it may change in any release) and fails
on parameters that do not require grad, as YOLO's DFL convolution does; hence this small tracker.

Both are counters of :func:`yolo_ckpt.memory.step.run_step`: ``live_bytes``, ``phase_peak_bytes`` and
``start_phase()``. Given a ``tagger``, the live tensor tracker also says what was alive at each phase's peak, storage by
storage, each with the tag its creator had (``benchmarks/high_resolution/floor.py`` groups them).
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

    Args:
        tagger: optional; called with no arguments as each storage is first counted, its result is that storage's
            tag (e.g. the module whose forward runs). With it the tracker also says which storages were alive at
            each peak it keeps (:attr:`phase_peak_storages`, :attr:`marked_storages`); the bytes counted are the same
            with or without it.

    Attributes:
        live_bytes: bytes alive now.
        peak_bytes: the largest ``live_bytes`` seen, in bytes.
    """

    def __init__(self, tagger=None):
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.phase_peak_bytes = 0
        self.mark_peak_bytes = 0
        self._live: dict[int, int] = {}
        # storage key -> a weak reference to the storage whose callback counts its freeing (weakref.finalize's own
        # registry cost ~10x more per storage, measured: a fake pass counts ~20k storages)
        self._refs: dict[int, weakref.ref] = {}
        self.tagger = tagger
        self._tags: dict[int, tuple[int, object]] = {}  # storage key -> (the serial of its counting, its tag)
        self._serial = 0
        # with a tagger, the storages alive at the phase's and the mark's peak so far, and at the last closed mark's:
        # storage key -> (bytes, serial, tag)
        self._phase_snapshot: dict = {}
        self._mark_snapshot: dict = {}
        self._marked: dict = {}

    @property
    def phase_peak_storages(self) -> dict[int, tuple[int, object]]:
        """With a ``tagger``, the storages alive when this phase's ``phase_peak_bytes`` was first reached, as
        ``{storage key: (bytes, tag)}`` in the order they were counted (the last one made the peak): their bytes add
        up to ``phase_peak_bytes``."""
        return {k: (n, tag) for k, (n, _, tag) in self._phase_snapshot.items()}

    @property
    def marked_storages(self) -> dict[int, tuple[int, object]]:
        """With a ``tagger``, the storages alive at the peak the last :meth:`mark` returned, as
        :attr:`phase_peak_storages` gives them."""
        return {k: (n, tag) for k, (n, _, tag) in self._marked.items()}

    def start_phase(self) -> int:
        """Restart ``phase_peak_bytes`` from the bytes alive now, and return them."""
        self.phase_peak_bytes = self.live_bytes
        if self.tagger is not None:
            self._phase_snapshot = self._snapshot()
        return self.live_bytes

    def mark(self) -> int:
        """The peak bytes since the last mark (or since the tracker began); the next mark's starts from now."""
        peak, self.mark_peak_bytes = self.mark_peak_bytes, self.live_bytes
        if self.tagger is not None:
            self._marked, self._mark_snapshot = self._mark_snapshot, self._snapshot()
        return peak

    def retag(self, tensor: torch.Tensor, tag) -> None:
        """Give the live storage of ``tensor`` the tag ``tag``, now and in the snapshots of peaks it was alive at (a
        parameter's gradient is known as one only after the operator that made it); a storage not counted, or counted
        without a ``tagger``, is left alone."""
        key = tensor.untyped_storage()._cdata
        if key not in self._tags:
            return
        serial = self._tags[key][0]
        self._tags[key] = (serial, tag)
        for snapshot in (self._phase_snapshot, self._mark_snapshot, self._marked):
            if key in snapshot and snapshot[key][1] == serial:  # the same storage, not an earlier one at its address
                snapshot[key] = (snapshot[key][0], serial, tag)

    def _snapshot(self) -> dict:
        return {k: (n, *self._tags[k]) for k, n in self._live.items()}

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
        if self.tagger is not None:
            self._serial += 1
            self._tags[key] = (self._serial, self.tagger())
            if live > self.phase_peak_bytes or live > self.mark_peak_bytes:
                snapshot = self._snapshot()
                if live > self.phase_peak_bytes:
                    self._phase_snapshot = snapshot
                if live > self.mark_peak_bytes:
                    self._mark_snapshot = snapshot
        self.phase_peak_bytes = max(self.phase_peak_bytes, live)
        self.mark_peak_bytes = max(self.mark_peak_bytes, live)
        self._refs[key] = weakref.ref(storage, lambda _, key=key: self._free(key))

    def _free(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)
        self._refs.pop(key, None)
        self._tags.pop(key, None)

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
