"""The attention region's chunking of a model at an image size: for each ``Attention``/``AAttn`` module, its layer, the
tokens N its N x N product spans and whether the region runs it in chunks (N > ``attn_chunk``) or as stock. What
``profile`` and the run report show (:func:`yolo_ckpt.report.record.attention_text`)."""

from __future__ import annotations

import torch

from ..checkpointing.attention import ATTENTION_CLASSES
from .fake_copy import fake_copy
from .ultralytics_rules import input_channels


def attention_tokens(model: torch.nn.Module, imgsz: int, attn_chunk: int) -> dict:
    """The attention region of ``model`` (an Ultralytics model) at a square ``imgsz`` (px) with ``attn_chunk``: one
    fake forward of one image (``FakeTensorMode``: shapes, no data) reads each attention module's input.

    Returns:
        ``{"attn_chunk": attn_chunk, "modules": [{"layer", "module", "tokens", "chunked"}, ...]}``, a row per module in
        ``model.model`` order: ``layer`` the index in ``model.model``, ``module`` ``Attention`` or ``AAttn``,
        ``tokens`` N = H x W of its input (per area for ``AAttn``: H x W / ``area``, as ``AAttn.forward`` splits it),
        ``chunked`` whether N > ``attn_chunk`` (:mod:`yolo_ckpt.checkpointing.attention` runs the others stock).
        ``modules`` is empty for a model without attention layers.
    """
    rows = []
    with fake_copy(model) as (mode, fake):
        layer_of = {m: i for i, layer in enumerate(fake.model) for m in layer.modules() if isinstance(m, ATTENTION_CLASSES)}

        def record(module, args):
            h, w = args[0].shape[-2:]
            tokens = int(h * w) // getattr(module, "area", 1)
            stock = next(c for c in ATTENTION_CLASSES if isinstance(module, c)).__name__
            rows.append({"layer": layer_of[module], "module": stock, "tokens": tokens, "chunked": tokens > attn_chunk})

        hooks = [m.register_forward_pre_hook(record) for m in layer_of]
        try:
            with mode, torch.no_grad():
                fake(torch.empty(1, input_channels(model), imgsz, imgsz, device=next(fake.parameters()).device))
        finally:
            for hook in hooks:
                hook.remove()
    return {"attn_chunk": attn_chunk, "modules": rows}
