"""The patching that makes a module recompute, shared by every recompute region (:mod:`yolo_ckpt.checkpointing.engine`'s layers,
inner blocks and head branches; :mod:`yolo_ckpt.checkpointing.losses`' loss region; :mod:`yolo_ckpt.checkpointing.assigner`'s chunked
assigners): a class swap to a patched subclass that pickles as its stock class (:class:`PickledAsStock`), and the
counters that prove a region ran (:func:`count_recomputations`).
"""

from __future__ import annotations

import contextlib
import copy
import copyreg
from collections import Counter

from torch import nn

ACTIVE_COUNTERS: list[RecomputeCounter] = []  # the counters of the count_recomputations() blocks now open
RECOMPUTE_NAME = "_recompute_name"  # instance attribute of a recomputed module: its qualified name under model.model
_PATCHED_CLASSES: dict[tuple, type] = {}


class RecomputeCounter:
    """Counts backward recomputations while it is active (see :func:`count_recomputations`).

    Attributes:
        per_layer: ``Counter`` of layer index ``i`` -> number of times the layer ``model.model[i]`` itself was
            recomputed in backward.
        per_module: ``Counter`` of qualified module name under ``model.model`` -> recomputations, for every
            recomputed module: layers (``"6"``), their inner blocks (``"6.m.0.1"``) and head branches (``"23.cv2.0"``).
        loss_images: number of images whose mask loss the loss region recomputed in backward
            (:mod:`yolo_ckpt.checkpointing.losses`).
        assignments: number of task-aligned assignments that ran in chunks of objects (:mod:`yolo_ckpt.checkpointing.assigner`).
        attention_chunks: number of chunk passes of the attention region (:mod:`yolo_ckpt.checkpointing.attention`):
            two per chunk in each exact backward (query rows, key columns), one per chunk in each forward under autocast.
    """

    def __init__(self):
        self.per_layer: Counter[int] = Counter()
        self.per_module: Counter[str] = Counter()
        self.loss_images = 0
        self.assignments = 0
        self.attention_chunks = 0

    @property
    def total(self) -> int:
        """Recomputations of all modules (layers, inner blocks and head branches)."""
        return sum(self.per_module.values())

    def _count(self, name: str) -> None:
        self.per_module[name] += 1
        if name.isdigit():
            self.per_layer[int(name)] += 1


@contextlib.contextmanager
def count_recomputations():
    """Context manager yielding a :class:`RecomputeCounter` that counts the backward recomputations it sees.

    Tests use it to prove that recomputation ran: an engine that did nothing would count 0.
    """
    counter = RecomputeCounter()
    ACTIVE_COUNTERS.append(counter)
    try:
        yield counter
    finally:
        ACTIVE_COUNTERS.remove(counter)


class PickledAsStock:
    """Mixin of a patched subclass (made by :func:`patched_class`): pickles as its stock class, copies as itself.

    Used for recomputed layers (:class:`RecomputedLayer`) and for the loss region's model and criterion classes
    (:mod:`yolo_ckpt.checkpointing.losses`).
    """

    def __reduce_ex__(self, protocol):
        # Pickle as the stock class: last.pt/best.pt and DDP files must load without yolo_ckpt. Copies (copy.copy,
        # deepcopy for EMA and AutoBatch's probe) keep the patched class.
        # copyreg._reconstructor is what pickle itself uses for protocols 0-1; __newobj__ would insist on type(self).
        state = {k: v for k, v in self.__getstate__().items() if k != RECOMPUTE_NAME}  # a recomputed module's name
        return copyreg._reconstructor, (stock_class(type(self)), object, None), state

    def __copy__(self):
        new = type(self).__new__(type(self))
        new._set_state(dict(self.__getstate__()))
        return new

    def __deepcopy__(self, memo):
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new._set_state(copy.deepcopy(self.__getstate__(), memo))
        return new

    def _set_state(self, state: dict) -> None:
        # As pickle restores state: __setstate__ where the class has one (nn.Module), else the instance __dict__.
        if hasattr(self, "__setstate__"):
            self.__setstate__(state)
        else:
            self.__dict__.update(state)


def stock_class(cls: type) -> type:
    """The stock class of a patched class (:func:`patched_class`), else ``cls`` itself."""
    return cls.__dict__["stock_class"] if issubclass(cls, PickledAsStock) else cls


def patched_class(mixin: type, stock: type, name: str, **attrs) -> type:
    """The subclass ``name(mixin, stock)`` with class attributes ``attrs``, pickled as ``stock``; made once per
    distinct arguments."""
    key = (mixin, stock, name, tuple(sorted(attrs.items())))
    if key not in _PATCHED_CLASSES:
        body = {"__module__": mixin.__module__, "stock_class": stock, **attrs}
        _PATCHED_CLASSES[key] = type(name, (mixin, stock), body)
    return _PATCHED_CLASSES[key]


def model_layers(model: nn.Module) -> nn.Module:
    """The Ultralytics ``BaseModel`` whose ``.model`` layers are patched, inside a DDP, ``torch.compile`` or
    ``distill_model=`` wrapper (its student).

    Raises:
        TypeError: for anything else.
    """
    inner = getattr(model, "module", model)  # DDP
    inner = getattr(inner, "_orig_mod", inner)  # torch.compile
    inner = getattr(inner, "student_model", inner)  # distill_model=: Ultralytics' DistillationModel trains its student
    if not isinstance(getattr(inner, "model", None), nn.Sequential) or not hasattr(inner, "yaml"):
        raise TypeError(f"expected an Ultralytics BaseModel with .model layers and .yaml, got {type(model).__name__}")
    return inner
