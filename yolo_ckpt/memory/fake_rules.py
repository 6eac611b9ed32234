"""Shape rules for the fake pass's hottest operators: their outputs made directly, not by torch's Python
decompositions.

``FakeTensorMode`` answers an operator it has seen at the same shapes from its cache; at new shapes (every pass of a
search for the largest imgsz or batch) it runs the operator's meta function or, for BatchNorm's forward and backward
and SiLU's backward, torch's Python decomposition (``torch/_decomp/decompositions.py``: ``native_batch_norm_helper``,
``native_batch_norm_backward``, ``silu_backward``), a dozen operators each dispatched on fake tensors: ~20% of a
yolo11x pass at new shapes, measured, and more under AMP, whose 16-bit inputs the decompositions cast to float32 and
back. :class:`ShapeRuleFakeMode` makes those outputs directly where the inputs are the plain case (float32, or AMP's
float16/bfloat16 activations with float32 parameters; row-major: contiguous, or a slice of a contiguous tensor such as
a concatenation's gradient),
with the shapes, strides and dtypes the decomposition gives (tested against it: ``tests/memory/test_fake_rules.py``),
and leaves every other case, and every other operator, to ``FakeTensorMode``.
Its outputs are cached as the decomposition's would be. Fake tensors hold no values, so the rules compute none (nor
BatchNorm's running statistics, which the real kernel updates in place: no new storage).

It overrides ``FakeTensorMode._dispatch_impl`` (torch's private name for a dispatch the cache missed): a torch that
renames it runs the decompositions again, slower, the bytes the same.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

_aten = torch.ops.aten
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _row_major(t) -> bool:
    """Each dim of size > 1 strides at least the span of the dims after it: a contiguous tensor, or a slice of one
    (``narrow``, ``chunk``: a concatenation's gradient), its dims in memory in their order, none overlapping."""
    span = 1
    for n, stride in zip(reversed(t.shape), reversed(t.stride())):
        if n != 1:
            if stride < span:
                return False
            span = stride * n
    return True


def _plain(*tensors) -> bool:
    """Every tensor float32, float16 or bfloat16 (AMP's 16-bit activations with float32 parameters included) and
    row-major (:func:`_row_major`): the decomposition's elementwise outputs are then contiguous (torch's elementwise
    output strides follow the inputs' dims' order in memory, and its casts back to 16 bits keep them)."""
    return all(t.dtype in _FLOATS and _row_major(t) for t in tensors)


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """``native_batch_norm`` in training: (output like ``input``, saved mean (C,), saved inverse std (C,)); one value
    per channel is the decomposition's (it raises, as the real kernel does). The decomposition computes a 16-bit
    input in float32 and casts the output back to the input's dtype, and on the CPU the saved statistics too
    (``native_batch_norm_helper``'s ``if input.device.type == "cpu"``; float32 elsewhere)."""
    params = [t for t in (weight, bias, running_mean, running_var) if t is not None]
    if not (training and input.dim() >= 2 and input.numel() > input.shape[1] and _plain(input, *params)):
        return NotImplemented
    channels = (input.shape[1],)
    stats = input.dtype if input.device.type == "cpu" else torch.float32
    return input.new_empty(input.shape), input.new_empty(channels, dtype=stats), input.new_empty(channels, dtype=stats)


def _batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask):
    """``native_batch_norm_backward`` in training: (grad input like ``input``, grad weight (C,) and grad bias (C,) in
    ``weight``'s dtype where ``output_mask`` asks for them; the decomposition makes the grad input whatever the mask)."""
    stats = [t for t in (weight, running_mean, running_var, save_mean, save_invstd) if t is not None]
    if not (train and weight is not None and input.dim() >= 2 and grad_out.shape == input.shape and _plain(grad_out, input, *stats)):
        return NotImplemented
    channels = (input.shape[1],)
    return (
        input.new_empty(input.shape),
        weight.new_empty(channels) if output_mask[1] else None,
        weight.new_empty(channels) if output_mask[2] else None,
    )


def _silu_backward(grad_output, self):
    """``silu_backward``: the input's gradient, shaped like ``self``, in the two inputs' promoted dtype (the
    decomposition's ``pw_cast_for_opmath``: computed in float32, cast back); of two float dtypes that differ, float32
    (``torch.promote_types``, which under the mode is one more dispatched operator)."""
    if grad_output.shape != self.shape or not _plain(grad_output, self):
        return NotImplemented
    return self.new_empty(self.shape, dtype=self.dtype if grad_output.dtype == self.dtype else torch.float32)


RULES = {
    _aten.native_batch_norm.default: _batch_norm,
    _aten.native_batch_norm_backward.default: _batch_norm_backward,
    _aten.silu_backward.default: _silu_backward,
}


class ShapeRuleFakeMode(FakeTensorMode):
    """``FakeTensorMode`` with :data:`RULES`: where a rule takes the inputs (it returns ``NotImplemented`` where it
    does not), its outputs instead of the operator's decomposition (module docstring)."""

    def _dispatch_impl(self, func, types, args, kwargs):
        rule = RULES.get(func)
        if rule is not None and not kwargs:
            with self:
                out = rule(*args)
            if out is not NotImplemented:
                return out
        return super()._dispatch_impl(func, types, args, kwargs)
