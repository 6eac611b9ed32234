"""The shapes of a model's self-attention modules (Ultralytics' ``Attention`` and ``AAttn``) as functions of imgsz:
tokens per score matrix, and the FLOPs of one score product, which grow with imgsz^4 where every other term of a
training step grows with imgsz^2 (:class:`yolo_ckpt.memory.composed.ComposedEstimate` composes both).

``Attention`` (``PSABlock``, ``C2PSA``, ``PSA``) builds, per image and head, one N x N matrix of the N = H x W tokens
of its input; ``AAttn`` (``A2C2f``) one per area of N / ``area`` tokens. The shapes are read from one small forward
(:func:`attention_modules`), mirroring their ``forward`` in ``ultralytics/nn/modules/block.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checkpointing.attention import ATTENTION_CLASSES


@dataclass(frozen=True)
class AttentionShape:
    """One ``Attention``/``AAttn`` module's score matrices.

    Attributes:
        index: its layer in ``model.model``.
        stride: pixels of the image per token side (its input's stride).
        groups: score matrices per image and head (``AAttn``'s ``area``; 1 for ``Attention``).
        heads: attention heads; key_dim: channels of a query and a key.
    """

    index: int
    stride: int
    groups: int
    heads: int
    key_dim: int

    def tokens(self, imgsz: int) -> int:
        """Tokens N of one score matrix (N x N) at a trained ``imgsz`` (a multiple of the model's largest stride)."""
        return (imgsz // self.stride) ** 2 // self.groups

    def score_flops(self, batch: int, imgsz: int) -> int:
        """FLOPs of the scores ``(q * scale)^T @ k`` for a batch: ``2 * batch * groups * heads * N^2 * key_dim``."""
        return 2 * batch * self.groups * self.heads * self.tokens(imgsz) ** 2 * self.key_dim


def attention_modules(model) -> tuple[AttentionShape, ...]:
    """The :class:`AttentionShape` of each ``Attention``/``AAttn`` module of an Ultralytics ``BaseModel``, in forward
    order, read from one forward of a blank image of 128 px or 4x the largest stride (``no_grad``, eval mode: the BatchNorm
    statistics are not touched; the model's mode is restored); ``()`` for a model without attention."""
    names = {m: name for name, m in model.model.named_modules() if isinstance(m, ATTENTION_CLASSES)}
    if not names:
        return ()
    probe = max(128, 4 * int(max(model.stride)))  # a classifier's stride is 1: its layers still halve the image 5 times
    shapes: list[AttentionShape] = []

    def record(module, args):
        heads, key_dim = module.num_heads, getattr(module, "key_dim", None) or module.head_dim
        index, stride = int(names[module].split(".")[0]), probe // args[0].shape[-1]
        shapes.append(AttentionShape(index, stride, getattr(module, "area", 1), heads, key_dim))

    handles = [m.register_forward_pre_hook(record) for m in names]
    training = model.training
    param = next(model.parameters())
    try:
        with torch.no_grad():
            model.eval()
            model(torch.zeros(1, model.yaml.get("channels", 3), probe, probe, dtype=param.dtype, device=param.device))
    finally:
        model.train(training)
        for h in handles:
            h.remove()
    return tuple(shapes)
