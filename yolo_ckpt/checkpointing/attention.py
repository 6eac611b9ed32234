"""The attention region (``recompute=attention``): Ultralytics' self-attention in chunks of queries and keys, with
a working set of O(N x chunk) instead of O(N^2) in forward and backward, bit-equal to stock on the CPU.

Ultralytics' ``Attention`` (``PSABlock``, ``C2PSA``, ``PSA``, YOLO26's attention ``C3k2``) and ``AAttn`` (YOLO12's
``ABlock``/``A2C2f``, per area) compute, with q, k (B, h, d, N), v (B, h, e, N) and N tokens,
``o = v @ softmax((q * scale)^T @ k)^T``: autograd keeps the whole N x N softmax, and its backward builds three more
(the softmax's gradient, its input's gradient, a transposed copy). At 3072 px (N = 9216 at stride 32) that is the
floor a recomputed layer cannot go below: it rebuilds the same matrices in its own backward.

:class:`ChunkedAttention` keeps q, k, v and two numbers per query (the row maximum of the scores and the softmax's
reciprocal sum, taken from the softmax's own output) and works on chunks of at most ``attn_chunk`` rows or columns:

- forward, by query rows: scores ``S_c = (q_c * scale)^T @ k``, ``P_c = softmax(S_c)`` through torch's own softmax
  (a row is computed alone by its kernel, so whole rows give stock's bits), output columns ``v @ P_c^T``;
- backward pass 1, by query rows: ``P_c`` again, ``dP_c = dO_c^T @ v`` (autograd's ``(v^T @ dO_c)^T``, the same
  bits, measured), ``dS_c`` from torch's own softmax backward kernel on whole rows, which also gives its row sums
  ``sum_j dP_ij P_ij`` in its own summation order (:func:`softmax_backward_`), and the query gradient rows
  ``dS_c @ k^T``;
- backward pass 2, by key columns: the gradients of k and v are sums over all queries (``(q * scale) @ dS``,
  ``dO @ P``); splitting that sum into query chunks changes its rounding (~1e-6, measured), so they are built by
  key columns instead, each one whole product over all queries. That needs softmax columns: ``P_ij =
  exp(S_ij - max_i) * (1 / sum_i)``, with the exponential of ATen's CPU softmax (SLEEF's ``expf_u10``, not the MKL
  exponential of ``torch.exp``), which the log-softmax backward kernel runs too (:func:`softmax_columns_`), and
  ``1 / sum_i`` read from the forward softmax's output (``P`` is ``exp(0) * (1/sum) = 1/sum`` at the row maximum);
  ``dS = (dP - sum) * P`` as the softmax backward kernel computes it.

Cost: besides stock's products the backward computes the scores twice more and ``dP`` once more (``N^2 x (4 d + 2
e)`` FLOPs per image and head, which the planner weighs), and runs the softmax kernels on every score once more (the
forward's softmax in pass 1, the log-softmax backward's exponential in pass 2) in blocks of :data:`ROW_BLOCK`
elements, with copies that widen each row by a few columns: all of it ATen's vectorized kernels, no float64. One
yolo26n layer at 3072 px (N = 9216, 2 heads, chunk 256, one thread, interleaved runs on a loaded host) took 8.8 s of
backward against stock's 14.5 s (which streams N x N matrices through memory) and the 41.4 s of the float64 emulation
of SLEEF's exponential that this replaced (``docs/guides/attention-region.md``).

Chunks are spread evenly over N (lengths differ by at most one) and hold at least
:data:`~yolo_ckpt.checkpointing.chunks.MIN_ATTN_CHUNK` rows: MKL's ``sgemm`` rounds some small shapes differently (1
and 7 rows measured). Each chunk's matrix products then give the whole product's bits: outputs, every gradient and
hence the BatchNorm statistics around equal stock's, measured with ``torch.equal`` on AVX-512 and on ATen's AVX2
kernels (``ATEN_CPU_CAPABILITY=avx2``), torch 2.14.1 and 2.15.0 (``benchmarks/mechanism/attention_exactness.py``,
``tests/checkpointing/test_attention.py``: its 28 tests green on both, the training steps included). A CPU or
torch build whose softmax kernels do not give what the region relies on is found once per process
(:func:`kernel_reproduced`): the region then runs stock's product, exact without the memory bound, and says so.
On CUDA (its own exponential and reductions) the values agree to float rounding, not bit for bit.
Under autocast, or for inputs that are not float32, the region runs the stock expression on query chunks under
``torch.utils.checkpoint``: the same dtypes as stock, the same memory bound, gradients of k and v summed over chunks
(not bit-equal; autocast is not bit-reproducible across kernels anyway). Layers with N <= ``attn_chunk`` run stock.

How it is hooked: each ``Attention``/``AAttn`` module's class is swapped (:func:`apply_attention_region`) for a
subclass whose ``forward`` mirrors stock's and calls :func:`attention` where stock builds the N x N matrix; it
pickles as its stock class (:class:`yolo_ckpt.checkpointing.patching.PickledAsStock`) and is inert in eval, under
``no_grad`` and for CoreML export (stock's forward runs). Backward passes are counted in
:attr:`yolo_ckpt.checkpointing.patching.RecomputeCounter.attention_chunks`.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.utils.checkpoint import checkpoint
from ultralytics.nn.modules.block import AAttn, Attention
from ultralytics.utils import LOGGER

from . import patching
from .chunks import DEFAULT_ATTN_CHUNK, check_attn_chunk

ATTENTION_CLASSES = (Attention, AAttn)
# elements (all images and heads) of a block of rows the softmax kernels below run on at once (1 MiB a float32 block):
# fewer, larger blocks cost less Python per element, smaller ones less memory; at 4096 tokens (one layer, chunk 256)
# 1 << 16, 1 << 18 and 1 << 20 measured 1.07x, 1.05x and 1.00x the time and 37.8, 39.8 and 45.1 MiB of peak
ROW_BLOCK = 1 << 18
# columns put before a row whose softmax backward gives its row sum: one float vector of AVX-512 (two of AVX2), so the
# row's own vectors keep their places in the kernel's accumulator
PREFIX = 16
# fake passes run one step of the row-block loops (_fake_once), a short walk of the chunk loops (_fake_walk) and a few
# of the autocast path's checkpointed chunks (_fake_run); tests turn it off
FAKE_ONCE = True


@contextlib.contextmanager
def every_step():
    """Inside, fake passes run every chunk and row block of the region's loops (:data:`FAKE_ONCE` off): a FLOP count
    needs them all (``torch.utils.flop_counter`` counts the products that run; :func:`_fake_walk` runs 2-5 of N / chunk
    chunks, :func:`_fake_run` 4-8), a peak does not."""
    global FAKE_ONCE
    before, FAKE_ONCE = FAKE_ONCE, False
    try:
        yield
    finally:
        FAKE_ONCE = before


def _fake_once(steps: list[slice], t: torch.Tensor) -> list[slice]:
    """``steps`` (slices of :func:`chunks`) of a loop whose every step frees its temporaries before the next, its
    steps alike but for their length; where ``t`` is a fake tensor (the memory model's pass,
    :mod:`yolo_ckpt.memory.estimate`), the longest step alone: fake tensors have no values to compute, and the peak
    is that step's, reached in a few operations instead of thousands."""
    if not (FAKE_ONCE and is_fake(t)) or len(steps) == 0:
        return steps
    return [max(steps, key=lambda step: step.stop - step.start)]


def _row_blocks(t: torch.Tensor, width: int) -> list[slice]:
    """Blocks of the rows (dim -2) of ``t`` (..., rows, cols) holding about :data:`ROW_BLOCK` elements of ``width``
    columns over all leading dims (at least one row)."""
    return _fake_once(chunks(t.shape[-2], max(1, ROW_BLOCK // (t.shape[:-2].numel() * width))), t)


def _fake_walk(parts: list[slice], t: torch.Tensor) -> list[slice]:
    """The chunks ``parts`` of a loop whose step holds its own temporaries and the previous step's last ones (a
    loop variable is rebound only once its new value exists), so that a step's peak depends only on its length and
    the previous step's; where ``t`` is a fake tensor (the memory model's pass), the shortest walk over the same
    lengths with the same first and last length and the same pairs of consecutive lengths, and no other pair: the
    same peaks, to the byte, in at most 5 steps instead of N / chunk (36 at 3072 px, per loop, attention module and
    pass). Chunks of one length stand for all of it: fake tensors have no values, only shapes."""
    if not (FAKE_ONCE and is_fake(t)) or len(parts) < 3:
        return parts
    lengths = [p.stop - p.start for p in parts]
    pairs = set(zip(lengths, lengths[1:]))
    chunk_of = {n: p for p, n in reversed(list(zip(parts, lengths)))}  # the first chunk of each length
    walks = [(lengths[0],)]  # breadth first: the original walk is one, so a shortest one is found
    while True:
        walk = walks.pop(0)
        if walk[-1] == lengths[-1] and set(zip(walk, walk[1:])) == pairs:
            return [chunk_of[n] for n in walk]
        walks += [(*walk, b) for a, b in sorted(pairs) if a == walk[-1]]


def _fake_run(parts: list[slice], t: torch.Tensor) -> range | set[int]:
    """The positions in ``parts`` of the checkpointed query chunks that the autocast path runs: all of them, or where
    ``t`` is a fake tensor (the memory model's pass), the first two and last two of each run of one length, the other
    chunks' outputs held as empty tensors of their shape (in order, until the concatenation, as the outputs are).

    Exact, to the byte: a forward step holds the outputs before it and its own temporaries, so the last step of each
    length holds the most; a backward step (last chunk first) holds the gradients accumulated so far (full-size for
    q, k and v from the second step on) and its own recomputation, so each step after the first is alike but for its
    length and the previous step's; the kept positions give the first and last length, every pair of consecutive
    lengths and the last of each length (``tests/memory/test_attention_memory.py`` compares a whole AMP estimate
    both ways). 4 to 8 chunks of the 16 at 2048 px (36 at 3072) per module and pass."""
    if not (FAKE_ONCE and is_fake(t)):
        return range(len(parts))
    lengths = [p.stop - p.start for p in parts]
    starts = [i for i in range(len(parts)) if i == 0 or lengths[i] != lengths[i - 1]]
    run = set()
    for start, stop in zip(starts, [*starts[1:], len(parts)]):
        run |= {start, start + 1, stop - 2, stop - 1} & set(range(start, stop))
    return run


def softmax_columns_(scores: torch.Tensor, row_max: torch.Tensor, row_inv: torch.Tensor) -> torch.Tensor:
    """Softmax entries rebuilt from some columns of their rows, in place: ``scores`` (..., rows, keys), float32,
    becomes ``exp(scores - row_max) * row_inv`` (row_max, row_inv (..., rows): the rows' maximum score and the
    forward kernel's reciprocal sum), with the bits of ``torch.softmax`` on the whole rows. Returns ``scores``.

    The exponential is the softmax kernel's own: ATen's log-softmax backward ``grad - exp(output) * sum(grad)``
    runs the same vectorized exponential (SLEEF's ``expf_u10`` on x86 CPUs; ``torch.exp`` on the CPU is MKL's and
    differs in ~9% of elements, measured). Each row is widened by one column in front, output ``-inf`` (exp 0) and
    grad ``-row_inv``, the row's other grads 0: its sum is ``-row_inv`` exactly, so the kernel returns ``0 - exp(d) *
    -row_inv``, the forward kernel's product. :func:`kernel_reproduced` checks that on this torch build."""
    width = 1 + scores.shape[-1]
    for r in _row_blocks(scores, width):
        shifted = scores.new_empty(*scores.shape[:-2], r.stop - r.start, width)
        shifted[..., 0] = -torch.inf
        torch.sub(scores[..., r, :], row_max[..., r, None], out=shifted[..., 1:])
        grad = torch.zeros_like(shifted)
        torch.neg(row_inv[..., r], out=grad[..., 0])
        scores[..., r, :] = torch._log_softmax_backward_data(grad, shifted, -1, torch.float32)[..., 1:]
    return scores


def softmax_backward_(d_probs: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """The softmax backward on whole rows, in place: ``probs`` (..., rows, N), float32, becomes
    ``torch._softmax_backward_data(d_probs, probs)`` (``(d_probs - s) * probs``, stock's bits: it is that kernel);
    returns ``s`` (..., rows), the kernel's row sums ``sum_j d_probs_ij probs_ij`` in its own summation order, which
    the columns rebuilt elsewhere need. Each row is widened by :data:`PREFIX` columns in front, probs -1 and grads 0:
    their products add zeros to the kernel's vector accumulator before the row's own vectors, which keep their
    places (the sum's bits), and their outputs are ``(0 - s) * -1 = s``. :func:`kernel_reproduced` checks that on this
    torch build."""
    n = probs.shape[-1]
    sums = probs.new_empty(probs.shape[:-1])
    for r in _row_blocks(probs, PREFIX + n):
        wide_probs = probs.new_empty(*probs.shape[:-2], r.stop - r.start, PREFIX + n)
        wide_probs[..., :PREFIX] = -1.0
        wide_probs[..., PREFIX:] = probs[..., r, :]
        wide_grad = torch.zeros_like(wide_probs)
        wide_grad[..., PREFIX:] = d_probs[..., r, :]
        out = torch._softmax_backward_data(wide_grad, wide_probs, -1, torch.float32)
        del wide_probs, wide_grad
        probs[..., r, :] = out[..., PREFIX:]
        sums[..., r] = out[..., 0]
    return sums


@functools.cache
def kernel_reproduced() -> bool:
    """Whether this torch build's CPU softmax kernels give what :func:`softmax_columns_` and
    :func:`softmax_backward_` rely on: columns rebuilt equal to ``torch.softmax``, and ``(d_probs - s) * probs`` with
    their row sums ``s`` equal to ``torch._softmax_backward_data``, on rows with and without a tail, scores up to
    ~+-120 (a few ms, once per process). Where they do not (another kernel, another build), the region's exactness
    would not hold: :func:`attention` then runs stock's product and says so once."""
    g = torch.Generator().manual_seed(0)
    for n in (36, 100, 257):
        scores, d_probs = torch.randn(2, 64, n, generator=g) * 30, torch.randn(2, 64, n, generator=g)
        probs = scores.softmax(-1)
        rebuilt = softmax_columns_(scores.clone(), scores.amax(-1), probs.amax(-1))
        d_scores = probs.clone()
        sums = softmax_backward_(d_probs, d_scores)
        expected = torch._softmax_backward_data(d_probs, probs, -1, torch.float32)
        sums_exact = torch.equal((d_probs - sums[..., None]) * probs, expected)
        if not (torch.equal(rebuilt, probs) and torch.equal(d_scores, expected) and sums_exact):
            LOGGER.warning(
                f"yolo-ckpt: the attention region runs stock's attention (exact, O(N^2) memory): this torch build's CPU "
                f"softmax kernels ({torch.__version__}, {torch.backends.cpu.get_cpu_capability()}) are not the ones it relies on"
            )
            return False
    return True


def chunks(n: int, chunk: int) -> list[slice]:
    """``range(n)`` in the fewest contiguous slices of at most ``chunk`` (lengths differing by at most one); all of
    them hold at least :data:`~yolo_ckpt.checkpointing.chunks.MIN_ATTN_CHUNK` where ``chunk >= MIN_ATTN_CHUNK``."""
    parts = -(-n // chunk)
    bounds = [n * i // parts for i in range(parts + 1)]
    return [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]


_DEPTH = [0]  # ChunkedAttention passes running now


def in_chunked_attention() -> bool:
    """Whether a :class:`ChunkedAttention` forward or backward is running: its matrix products are chunk temporaries
    that ``recompute_mode=selective`` must not keep (:mod:`yolo_ckpt.checkpointing.engine`)."""
    return _DEPTH[0] > 0


class _Working:
    def __enter__(self):
        _DEPTH[0] += 1

    def __exit__(self, *exc):
        _DEPTH[0] -= 1


def _count(n: int, t: torch.Tensor) -> None:
    if is_fake(t):  # the memory model's fake passes are not training
        return
    for counter in patching.ACTIVE_COUNTERS:
        counter.attention_chunks += n


class ChunkedAttention(torch.autograd.Function):
    """``v @ softmax((q * scale)^T @ k)^T`` in chunks of queries and keys, exact (see the module)."""

    @staticmethod
    def forward(ctx, q, k, v, scale: float, chunk: int):
        """q, k (B, h, d, N), v (B, h, e, N), float32. Returns (B, h, e, N), contiguous as stock's product."""
        with _Working():
            out, row_max, row_inv = ChunkedAttention._forward(q, k, v, scale, chunk)
        ctx.save_for_backward(q, k, v, row_max, row_inv)
        ctx.scale, ctx.chunk = scale, chunk
        return out

    @staticmethod
    def _forward(q, k, v, scale, chunk):
        qs = q * scale
        n = q.shape[-1]
        out = v.new_empty(*v.shape[:-1], n)
        row_max = q.new_empty(*q.shape[:-2], n)
        row_inv = q.new_empty(*q.shape[:-2], n)
        for c in _fake_walk(chunks(n, chunk), q):
            scores = qs[..., c].transpose(-2, -1) @ k
            probs = scores.softmax(dim=-1)
            out[..., c] = v @ probs.transpose(-2, -1)
            row_max[..., c] = scores.amax(-1)
            row_inv[..., c] = probs.amax(-1)  # exp(0) * (1 / sum): the kernel's reciprocal sum
        return out, row_max, row_inv

    @staticmethod
    def backward(ctx, grad):
        q, k, v, row_max, row_inv = ctx.saved_tensors
        with _Working():
            return (*ChunkedAttention._backward(q, k, v, row_max, row_inv, grad, ctx.scale, ctx.chunk), None, None)

    @staticmethod
    def _backward(q, k, v, row_max, row_inv, grad, scale, chunk):
        qs = q * scale
        n = q.shape[-1]
        parts = chunks(n, chunk)
        _count(2 * len(parts), q)
        # pass 1, query rows: dS rows (the softmax backward's kernel on whole rows), the query gradient, the row sums
        d_qs_t = q.new_empty(*q.shape[:-2], n, q.shape[-2])  # (B, h, N, d): autograd's dS @ k^T, transposed after
        row_sum = q.new_empty(*q.shape[:-2], n)
        for c in _fake_walk(parts, q):
            d_scores = (qs[..., c].transpose(-2, -1) @ k).softmax(dim=-1)  # P_c, then dS_c in place
            d_probs = grad[..., c].transpose(-2, -1) @ v
            row_sum[..., c] = softmax_backward_(d_probs, d_scores)
            del d_probs
            d_qs_t[..., c, :] = d_scores @ k.transpose(-2, -1)
        # pass 2, key columns: the key and value gradients, each column a whole product over all queries
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        for c in _fake_walk(parts, q):
            probs = softmax_columns_(qs.transpose(-2, -1) @ k[..., c], row_max, row_inv)  # (B, h, N, keys)
            d_probs = grad.transpose(-2, -1) @ v[..., c]
            d_scores = d_probs.sub_(row_sum.unsqueeze(-1)).mul_(probs)
            dk[..., c] = qs @ d_scores
            dv[..., c] = grad @ probs
        return d_qs_t.transpose(-2, -1) * scale, dk, dv


def _stock_core(q, k, v, scale):
    # ultralytics/nn/modules/block.py, Attention.forward's and AAttn.forward's product (8.4.190)
    attn = ((q * scale).transpose(-2, -1) @ k).softmax(dim=-1)
    return v @ attn.transpose(-2, -1)


def attention(q, k, v, scale: float, chunk: int = DEFAULT_ATTN_CHUNK) -> torch.Tensor:
    """Stock's ``v @ softmax((q * scale)^T @ k)^T`` (q, k (B, h, d, N), v (B, h, e, N)) with O(N x chunk) memory:
    :class:`ChunkedAttention` for float32 outside autocast (bit-equal on the CPU), else query chunks under
    ``torch.utils.checkpoint`` (stock's dtypes); stock's expression where N <= ``chunk``, and on a CPU whose softmax
    kernels do not give what the region relies on (:func:`kernel_reproduced`: exactness first, the memory bound lost)."""
    n = q.shape[-1]
    if n <= chunk:
        return _stock_core(q, k, v, scale)
    device = q.device.type
    if q.dtype == k.dtype == v.dtype == torch.float32 and not torch.is_autocast_enabled(device):
        if device == "cpu" and not is_fake(q) and not kernel_reproduced():
            return _stock_core(q, k, v, scale)
        return ChunkedAttention.apply(q, k, v, scale, chunk)
    parts = chunks(n, chunk)
    _count(len(parts), q)
    run = _fake_run(parts, q)
    outs = []
    for i, c in enumerate(parts):
        if i in run:
            outs.append(checkpoint(_stock_core, q[..., c], k, v, scale, use_reentrant=False))
        else:  # a chunk the fake pass skips: its output's bytes, held until the concatenation as the output's are
            outs.append(outs[-1].new_empty(*outs[-1].shape[:-1], c.stop - c.start))
    return torch.cat(outs, dim=-1)


def _active(module) -> bool:
    return module.training and torch.is_grad_enabled()


class ChunkedAttentionMixin(patching.PickledAsStock):
    """Mixin placed before ``Attention``: its product is :func:`attention`. Not instantiated:
    :func:`apply_attention_region` swaps a module's class; ``attn_chunk`` is set on each class."""

    attn_chunk = DEFAULT_ATTN_CHUNK

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Stock's ``Attention.forward`` (same input and result); stock's own in eval, without grad, for CoreML."""
        if not _active(self) or self.format == "coreml":
            return super().forward(x)
        # Mirrors ultralytics/nn/modules/block.py Attention.forward (8.4.190), its else-branch
        B, C, H, W = x.shape
        N = H * W
        qkv = self.qkv(x)
        q, k, v = qkv.view(B, self.num_heads, self.key_dim * 2 + self.head_dim, N).split(
            [self.key_dim, self.key_dim, self.head_dim], dim=2
        )
        x = attention(q, k, v, self.scale, self.attn_chunk).view(B, C, H, W) + self.pe(v.reshape(B, C, H, W))
        return self.proj(x)


class ChunkedAAttnMixin(patching.PickledAsStock):
    """Mixin placed before ``AAttn``: its product is :func:`attention` (see :class:`ChunkedAttentionMixin`)."""

    attn_chunk = DEFAULT_ATTN_CHUNK

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Stock's ``AAttn.forward`` (same input and result); stock's own in eval and without grad."""
        if not _active(self):
            return super().forward(x)
        # Mirrors ultralytics/nn/modules/block.py AAttn.forward (8.4.190)
        B, _, H, W = x.shape
        N = H * W
        qkv = self.qkv(x).flatten(2).transpose(1, 2)
        if self.area > 1:
            qkv = qkv.reshape(B * self.area, N // self.area, self.all_head_dim * 3)
            B, N, _ = qkv.shape
        q, k, v = (
            qkv.view(B, N, self.num_heads, self.head_dim * 3)
            .permute(0, 2, 3, 1)
            .split([self.head_dim, self.head_dim, self.head_dim], dim=2)
        )
        x = attention(q, k, v, self.head_dim**-0.5, self.attn_chunk)
        x = x.permute(0, 3, 1, 2)
        v = v.permute(0, 3, 1, 2)
        if self.area > 1:
            x = x.reshape(B // self.area, N * self.area, self.all_head_dim)
            v = v.reshape(B // self.area, N * self.area, self.all_head_dim)
            B, N, _ = x.shape
        x = x.reshape(B, H, W, self.all_head_dim).permute(0, 3, 1, 2).contiguous()
        v = v.reshape(B, H, W, self.all_head_dim).permute(0, 3, 1, 2).contiguous()
        x = x + self.pe(v)
        return self.proj(x)


_MIXINS = {Attention: ChunkedAttentionMixin, AAttn: ChunkedAAttnMixin}


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The ``Attention`` and ``AAttn`` modules under ``model.model`` (patched or not)."""
    layers = patching.model_layers(model).model
    return [m for m in layers.modules() if isinstance(m, ATTENTION_CLASSES)]


def apply_attention_region(model: nn.Module, chunk: int = DEFAULT_ATTN_CHUNK) -> int:
    """Swap every ``Attention``/``AAttn`` module of ``model`` to its chunked class with ``chunk`` queries (and keys)
    per chunk (``attn_chunk=``); returns how many. Replaces a region applied before.

    Raises:
        ValueError: for a bad ``chunk`` (:func:`yolo_ckpt.checkpointing.chunks.check_attn_chunk`); the model is then
            unchanged.
    """
    check_attn_chunk(chunk)
    modules = attention_modules(model)
    for m in modules:
        m.__class__ = chunked_class(type(m), chunk)
    return len(modules)


def chunked_class(cls: type, chunk: int) -> type:
    """The chunked class of an ``Attention``/``AAttn`` class (stock or patched) with ``chunk`` queries per chunk,
    unchecked: :func:`apply_attention_region` checks ``chunk`` first; the exactness study measures refused sizes."""
    stock = patching.stock_class(cls)
    base = next(s for s in _MIXINS if issubclass(stock, s))
    return patching.patched_class(_MIXINS[base], stock, f"Chunked{stock.__name__}", attn_chunk=chunk)


def remove_attention_region(model: nn.Module) -> None:
    """Restore the stock class of every ``Attention``/``AAttn`` module of ``model`` (a no-op where none is patched)."""
    for m in attention_modules(model):
        m.__class__ = patching.stock_class(type(m))
