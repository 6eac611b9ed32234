"""A model's self-attention modules (Ultralytics' ``Attention`` and ``AAttn``) as functions of imgsz: tokens N per
N x N score matrix, the FLOPs of one score product, and the attention region's chunking at a size.

Stock attention's matrices grow with imgsz^4 where every other term of a training step grows with imgsz^2
(:class:`yolo_ckpt.memory.composed.ComposedEstimate` composes both); ``profile`` and the run report show which modules
the region runs in chunks (:func:`attention_tokens`, :func:`yolo_ckpt.report.record.attention_text`).

``Attention`` (``PSABlock``, ``C2PSA``, ``PSA``, YOLO26's attention ``C3k2``) builds, per image and head, one N x N
matrix of the N = H x W tokens of its input; ``AAttn`` (``A2C2f``) one per area of N / ``area`` tokens, as their
``forward`` in ``ultralytics/nn/modules/block.py`` splits them. The shapes are read from one fake forward
(``FakeTensorMode``: shapes, no data; :func:`attention_modules`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checkpointing.attention import ATTENTION_CLASSES
from .fake_copy import fake_copy
from .ultralytics_rules import input_channels


@dataclass(frozen=True)
class AttentionShape:
    """One ``Attention``/``AAttn`` module's score matrices.

    Attributes:
        index: its layer in ``model.model``.
        module: ``"Attention"`` or ``"AAttn"``.
        stride: pixels of the image per token side (its input's stride).
        groups: score matrices per image and head (``AAttn``'s ``area``; 1 for ``Attention``).
        heads: attention heads; key_dim: channels of a query and a key; head_dim: channels of a value.
    """

    index: int
    module: str
    stride: int
    groups: int
    heads: int
    key_dim: int
    head_dim: int

    def tokens(self, imgsz: int) -> int:
        """Tokens N of one score matrix (N x N) at a trained ``imgsz`` (px, a multiple of the model's largest stride)."""
        return (imgsz // self.stride) ** 2 // self.groups

    def score_flops(self, batch: int, imgsz: int) -> int:
        """FLOPs of the scores ``(q * scale)^T @ k`` for a batch: ``2 * batch * groups * heads * N^2 * key_dim``."""
        return 2 * batch * self.groups * self.heads * self.tokens(imgsz) ** 2 * self.key_dim

    def recompute_flops(self, batch: int, imgsz: int) -> int:
        """FLOPs the attention region's backward adds to stock's for a batch: it rebuilds the scores twice (by query
        rows, then by key columns: 2 x :meth:`score_flops`) and the product of the output's gradient with the values
        once more, ``2 * N^2 * head_dim`` per image, group and head: ``batch * groups * heads * N^2 * (4 * key_dim + 2 *
        head_dim)``, what torch's FLOP counter counts (``tests/bench/test_step_cell.py``)."""
        return batch * self.groups * self.heads * self.tokens(imgsz) ** 2 * (4 * self.key_dim + 2 * self.head_dim)


def attention_modules(model: torch.nn.Module) -> tuple[AttentionShape, ...]:
    """The :class:`AttentionShape` of each ``Attention``/``AAttn`` module of an Ultralytics ``BaseModel``, in forward
    order, read from one fake forward of one image of 128 px or 4x the largest stride (a fake copy: the model and its
    BatchNorm statistics are not touched); ``()`` for a model without attention."""
    probe = max(128, 4 * int(max(model.stride)))  # a classifier's stride is 1: its layers still halve the image 5 times
    shapes: list[AttentionShape] = []
    with fake_copy(model) as (mode, fake):
        layer_of = {m: i for i, layer in enumerate(fake.model) for m in layer.modules() if isinstance(m, ATTENTION_CLASSES)}
        if not layer_of:
            return ()

        def record(module, args):
            heads, key_dim = module.num_heads, getattr(module, "key_dim", None) or module.head_dim
            stock = next(c for c in ATTENTION_CLASSES if isinstance(module, c)).__name__
            stride = probe // int(args[0].shape[-1])
            shape = (getattr(module, "area", 1), heads, key_dim, module.head_dim)
            shapes.append(AttentionShape(layer_of[module], stock, stride, *shape))

        hooks = [m.register_forward_pre_hook(record) for m in layer_of]
        try:
            with mode, torch.no_grad():
                fake(torch.empty(1, input_channels(model), probe, probe, device=next(fake.parameters()).device))
        finally:
            for hook in hooks:
                hook.remove()
    return tuple(shapes)


def attention_tokens(model: torch.nn.Module, imgsz: int, attn_chunk: int, shapes: tuple[AttentionShape, ...] | None = None) -> dict:
    """The attention region of ``model`` (an Ultralytics model) at a square trained ``imgsz`` (px) with ``attn_chunk``,
    from ``shapes`` where the caller has them (a memory model's ``attention``), else :func:`attention_modules`.

    Returns:
        ``{"attn_chunk": attn_chunk, "modules": [{"layer", "module", "tokens", "chunked"}, ...]}``, a row per module in
        forward order: ``layer`` the index in ``model.model``, ``module`` ``Attention`` or ``AAttn``,
        ``tokens`` N = H x W of its input (per area for ``AAttn``: H x W / ``area``, as ``AAttn.forward`` splits it),
        ``chunked`` whether N > ``attn_chunk`` (:mod:`yolo_ckpt.checkpointing.attention` runs the others stock).
        ``modules`` is empty for a model without attention layers.
    """
    rows = [
        {"layer": a.index, "module": a.module, "tokens": a.tokens(imgsz), "chunked": a.tokens(imgsz) > attn_chunk}
        for a in (attention_modules(model) if shapes is None else shapes)
    ]
    return {"attn_chunk": attn_chunk, "modules": rows}
