"""Apply and remove activation checkpointing on the layers of an Ultralytics model.

A recomputed layer keeps only its inputs in the forward pass; its internals are recomputed in backward
(Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"), with ``torch.utils.checkpoint`` in its
non-reentrant form (https://pytorch.org/docs/stable/checkpoint.html).

How a layer is patched, and why:

- Its class is swapped for a subclass that overrides ``forward`` (``RecomputedC3k2`` for ``C3k2``). The module
  object stays where it was, so ``.f/.i/.type/.np``, ``model.save`` and the state_dict keys are untouched, and
  the forward resolves through ``self``: a ``deepcopy`` (EMA, AutoBatch's probe) is an independent patched copy.
- Pickling (``torch.save`` of ``last.pt``/``best.pt``, cloudpickle for DDP) writes the stock class, so saved files
  load where ``yolo_ckpt`` is not installed. The DDP worker and ``resume`` re-apply the policy from the run's args.
- Recomputation runs BatchNorm again; a recompute context turns ``track_running_stats`` off for the layer's
  BatchNorms while it runs, so ``running_mean``/``running_var``/``num_batches_tracked`` are updated once per
  training forward pass. The recomputed output is the same: training-mode BatchNorm normalises with batch
  statistics either way.
- Active only when the layer is training, grad is enabled and the layer has a trainable parameter: eval,
  ``no_grad`` and ``inference_mode`` (val, predict, export) run the stock forward.
"""

from __future__ import annotations

import contextlib
import copy
import copyreg
import functools
from collections import Counter

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .policy import ModelLayout, RecomputePolicy, resolve

_ACTIVE_COUNTERS: list[RecomputeCounter] = []
_RECOMPUTED_CLASSES: dict[type, type] = {}


class RecomputeCounter:
    """Counts recomputations per layer index while it is active (see :func:`count_recomputations`).

    Attributes:
        per_layer: ``Counter`` of layer index ``i`` -> number of times its forward was recomputed in backward.
    """

    def __init__(self):
        self.per_layer: Counter[int] = Counter()

    @property
    def total(self) -> int:
        """Recomputations of all layers."""
        return sum(self.per_layer.values())


@contextlib.contextmanager
def count_recomputations():
    """Context manager yielding a :class:`RecomputeCounter` that counts the backward recomputations it sees.

    Tests use it to prove that recomputation ran: an engine that did nothing would count 0.
    """
    counter = RecomputeCounter()
    _ACTIVE_COUNTERS.append(counter)
    try:
        yield counter
    finally:
        _ACTIVE_COUNTERS.remove(counter)


@contextlib.contextmanager
def _recompute_context(layer: nn.Module):
    """Entered by ``torch.utils.checkpoint`` around the backward recomputation of ``layer``."""
    # The forward pass already updated the BatchNorm running statistics: put them back after the recompute.
    # (Turning track_running_stats off instead changes what batch_norm saves for backward, which checkpoint rejects.)
    stats = [b for m in layer.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) for b in m.buffers()]
    saved = [b.clone() for b in stats]
    for c in _ACTIVE_COUNTERS:
        c.per_layer[getattr(layer, "i", -1)] += 1
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in zip(stats, saved):
                b.copy_(v)


def _contexts(layer: nn.Module):
    return contextlib.nullcontext(), _recompute_context(layer)


class RecomputedLayer(nn.Module):
    """Mixin placed before a layer's own class: its forward runs under activation checkpointing when training.

    Not instantiated directly: :func:`apply_checkpointing` swaps a layer's class for ``Recomputed<Class>``.
    """

    def forward(self, *args, **kwargs):
        """The stock forward, checkpointed while training with grad enabled and a trainable parameter."""
        stock_forward = super().forward
        if self.training and torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            return checkpoint(
                stock_forward, *args, use_reentrant=False, context_fn=functools.partial(_contexts, self), **kwargs
            )
        return stock_forward(*args, **kwargs)

    def __reduce_ex__(self, protocol):
        # Pickle as the stock class: last.pt/best.pt and DDP files must load without yolo_ckpt.
        # copyreg._reconstructor is what pickle itself uses for protocols 0-1; __newobj__ would insist on type(self).
        return copyreg._reconstructor, (_stock_class(type(self)), object, None), self.__getstate__()

    def __deepcopy__(self, memo):
        # deepcopy (EMA, AutoBatch's probe) keeps the patched class; only pickling goes stock.
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return new


def _stock_class(cls: type) -> type:
    return cls.__dict__["_stock_class"] if issubclass(cls, RecomputedLayer) else cls


def _recomputed_class(stock: type) -> type:
    if stock not in _RECOMPUTED_CLASSES:
        _RECOMPUTED_CLASSES[stock] = type(
            f"Recomputed{stock.__name__}", (RecomputedLayer, stock), {"__module__": __name__, "_stock_class": stock}
        )
    return _RECOMPUTED_CLASSES[stock]


def _layers(model: nn.Module) -> nn.Sequential:
    inner = getattr(model, "module", model)  # DDP
    inner = getattr(inner, "_orig_mod", inner)  # torch.compile
    if not isinstance(getattr(inner, "model", None), nn.Sequential) or not hasattr(inner, "yaml"):
        raise TypeError(f"expected an Ultralytics BaseModel with .model layers and .yaml, got {type(model).__name__}")
    return inner


def checkpointed_layers(model: nn.Module) -> list[int]:
    """Indices of the layers of ``model.model`` that currently run under activation checkpointing."""
    return [i for i, m in enumerate(_layers(model).model) if isinstance(m, RecomputedLayer)]


def remove_checkpointing(model: nn.Module) -> None:
    """Restore every layer of ``model`` to its stock class (a no-op for an unpatched model)."""
    for m in _layers(model).model:
        if isinstance(m, RecomputedLayer):
            m.__class__ = _stock_class(type(m))


def apply_checkpointing(model: nn.Module, recompute="backbone", frozen=()) -> RecomputePolicy:
    """Recompute the layers selected by ``recompute=`` in backward instead of keeping their activations.

    Works on a bare Ultralytics ``BaseModel`` (detect, segment, obb, pose, classify), no trainer needed.
    Replaces any policy applied before, so calling it twice is safe.

    Args:
        model: an Ultralytics ``BaseModel`` (optionally wrapped in DDP or ``torch.compile``).
        recompute: a ``recompute=`` value, see :mod:`yolo_ckpt.policy`.
        frozen: indices of layers frozen with ``freeze=``, left alone.

    Returns:
        The resolved :class:`~yolo_ckpt.policy.RecomputePolicy` (parameter-free and frozen layers dropped).

    Raises:
        ValueError: for an invalid ``recompute=`` value (see :func:`yolo_ckpt.policy.resolve`); the model is then
            left unchanged.
        TypeError: if ``model`` is not an Ultralytics ``BaseModel``.
    """
    inner = _layers(model)
    policy = resolve(recompute, ModelLayout.from_model(inner), frozen)
    remove_checkpointing(inner)
    for i in policy.indices:
        layer = inner.model[i]
        layer.__class__ = _recomputed_class(type(layer))
    return policy
