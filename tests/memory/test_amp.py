"""CUDA AMP emulated on the CPU: the dtypes CUDA fp16 autocast gives, checked against CUDA autocast on fake tensors."""

import collections
import copy

import pytest
import torch
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint
from ultralytics.nn.tasks import DetectionModel

from yolo_ckpt.memory.amp import cuda_amp_emulated

pytestmark = pytest.mark.usefixtures("one_thread")


class _BytesPerDtype(TorchDispatchMode):
    """Bytes of every op's outputs per dtype (casts included)."""

    def __init__(self):
        super().__init__()
        self.bytes = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.bytes[t.dtype] += t.numel() * t.element_size()
        return out


def _fake_forward_bytes(model, device: str) -> collections.Counter:
    """Output bytes per dtype of a training forward of ``model`` on fake tensors of ``device``: on ``cuda`` under
    CUDA's own fp16 autocast (switched on by its low-level flags: ``torch.autocast("cuda")`` disables itself
    without a GPU), on ``cpu`` under the emulation."""
    mode = FakeTensorMode()
    with FakeCopyMode(mode):
        fake = copy.deepcopy(model).train()
    with mode:
        for m in fake.modules():  # parameters and buffers onto the device, without a CUDA context
            m._parameters.update(
                {
                    n: torch.nn.Parameter(torch.empty_like(p, device=device), p.requires_grad)
                    for n, p in m._parameters.items()
                    if p is not None
                }
            )
            m._buffers.update({n: torch.empty_like(b, device=device) for n, b in m._buffers.items() if b is not None})
        images = torch.empty(1, 3, 128, 128, device=device)
        counter = _BytesPerDtype()
        if device == "cpu":
            with counter, cuda_amp_emulated(True) as autocast, autocast():
                fake(images)
            return counter.bytes
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", torch.float16)
        torch.autocast_increment_nesting()
        try:
            with counter:
                fake(images)
        finally:
            torch.autocast_decrement_nesting()
            torch.clear_autocast_cache()
            torch.set_autocast_enabled("cuda", False)
        return counter.bytes


@pytest.mark.skipif(torch.version.cuda is None, reason="fake CUDA tensors need a CUDA build of torch")
def test_emulation_gives_cuda_autocast_dtypes():
    """YOLO12n's forward (area attention: softmax; upsampling; concatenations): the emulation's bytes per dtype are
    CUDA fp16 autocast's own, within 1% for fp16 and 15% for fp32 (softmax, upsample; cuDNN's fp32 BatchNorm
    statistics and a few fp32 input copies differ), 2% in all; CPU autocast alone keeps far less in fp32."""
    torch.manual_seed(0)
    model = DetectionModel("yolo12n.yaml", verbose=False)
    cuda, emulated = _fake_forward_bytes(model, "cuda"), _fake_forward_bytes(model, "cpu")
    assert emulated[torch.float16] == pytest.approx(cuda[torch.float16], rel=0.01)
    assert emulated[torch.float32] == pytest.approx(cuda[torch.float32], rel=0.15) and cuda[torch.float32] > 0.02 * cuda[torch.float16]
    assert sum(emulated.values()) == pytest.approx(sum(cuda.values()), rel=0.02)
    # without the fp32 ops, CPU autocast alone puts next to nothing in fp32
    mode = FakeTensorMode()
    with FakeCopyMode(mode):
        fake = copy.deepcopy(model).train()
    with mode, _BytesPerDtype() as counter, torch.autocast("cpu", dtype=torch.float16):
        fake(torch.empty(1, 3, 128, 128))
    assert counter.bytes[torch.float32] < 0.5 * cuda[torch.float32]


def test_softmax_stays_fp32_forward_and_recomputed():
    """A fake CUDA AMP step of a softmax over a matmul: the matmul in fp16, the softmax (CUDA's fp32 list) in fp32,
    and so in a checkpoint's recomputation in backward (no CheckpointError); the weight's gradient fp32."""
    with FakeTensorMode():
        w = torch.empty(64, 64, requires_grad=True)
        seen = []

        def block(x):
            y = x @ w
            s = y.softmax(-1)
            seen.append((y.dtype, s.dtype))
            return s

        with cuda_amp_emulated(True) as autocast:
            with autocast():
                out = checkpoint(block, torch.empty(8, 64), use_reentrant=False)
            out.float().sum().backward()
    # the recomputation stops at the last tensor backward needs (the softmax output): its dtype matched the forward's, or
    # checkpoint would have raised a CheckpointError
    assert seen == [(torch.float16, torch.float32)] and out.dtype == torch.float32 and w.grad.dtype == torch.float32
    with cuda_amp_emulated(False) as autocast, autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
