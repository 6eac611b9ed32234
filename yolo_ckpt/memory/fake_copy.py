"""A model copied onto fake tensors, kept and reused: what every fake pass runs on (the estimate's step and the
loss calibration's predictions).

A fake copy (``torch._subclasses.FakeTensorMode``: shapes, dtypes and storages, no data) costs a third of a fake pass's
time on a nano model, and a plan makes a dozen passes of one model: :func:`fake_copy` makes one per model and reuses it
while it stays as a fresh copy would be.
"""

from __future__ import annotations

import contextlib
import copy
import weakref

import torch
from torch._subclasses.fake_tensor import FakeCopyMode

from ..checkpointing.engine import remove_checkpointing
from .fake_rules import ShapeRuleFakeMode

# model -> (its layout, the fake mode, the fake copy, the copy's attributes): one fake copy per model, reused by every
# fake pass of it
_FAKE_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SCALARS = (bool, int, float, str, type(None))


def _layout(model: torch.nn.Module) -> tuple:
    """What a fake copy of ``model`` is made of: its modules' classes and plain attributes (flags such as a head's
    ``end2end``) and its tensors' names, shapes, dtypes and ``requires_grad`` (``freeze=``)."""
    return (
        tuple((type(m), tuple((k, v) for k, v in vars(m).items() if isinstance(v, _SCALARS))) for m in model.modules()),
        tuple((n, t.shape, t.dtype, t.requires_grad) for n, t in (*model.named_parameters(), *model.named_buffers())),
    )


def _attributes(model: torch.nn.Module) -> list:
    """Every module's class, attributes (plain values, else the object's identity), tensors' identities and hooks: a
    fake pass that leaves these as it found them leaves nothing behind that the next pass could see (a cached
    anchor grid, a hook, a gradient)."""
    return [
        (type(m), {k: v if isinstance(v, _SCALARS) else id(v) for k, v in vars(m).items()},
         {k: id(v) for k, v in m._parameters.items()}, {k: id(v) for k, v in m._buffers.items()},
         len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks), len(m._backward_pre_hooks))
        for m in model.modules()
    ] + [p.grad is None for p in model.parameters()]


@contextlib.contextmanager
def fake_copy(model: torch.nn.Module):
    """``(FakeTensorMode, fake copy of model)``: ``model`` copied onto fake tensors (``FakeCopyMode``: shapes, dtypes
    and storages, no data; the mode a :class:`~yolo_ckpt.memory.fake_rules.ShapeRuleFakeMode`) in training mode,
    with no policy applied. The copy is kept per model and reused while the model's layout (:func:`_layout`) stays
    the same; after each use its policy is removed and its gradients dropped, and a use that left anything else behind
    (a new attribute, a hook) discards it, so every pass starts from a copy as a fresh ``deepcopy`` makes it."""
    layout = _layout(model)
    kept = _FAKE_COPIES.pop(model, None)
    if kept is not None and kept[0] == layout:
        _, fake_mode, fake, attributes = kept
    else:
        fake_mode = ShapeRuleFakeMode(allow_non_fake_inputs=False)
        with FakeCopyMode(fake_mode):
            fake = copy.deepcopy(model).train()
        remove_checkpointing(fake)
        attributes = _attributes(fake)
    yield fake_mode, fake
    remove_checkpointing(fake)
    for p in fake.parameters():
        p.grad = None
    if _attributes(fake) == attributes:  # not on an exception (it skips this): that copy is dropped
        _FAKE_COPIES[model] = (layout, fake_mode, fake, attributes)
