"""The attention region (recompute=attention, yolo_ckpt.checkpointing.attention): Ultralytics' Attention and AAttn in
chunks of queries and keys give stock's output and every gradient bit for bit on the CPU (float32), stock's dtypes
under autocast, and a training step of YOLO11, YOLO12 and YOLO26 equal to stock's with the chunks counted."""

import copy
import pickle

import pytest
import torch
from helpers import assert_grads_equal, assert_state_equal, build_model, surrogate_step
from ultralytics.nn.modules.block import AAttn, Attention
from ultralytics.nn.tasks import yaml_model_load

from yolo_ckpt import apply_checkpointing, count_recomputations
from yolo_ckpt.checkpointing.attention import apply_attention_region, chunks, kernel_reproduced, softmax_backward_, softmax_columns_
from yolo_ckpt.checkpointing.chunks import DEFAULT_ATTN_CHUNK, MIN_ATTN_CHUNK, check_attn_chunk
from yolo_ckpt.checkpointing.model_file import yaml_layout
from yolo_ckpt.checkpointing.policy import ModelLayout, resolve
from yolo_ckpt.config import CkptConfig
from yolo_ckpt.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

# (module, side of its square input): yolo11n's and yolo26n's C2PSA attention at stride 32, yolo12n's area attention
# at stride 16 (4 areas of 64 tokens) and 32 (1 area); 100 tokens is no multiple of the CPU's 8 or 16 float lanes
MODULES = {
    "Attention": (lambda: Attention(128, 2, 0.5), 10),
    "AAttn-area4": (lambda: AAttn(64, 2, 4), 16),
    "AAttn-area1": (lambda: AAttn(128, 4, 1), 10),
}


class _Holder(torch.nn.Module):
    """One module as a bare model: ``.model`` layers and ``.yaml``, what the region's patching reads."""

    def __init__(self, module):
        super().__init__()
        self.model = torch.nn.Sequential(module)
        self.yaml = {"backbone": [], "head": []}


def _pair(name, batch=2):
    factory, side = MODULES[name]
    torch.manual_seed(0)
    stock = factory().train()
    patched = copy.deepcopy(stock)
    x = torch.randn(batch, stock.qkv.conv.in_channels, side, side)
    return stock, patched, x


def _step(module, x, dtype=torch.float32):
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        out = module(x)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out).to(out.dtype))
    return [out.detach(), x.grad, *(p.grad for p in module.parameters())]


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("chunk", [MIN_ATTN_CHUNK, 48])  # 48 divides none of 100 and 64
def test_chunked_module_equals_stock(name, chunk):
    """Output, input gradient and every parameter gradient torch.equal to the stock module's, float32 on the CPU,
    with the chunk passes counted (two per chunk in backward)."""
    stock, patched, x = _pair(name)
    assert apply_attention_region(_Holder(patched), chunk) == 1
    expected = _step(stock, x)
    with count_recomputations() as counter:
        got = _step(patched, x)
    tokens = 100 if name != "AAttn-area4" else 64
    assert counter.attention_chunks == 2 * len(chunks(tokens, chunk))
    different = [i for i, (a, b) in enumerate(zip(expected, got)) if not torch.equal(a, b)]
    assert not different, f"outputs/gradients {different} differ"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_autocast_gives_stock_dtypes(name):
    """Under CPU bfloat16 autocast the region runs query chunks under checkpoint: the output and gradients have stock's
    dtypes and agree with stock's to bfloat16 rounding."""
    stock, patched, x = _pair(name)
    apply_attention_region(_Holder(patched), MIN_ATTN_CHUNK)
    expected = _step(stock, x, torch.bfloat16)
    with count_recomputations() as counter:
        got = _step(patched, x, torch.bfloat16)
    assert counter.attention_chunks > 0
    assert [t.dtype for t in got] == [t.dtype for t in expected]
    assert torch.allclose(got[0].float(), expected[0].float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("n", [36, 100, 400])
def test_softmax_columns_rebuild_the_kernels_bits(monkeypatch, n):
    """Columns of softmax rows rebuilt from the row maximum and the kernel's reciprocal sum (a key chunk of the
    backward's pass 2, of every image and head, in row blocks of a few rows) equal torch.softmax's bit for bit, scores
    up to ~+-200 (entries far below the maximum underflow to 0 as in the kernel); the check the region makes once per
    process agrees."""
    from yolo_ckpt.checkpointing import attention as region

    monkeypatch.setattr(region, "ROW_BLOCK", 2 * 3 * 40 * 5)  # blocks of 5 rows or fewer: several, of unequal length
    g = torch.Generator().manual_seed(n)
    scores = torch.randn(2, 3, 203, n, generator=g) * torch.tensor([1.0, 10.0, 60.0]).view(1, 3, 1, 1)
    probs = scores.softmax(-1)
    keys = slice(n // 3, n // 3 + 37)  # not a multiple of the float lanes
    rebuilt = softmax_columns_(scores[..., keys].contiguous(), scores.amax(-1), probs.amax(-1))
    assert torch.equal(rebuilt, probs[..., keys])
    assert (rebuilt == 0).any() and (rebuilt > 0).any()
    assert kernel_reproduced()


@pytest.mark.parametrize("n", [36, 100, 400])
def test_softmax_backward_gives_the_kernel_and_its_row_sums(monkeypatch, n):
    """The softmax backward on widened rows (in row blocks) is torch._softmax_backward_data's output bit for bit, and
    its row sums s are the kernel's: (d_probs - s) * probs gives the kernel's output too (one ulp off in s would not)."""
    from yolo_ckpt.checkpointing import attention as region

    monkeypatch.setattr(region, "ROW_BLOCK", 2 * 3 * (n + region.PREFIX) * 5)
    g = torch.Generator().manual_seed(n)
    probs = (torch.randn(2, 3, 203, n, generator=g) * 4).softmax(-1)
    d_probs = torch.randn(2, 3, 203, n, generator=g)
    expected = torch._softmax_backward_data(d_probs, probs, -1, torch.float32)
    d_scores = probs.clone()
    sums = softmax_backward_(d_probs, d_scores)
    assert torch.equal(d_scores, expected)
    assert torch.equal((d_probs - sums[..., None]) * probs, expected)
    assert torch.allclose(sums, (d_probs.double() * probs.double()).sum(-1).float(), atol=1e-6)


def test_a_kernel_not_reproduced_runs_stock(monkeypatch):
    """Where the softmax kernel is not the one reproduced (another CPU or torch build), the region runs stock's product:
    the same bits as stock, no chunk counted (the memory bound is what is lost)."""
    from yolo_ckpt.checkpointing import attention as region

    monkeypatch.setattr(region, "kernel_reproduced", lambda: False)
    stock, patched, x = _pair("Attention")
    apply_attention_region(_Holder(patched), MIN_ATTN_CHUNK)
    expected = _step(stock, x)
    with count_recomputations() as counter:
        got = _step(patched, x)
    assert all(torch.equal(a, b) for a, b in zip(expected, got)) and counter.attention_chunks == 0


def test_inert_in_eval_and_pickled_as_stock():
    """Eval mode and no_grad run the stock forward (no chunk counted); the patched module pickles as its stock class
    and a deepcopy (EMA) stays patched."""
    stock, patched, x = _pair("Attention")
    apply_attention_region(_Holder(patched), MIN_ATTN_CHUNK)
    with count_recomputations() as counter, torch.no_grad():
        assert torch.equal(patched(x), stock(x))
        patched.eval(), stock.eval()
        assert torch.equal(patched(x), stock(x))
    assert counter.attention_chunks == 0
    assert type(pickle.loads(pickle.dumps(patched))) is Attention
    assert type(copy.deepcopy(patched)) is type(patched) is not Attention


def test_chunks_are_even_and_refused_sizes_are_named():
    """Chunks spread evenly (each at least half of attn_chunk); values below MIN_ATTN_CHUNK are refused, naming the
    value and the smallest one, by the key's check, the config and apply_checkpointing."""
    assert [s.stop - s.start for s in chunks(100, 32)] == [25, 25, 25, 25]
    assert [s.stop - s.start for s in chunks(100, 48)] == [33, 33, 34]
    assert check_attn_chunk(MIN_ATTN_CHUNK) == MIN_ATTN_CHUNK
    for bad in (0, MIN_ATTN_CHUNK - 1, 7.0, True):
        with pytest.raises(ConfigError, match=f"attn_chunk={bad!r} is not valid"):
            check_attn_chunk(bad)
    with pytest.raises(ConfigError, match=f">= {MIN_ATTN_CHUNK}"):
        CkptConfig.from_args({"attn_chunk": 16})
    assert CkptConfig.from_args({}).attn_chunk == DEFAULT_ATTN_CHUNK
    with pytest.raises(ConfigError, match="attn_chunk=8"):
        apply_checkpointing(build_model("yolo11n.yaml"), "attention", attn_chunk=8)


def test_policy_resolves_attention():
    """attention is a region of models with attention layers, in all; a model without them refuses it by name."""
    for name, has in (("yolo11n.yaml", True), ("yolo12n.yaml", True), ("yolo26n.yaml", True), ("yolov10n.yaml", True),
                      ("yolov8n.yaml", False), ("yolo12n-cls.yaml", True)):
        layout = yaml_layout(yaml_model_load(name))
        assert layout.has_attention is has, name
        assert resolve("all", layout).attention is has
        if has:
            policy = resolve("attention", layout)
            assert policy.attention and policy.regions() == ["attention"] and not policy.indices
        else:
            with pytest.raises(ConfigError, match="no attention layer"):
                resolve("attention", layout)
    built = ModelLayout.from_model(build_model("yolo26n.yaml"))
    assert built.has_attention and resolve("attention", built).attention


@pytest.mark.slow
@pytest.mark.parametrize("name", ["yolo11n.yaml", "yolo12n.yaml", "yolo26n.yaml"])
@pytest.mark.parametrize("spec,mode", [("attention", "full"), ("all", "full"), ("all", "selective")])
def test_training_step_equals_stock(name, spec, mode):
    """A training step at imgsz 256 (64 tokens at stride 32, 4 areas of 64 at stride 16) with attn_chunk 32:
    loss, every gradient and the BatchNorm buffers torch.equal to stock's, with the chunk passes counted (every
    attention module, two passes of two chunks each); alone, inside recomputed layers, and in selective mode."""
    stock = build_model(name)
    patched = copy.deepcopy(stock)
    policy = apply_checkpointing(patched, spec, mode=mode, attn_chunk=32)
    assert policy.attention
    img = torch.rand(2, 3, 256, 256, generator=torch.Generator().manual_seed(1))
    expected = surrogate_step(stock, img)
    with count_recomputations() as counter:
        loss = surrogate_step(patched, img)
    attention_layers = sum(isinstance(m, (Attention, AAttn)) for m in stock.modules())
    assert counter.attention_chunks == attention_layers * 2 * 2
    assert torch.equal(expected, loss)
    assert_grads_equal(stock, patched)
    assert_state_equal(stock, patched)
