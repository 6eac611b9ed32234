"""The fake pass's shape rules (yolo_ckpt.memory.fake_rules) give the outputs torch's own fake dispatch gives (its
decompositions): the same shapes, strides and dtypes, odd sizes and size-1 dims included, and where a rule does not
take the inputs (channels-last, half, eval) the decomposition runs; and a fake training step counts the same bytes
with and without them, float32 and AMP's 16-bit activations (float32 parameters) alike."""

import copy

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode

from yolo_ckpt.memory.fake_rules import RULES, ShapeRuleFakeMode
from yolo_ckpt.memory.tracker import LiveTensorTracker

aten = torch.ops.aten
SHAPES = [(2, 3, 5, 7), (2, 16, 1, 1), (3, 8, 33, 17), (4, 5)]


def _meta(out) -> list:
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [None if t is None else (tuple(t.shape), t.stride(), t.dtype, t.untyped_storage().nbytes()) for t in outs]


def _sliced(shape, dtype, dim):
    """A tensor of ``shape`` that is a slice along ``dim`` of a larger contiguous one (as a concatenation's gradient
    is): not contiguous, its dims in memory in their order."""
    return torch.empty(*shape[:dim], shape[dim] + 3, *shape[dim + 1:], dtype=dtype).narrow(dim, 1, shape[dim])


def _both(call, *shapes, channels_last=False, dtype=torch.float32, sliced=None, activations=None, device="cpu"):
    """``call(mode, tensors)``'s outputs under torch's FakeTensorMode and under ShapeRuleFakeMode, with fresh
    caches (the cache is shared by every mode); ``sliced``: the indices of the tensors made slices along dim 1
    (:func:`_sliced`); ``activations``: the dtype of the tensors of more than one dim (AMP's), ``dtype`` the others'."""
    results = []
    for mode_class in (FakeTensorMode, ShapeRuleFakeMode):
        FakeTensorMode.cache_clear()
        mode = mode_class()
        with mode:
            dtypes = [activations if activations and len(s) > 1 else dtype for s in shapes]
            tensors = [_sliced(s, d, 1) if i in (sliced or ()) else torch.empty(s, dtype=d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
            tensors = [t.to(device) for t in tensors]
            if channels_last:
                tensors = [t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for t in tensors]
            results.append(_meta(call(tensors)))
    return results


# (parameters' dtype, activations' dtype): float32; CPU autocast's float16 activations with float32 parameters (an AMP
# fake pass's BatchNorm), and bfloat16's; 16 bits throughout
DTYPES = [(torch.float32, None), (torch.float32, torch.float16), (torch.float32, torch.bfloat16), (torch.float16, None)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtypes", DTYPES)
def test_batch_norm_and_its_backward_as_torch_gives_them(shape, channels_last, dtypes):
    """native_batch_norm in training (output, saved mean and inverse std) and its backward (every output_mask):
    the rule's outputs equal the decomposition's in shape, strides, dtype and storage bytes (16-bit saved statistics
    and float32 parameter gradients under AMP)."""
    dtype, activations = dtypes
    c = shape[1]

    def forward(t):
        x, w, b, rm, rv = t
        return aten.native_batch_norm.default(x, w, b, rm, rv, True, 0.03, 1e-3)

    plain, ruled = _both(forward, shape, (c,), (c,), (c,), (c,), channels_last=channels_last, dtype=dtype, activations=activations)
    assert plain == ruled
    for mask in ([True, True, True], [True, False, True], [False, True, False]):

        def backward(t, mask=mask):
            g, x, w, rm, rv, sm, si = t
            sm, si = sm.to(x.dtype), si.to(x.dtype)  # as the forward saved them on the CPU
            return aten.native_batch_norm_backward.default(g, x, w, rm, rv, sm, si, True, 1e-3, mask)

        plain, ruled = _both(backward, shape, shape, *[(c,)] * 5, channels_last=channels_last, dtype=dtype, activations=activations)
        assert plain == ruled


def test_batch_norm_on_fake_cuda_tensors_as_torch_gives_it():
    """Off the CPU the decomposition keeps a 16-bit input's saved statistics in float32 (fake CUDA tensors: no GPU
    needed); the rule's outputs equal its, forward and backward."""
    shape, c = (3, 8, 33, 17), 8
    forward = lambda t: aten.native_batch_norm.default(*t, True, 0.03, 1e-3)  # noqa: E731
    plain, ruled = _both(forward, shape, *[(c,)] * 4, activations=torch.float16, device="cuda")
    assert plain == ruled and plain[1][2] == torch.float32
    backward = lambda t: aten.native_batch_norm_backward.default(*t, True, 1e-3, [True, True, True])  # noqa: E731
    plain, ruled = _both(backward, shape, shape, *[(c,)] * 5, activations=torch.float16, device="cuda")
    assert plain == ruled


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("sliced", [(), (0,), (1,), (0, 1)])
@pytest.mark.parametrize("activations", [None, torch.float16])
def test_batch_norm_backward_of_a_sliced_gradient_as_torch_gives_it(shape, sliced, activations):
    """A slice of a concatenation's gradient (or input) into BatchNorm's backward: the rule's grad input equals the
    decomposition's (contiguous), and the forward on a sliced input too; float32, and AMP's float16 activations."""
    c = shape[1]

    def backward(t):
        g, x, w, rm, rv, sm, si = t
        sm, si = sm.to(x.dtype), si.to(x.dtype)
        return aten.native_batch_norm_backward.default(g, x, w, rm, rv, sm, si, True, 1e-3, [True, True, True])

    plain, ruled = _both(backward, shape, shape, (c,), (c,), (c,), (c,), (c,), sliced=sliced, activations=activations)
    assert plain == ruled
    forward = lambda t: aten.native_batch_norm.default(*t, True, 0.03, 1e-3)  # noqa: E731
    plain, ruled = _both(forward, shape, (c,), (c,), (c,), (c,), sliced=(0,) if 0 in sliced else (), activations=activations)
    assert plain == ruled


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("sliced", [(), (0,), (1,), (0, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_silu_backward_as_torch_gives_it(shape, sliced, dtype):
    """SiLU's backward: contiguous inputs, and a slice of a concatenation's gradient (the C2f/C3k2 blocks' case), in
    float32 and in AMP's 16 bits; and a float32 gradient into a float16 input (the promoted dtype, float32)."""
    plain, ruled = _both(lambda t: aten.silu_backward.default(*t), shape, shape, sliced=sliced, dtype=dtype)
    assert plain == ruled
    plain, ruled = _both(lambda t: aten.silu_backward.default(t[0], t[1].half()), shape, shape, dtype=dtype)
    assert plain == ruled


def test_rules_run_where_they_take_the_inputs(monkeypatch):
    """The rules are what runs on the plain case (no decomposition), and not on others; one value per channel
    raises as torch does."""
    from yolo_ckpt.memory import fake_rules

    taken = []
    def recorded(op, rule):
        def run(*args):
            out = rule(*args)
            if out is not NotImplemented:
                taken.append(op)
            return out

        return run

    for op, rule in list(RULES.items()):
        monkeypatch.setitem(fake_rules.RULES, op, recorded(op, rule))
    FakeTensorMode.cache_clear()
    with ShapeRuleFakeMode():
        x, w = torch.empty(2, 3, 5, 7), torch.empty(3)
        aten.native_batch_norm.default(x, w, w, w, w, True, 0.03, 1e-3)
        aten.native_batch_norm.default(x, w, w, w, w, False, 0.03, 1e-3)  # eval: the decomposition
        aten.native_batch_norm.default(x.half(), w, w, w, w, True, 0.03, 1e-3)  # AMP's float16 input: the rule's
        aten.native_batch_norm.default(x.double(), w, w, w, w, True, 0.03, 1e-3)  # float64: the decomposition
        aten.silu_backward.default(x, x)
        aten.silu_backward.default(x.narrow(1, 1, 2), x.narrow(1, 0, 2))  # slices of a contiguous tensor: the rule's
        aten.silu_backward.default(x.transpose(2, 3), x.transpose(2, 3))  # dims out of order in memory: the decomposition
        aten.silu_backward.default(x.bfloat16(), x.bfloat16())  # 16 bits: the rule's
        with pytest.raises(ZeroDivisionError):  # the decomposition's; the real kernel raises a ValueError
            aten.native_batch_norm.default(torch.empty(1, 3, 1, 1), w, w, w, w, True, 0.03, 1e-3)
    # made by a rule: training, float32 or 16 bits, row-major (contiguous or sliced)
    bn, silu = aten.native_batch_norm.default, aten.silu_backward.default
    assert taken == [bn, bn, silu, silu, silu]


def _fake_step_peak(module, shape, mode_class, amp) -> int:
    FakeTensorMode.cache_clear()
    mode = mode_class()
    with FakeCopyMode(mode):
        fake = copy.deepcopy(module)
    with mode, LiveTensorTracker() as tracker:
        x = torch.empty(shape).requires_grad_()
        tracker.track(list(fake.parameters()), list(fake.buffers()), x)
        with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
            y = fake(x)
        y.float().sum().backward()
    return tracker.peak_bytes


@pytest.mark.parametrize("shape", [(2, 3, 31, 17), (1, 3, 64, 64)])
@pytest.mark.parametrize("amp", [False, True])
def test_fake_step_counts_the_same_bytes_with_the_rules(shape, amp):
    """A training step of Conv, BatchNorm and SiLU blocks (Ultralytics' Conv), forward and backward on fake
    tensors, in float32 and under the AMP estimate's CPU fp16 autocast (float16 activations into BatchNorm): the
    live-tensor tracker's peak is the same with and without the rules, to the byte."""
    from ultralytics.nn.modules.conv import Conv

    torch.manual_seed(0)
    module = nn.Sequential(Conv(3, 8, 3, 2), Conv(8, 16, 3, 1), Conv(16, 5, 1, 1)).train()
    peak = _fake_step_peak(module, shape, FakeTensorMode, amp)
    assert peak == _fake_step_peak(module, shape, ShapeRuleFakeMode, amp) > 0
