"""The memory model sees the attention region (yolo_ckpt.checkpointing.attention): its temporaries are counted by the
live-tensor tracker on real tensors and in the fake pass on fake tensors (never under, at most a few percent over);
and its peak is a fraction of stock's N x N working set."""

import copy

import pytest
import torch
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode
from ultralytics.nn.modules.block import Attention

from yolo_ckpt.checkpointing.attention import chunked_class
from yolo_ckpt.memory.tracker import LiveTensorTracker

pytestmark = pytest.mark.usefixtures("one_thread")


def _step_peak(module, x) -> int:
    """Peak bytes of one forward and backward of ``module`` on ``x`` (parameters and input counted)."""
    x = x.clone().requires_grad_()
    with LiveTensorTracker() as tracker:
        tracker.track(list(module.parameters()), x)
        out = module(x)
        out.backward(torch.ones_like(out))
    return tracker.peak_bytes


def _fake_step_peak(module, shape) -> int:
    fake_mode = FakeTensorMode()
    with FakeCopyMode(fake_mode):
        fake = copy.deepcopy(module)
    with fake_mode:
        return _step_peak(fake, torch.zeros(shape))


def test_tracker_and_fake_pass_count_the_region():
    """yolo11n's C2PSA attention at 1024 tokens (imgsz 1024), attn_chunk 64: the fake pass's peak equals the live
    tracker's for stock and is within 0-5% above it for the region, whose peak is under half of stock's (stock keeps
    N x N matrices, 4 MiB each per head)."""
    torch.manual_seed(0)
    stock = Attention(128, 2, 0.5).train()
    chunked = copy.deepcopy(stock)
    chunked.__class__ = chunked_class(Attention, 64)
    x = torch.randn(1, 128, 32, 32)
    real = {name: _step_peak(m, x) for name, m in (("stock", stock), ("chunked", chunked))}
    fake = {name: _fake_step_peak(m, x.shape) for name, m in (("stock", stock), ("chunked", chunked))}
    assert fake["stock"] == real["stock"]
    assert real["chunked"] <= fake["chunked"] <= 1.05 * real["chunked"]
    assert real["chunked"] < 0.5 * real["stock"]
    assert real["stock"] > 3 * 2 * 1024**2 * 4  # at least three N x N float matrices of the two heads alive at once


@pytest.mark.parametrize("odd", [False, True])
def test_fake_pass_runs_a_few_steps_of_the_region_loops_at_the_same_peak(monkeypatch, odd):
    """The fake pass runs one row block of the softmax kernels' loops per chunk (``_fake_once``) and the chunk loops'
    shortest walk over their chunks' lengths (``_fake_walk``: 2 or 3 steps of 16 here; minutes saved per pass at
    2048-3072 px) at the peak of all of them, to the byte. ``odd``: 31 x 33 tokens, so blocks and chunks differ in
    length (63 and 64)."""
    from yolo_ckpt.checkpointing import attention as region

    torch.manual_seed(0)
    module = Attention(128, 2, 0.5).train()
    module.__class__ = chunked_class(Attention, 64)
    shape = (1, 128, 31, 33) if odd else (1, 128, 32, 32)
    n = shape[2] * shape[3]
    parts = region.chunks(n, 64)
    monkeypatch.setattr(region, "ROW_BLOCK", 1 << 14)  # several blocks a chunk at 1024 tokens
    runs = []
    fake_once = region._fake_once
    monkeypatch.setattr(region, "_fake_once", lambda steps, t: runs.append(len(done := fake_once(steps, t))) or done)
    peaks = {}
    for once in (False, True):
        monkeypatch.setattr(region, "FAKE_ONCE", once)
        runs.clear()
        peaks[once] = _fake_step_peak(module, shape)
        if once:
            walk = 3 if odd else 2  # chunks of 63 and 64 tokens, or of 64 alone
            assert len(parts) == 16 and runs == [1] * 2 * walk  # one block per chunk of the walk, in each backward pass
        else:  # pass 1: blocks of each query chunk's widened rows; pass 2: of all rows of a key chunk, widened by one
            blocks = [len(region.chunks(c.stop - c.start, region.ROW_BLOCK // (2 * (region.PREFIX + n)))) for c in parts]
            blocks += [len(region.chunks(n, region.ROW_BLOCK // (2 * (1 + c.stop - c.start)))) for c in parts]
            assert runs == blocks and sum(blocks) > 4 * len(parts)
    assert peaks[True] == peaks[False]


def test_fake_walk_keeps_the_first_and_last_length_and_each_pair_of_lengths():
    """``_fake_walk`` on fake tensors: the shortest walk with the chunks' first and last length and exactly their pairs
    of consecutive lengths (each step's peak depends on its length and the previous one's); real tensors keep every
    chunk."""
    from yolo_ckpt.checkpointing.attention import _fake_walk, chunks

    def lengths(n, chunk):
        with FakeTensorMode():
            return [p.stop - p.start for p in _fake_walk(chunks(n, chunk), torch.empty(1))]

    assert [p.stop - p.start for p in chunks(3841, 256)] == [240] * 15 + [241]
    assert lengths(3841, 256) == [240, 240, 241]
    assert [p.stop - p.start for p in chunks(1023, 64)][:4] == [63, 64, 64, 64]
    walk = lengths(1023, 64)
    original = [p.stop - p.start for p in chunks(1023, 64)]
    assert (walk[0], walk[-1]) == (original[0], original[-1]) and set(zip(walk, walk[1:])) == set(zip(original, original[1:]))
    assert len(walk) <= 5
    assert lengths(512, 256) == [256, 256]  # two chunks: both run
    assert len(_fake_walk(chunks(3841, 256), torch.empty(1))) == 16


@pytest.mark.parametrize(
    "case, shape, chunk, runs",
    [("Attention", (1, 64, 32, 32), 64, 4), ("Attention", (1, 64, 31, 33), 64, 5), ("AAttn", (1, 64, 64, 64), 64, 4)],
    ids=["attention", "attention-odd", "area-attention"],
)
def test_fake_pass_runs_a_few_autocast_chunks_at_the_same_peaks(monkeypatch, case, shape, chunk, runs):
    """Under CUDA AMP (emulated: :func:`yolo_ckpt.memory.amp.cuda_amp_emulated`) the region runs stock's product on
    checkpointed query chunks, whose outputs are held until their concatenation; the fake pass runs the first two and
    last two of each length (``_fake_run``) and holds the others' outputs as empty tensors of their shape: the
    forward's and the backward's peaks equal those of every chunk run, to the byte. ``attention-odd``: 31 x 33 tokens,
    chunks of 63 and 64 (5 of 16 run); ``area-attention``: YOLO12's ``AAttn`` over 4 areas of 1024 tokens, 16 chunks of
    64 each."""
    from ultralytics.nn.modules.block import AAttn

    from yolo_ckpt.checkpointing import attention as region
    from yolo_ckpt.memory.amp import cuda_amp_emulated

    torch.manual_seed(0)
    stock = Attention if case == "Attention" else AAttn
    # few channels: the forward's peak is in the chunk loop
    module = (Attention(64, 2, 0.5) if case == "Attention" else AAttn(64, 2, area=4)).train()
    module.__class__ = chunked_class(stock, chunk)
    parts = region.chunks(shape[2] * shape[3] // (1 if case == "Attention" else 4), chunk)
    lengths = [p.stop - p.start for p in parts]
    calls = []
    core = region._stock_core
    monkeypatch.setattr(region, "_stock_core", lambda q, *a: calls.append(q.shape[-1]) or core(q, *a))
    fake_mode = FakeTensorMode()
    with FakeCopyMode(fake_mode):
        fake = copy.deepcopy(module)
    peaks = {}
    for once in (False, True):
        monkeypatch.setattr(region, "FAKE_ONCE", once)
        calls.clear()
        with fake_mode, LiveTensorTracker() as tracker, cuda_amp_emulated(True) as autocast:
            x = torch.zeros(shape, requires_grad=True)
            tracker.track(list(fake.parameters()), x)
            with autocast():
                out = fake(x)
            forward = tracker.peak_bytes
            tracker.start_phase()
            out.float().sum().backward()
            peaks[once] = forward, tracker.phase_peak_bytes
        ran = [lengths[i] for i in sorted(region._fake_run(parts, x))]
        assert calls == ran + ran[::-1]  # forward, then each chunk's recomputation in backward, last chunk first
    assert len(calls) == 2 * runs and runs < len(lengths)
    assert peaks[True] == peaks[False]


def test_fake_pass_runs_a_few_autocast_chunks_at_the_same_estimate(monkeypatch):
    """Under AMP the region runs stock's product on checkpointed query chunks; the fake pass runs the first two and
    last two chunks of each length (``_fake_run``) and holds the others' outputs as empty tensors: the whole CUDA AMP
    estimate (every phase's peak, every layer's and module's row) equals the one that runs every chunk, to the byte.
    yolo11n's C2PSA at imgsz 480: 15 x 15 = 225 tokens, attn_chunk 32: 8 chunks (seven of 28 tokens, one of 29), 5 of them run."""
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG

    from yolo_ckpt.checkpointing import attention as region
    from yolo_ckpt.memory.estimate import estimate_step
    from yolo_ckpt.memory.loss_model import LossModel

    torch.manual_seed(0)
    model = DetectionModel("yolo11n.yaml", verbose=False)
    model.args = DEFAULT_CFG
    lengths = [p.stop - p.start for p in region.chunks(225, 32)]
    assert lengths == [28] * 7 + [29]
    calls = []
    core = region._stock_core
    monkeypatch.setattr(region, "_stock_core", lambda q, *a: calls.append(q.shape[-1]) or core(q, *a))
    loss = LossModel("detect", (8.0,), 4, (), (0.0,) * 4, (0.0,) * 4)  # the network's pass alone
    steps = {}
    for once in (False, True):
        monkeypatch.setattr(region, "FAKE_ONCE", once)
        calls.clear()
        steps[once] = estimate_step(model, 480, 2, 5, "attention", amp=True, loss_model=loss, flops=False, attn_chunk=32)
        # each chunk run once in forward and once more by its backward's recomputation, last chunk first (C2PSA has
        # one attention module); the fake pass's walk: positions 0, 1, 5 and 6 of the 28s and the one 29
        ran = [28] * 7 + [29] if once is False else [28] * 4 + [29]
        assert calls == ran + ran[::-1]
    assert steps[True] == steps[False]
    assert steps[True].peak_bytes > 0


@pytest.mark.slow  # ~6 s: fake copies of three models
def test_attention_tokens_name_each_module_and_its_chunking():
    """What profile and the run report show of the attention region (issue 43): each attention module's layer and its
    tokens N at the imgsz, chunked where N > attn_chunk. yolo11n's C2PSA (layer 10, stride 32): 20 x 20 = 400 tokens at
    640, chunked at 256, 10 x 10 = 100 at 320, stock; yolo12n's A2C2f at stride 16 split in 4 areas: 40 x 40 / 4 = 400
    per area; a model without attention: none."""
    from helpers import build_model

    from yolo_ckpt.memory.attention_shapes import attention_tokens
    from yolo_ckpt.report.record import attention_text

    yolo11n = build_model("yolo11n.yaml")
    at_640 = attention_tokens(yolo11n, 640, 256)
    assert at_640 == {"attn_chunk": 256, "modules": [{"layer": 10, "module": "Attention", "tokens": 400, "chunked": True}]}
    assert attention_text(at_640) == "attention region, attn_chunk=256: layer 10 1 x Attention of 400 tokens, chunked"
    assert attention_text(attention_tokens(yolo11n, 320, 256)) == (
        "attention region, attn_chunk=256: layer 10 1 x Attention of 100 tokens, stock (at most attn_chunk tokens)"
    )
    yolo12n = attention_tokens(build_model("yolo12n.yaml"), 640, 256)
    assert attention_text(yolo12n) == (
        "attention region, attn_chunk=256: layer 6 4 x AAttn of 400 tokens per area, chunked; "
        "layer 8 4 x AAttn of 400 tokens per area, chunked"
    )
    assert attention_tokens(build_model("yolov8n.yaml"), 64, 256)["modules"] == []
