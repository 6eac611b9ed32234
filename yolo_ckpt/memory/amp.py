"""CUDA's AMP, emulated on the CPU for the memory model: the dtypes CUDA fp16 autocast gives each op.

An estimate of a CUDA AMP run must give each activation the dtype (and so the bytes) that CUDA autocast gives it.
Fake tensors can be put on device ``cuda`` on a machine without a GPU, and CUDA autocast then applies its own op
lists in a fake forward pass, but autograd's engine cannot run their backward without a CUDA device
(``hasPrimaryContext expects a valid device index``; torch 2.14). So the fake pass stays on the CPU, under CPU
autocast in fp16, whose lower-precision list (convolutions, matmuls, linear) is CUDA's, and :class:`CudaFp32Ops`
runs the ops of CUDA autocast's fp32 lists in fp32, as CUDA does and CPU autocast does not: softmax, sum, exp, log,
pow and the upsampling ops among them. The tests compare the bytes per dtype of a YOLO12 forward against CUDA
autocast's own on fake CUDA tensors.
"""

from __future__ import annotations

import contextlib

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

# CUDA autocast's fp32 and fp32-with-optional-dtype lists (PyTorch's aten/src/ATen/autocast_mode.cpp; the AMP docs'
# "CUDA Ops that can autocast to float32"), as the aten ops a dispatch mode sees them: composite ops decomposed
# (softmax -> _softmax, layer_norm -> native_layer_norm, F.interpolate -> upsample_*)
CUDA_FP32_OPS = frozenset(
    """acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus native_layer_norm
    native_group_norm frobenius_norm nuclear_norm cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss
    nll_loss_forward nll_loss2d nll_loss2d_forward hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss
    mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss multi_margin_loss
    binary_cross_entropy_with_logits dist pdist _pdist_forward cdist _cdist_forward renorm logsumexp
    upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d _upsample_nearest_exact2d upsample_nearest3d
    _upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d
    upsample_bicubic2d _upsample_bicubic2d_aa prod _softmax _log_softmax cumprod cumsum linalg_vector_norm
    linalg_matrix_norm sum""".split()
)
_HALF = (torch.float16, torch.bfloat16)
_DEVICE = torch.ops.prim.device.default


class CudaFp32Ops(TorchDispatchMode):
    """Run the aten ops of :data:`CUDA_FP32_OPS` on fp32 copies of their fp16/bf16 tensor arguments (outputs fp32),
    as CUDA autocast does, where autograd records (grad mode on: the forward, and a checkpoint's recomputation in
    backward, which CUDA runs under the forward's autocast); backward ops and everything else run as called. 16-bit
    tensors only come from autocast here, so outside it the mode changes nothing."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE:  # a fake tensor's device query: no dtype to change
            return args[0].device
        kwargs, name = kwargs or {}, func.overloadpacket.__name__
        if torch.is_grad_enabled() and name in ("_softmax", "_log_softmax") and args[0].dtype in _HALF and isinstance(args[0], FakeTensor):
            args = (*args[:2], True)  # half_to_float, as CUDA autocast calls it: an fp32 output, no fp32 copy of the input
        elif torch.is_grad_enabled() and name in CUDA_FP32_OPS:
            upcast = lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype in _HALF else t  # noqa: E731
            args, kwargs = tree_map(upcast, args), tree_map(upcast, kwargs)
            if name in ("_softmax", "_log_softmax"):
                args = (*args[:2], False)  # real CPU tensors have no half_to_float: an fp32 copy of the input instead
        elif name in ("_softmax_backward_data", "_log_softmax_backward_data") and args[3] in _HALF and args[0].dtype == torch.float32:
            # autograd recorded the fp16 input; the fp32 output's gradient is fp32 (autograd casts it back to fp16,
            # as CUDA's backward of its fp32 copy does)
            args = (*args[:3], torch.float32)
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_amp_emulated(amp: bool):
    """Emulate a CUDA AMP training step on the CPU (real or fake tensors): yields the autocast for its forward and
    loss (CPU autocast in fp16; a no-op without ``amp``). :class:`CudaFp32Ops` stays active for the whole block, the
    backward included, since a checkpoint's recomputation in backward must give its tensors the forward's dtypes;
    enter it inside any :class:`~yolo_ckpt.memory.tracker.LiveTensorTracker`, so that the tracker counts its fp32 copies."""
    if not amp:
        yield contextlib.nullcontext
        return
    with CudaFp32Ops():
        yield lambda: torch.autocast("cpu", dtype=torch.float16)
