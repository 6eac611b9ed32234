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
- backward pass 1, by query rows: ``P_c`` again, ``dP_c`` as autograd builds it (``(v^T @ dO_c)^T``), the softmax
  backward's row sum ``sum_j dP_ij P_ij`` in the order of ATen's CPU kernel (``vec::map2_reduce_all``: a vector
  accumulator of :data:`LANES` lanes, the row's tail fused, then a halving tree; :func:`row_dot`), ``dS_c = (dP_c - sum) * P_c`` as the
  kernel computes it, and the query gradient rows ``dS_c @ k^T``;
- backward pass 2, by key columns: the gradients of k and v are sums over all queries (``(q * scale) @ dS``,
  ``dO @ P``); splitting that sum into query chunks changes its rounding (~1e-6, measured), so they are built by
  key columns instead, each one whole product over all queries. That needs softmax columns: ``P_ij =
  exp(S_ij - max_i) * (1 / sum_i)``, with the exponential ATen's CPU softmax uses (SLEEF's ``expf_u10``, not the
  MKL exponential of ``torch.exp``) reproduced in float operations (:func:`softmax_exp`, its fused multiply-adds
  rounded once through float64 with round-to-odd (Boldo & Melquiond 2008)), and ``1 / sum_i`` read from the forward
  softmax's output (``P`` is ``exp(0) * (1/sum) = 1/sum`` at the row maximum).

Chunks are spread evenly over N (lengths differ by at most one) and hold at least
:data:`~yolo_ckpt.checkpointing.chunks.MIN_ATTN_CHUNK` rows: MKL's ``sgemm`` rounds some small shapes differently (1
and 7 rows measured). Each chunk's matrix products then give the whole product's bits: outputs, every gradient and
hence the BatchNorm statistics around equal stock's, measured with ``torch.equal`` on AVX-512 and on ATen's AVX2
kernels (``ATEN_CPU_CAPABILITY=avx2``), torch 2.14.1 and 2.15.0 (``benchmarks/mechanism/attention_exactness.py``,
``tests/checkpointing/test_attention.py``). A CPU or torch build whose softmax kernel is not the one reproduced is
found once per process (:func:`kernel_reproduced`): the region then runs stock's product, exact without the memory
bound, and says so. On CUDA (its own exponential and reductions) the values agree to float rounding, not bit for bit.
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
# elements (all images and heads) of a block of rebuilt softmax columns: its float64 temporaries stay in the CPU's
# L2 cache (~1 MiB), 4x faster than whole chunks, measured; at least 16 query rows a block
EXP_BLOCK = 1 << 15
# fake passes run one step of the row-sum and exponential loops (_fake_once) and a short walk of the chunk loops
# (_fake_walk); tests turn it off
FAKE_ONCE = True


def _lanes() -> int:
    # float lanes of ATen's CPU vectors (Vectorized<float>::size()): 16 with AVX-512, 8 with AVX2 and the others
    return 16 if "AVX512" in torch.backends.cpu.get_cpu_capability() else 8


LANES = _lanes()

def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))  # a C float literal: the double rounded to float


# SLEEF 3's xexpf (src/libm/sleefsimdsp.c), the exponential of ATen's vectorized CPU softmax (Vectorized<float>::exp
# = Sleef_expf16_u10 with AVX-512, Sleef_expf8_u10 with AVX2, both with FMA); its constants are floats.
_R_LN2F = _f32(1.442695040888963407359924681001892137426645954152985934135449406931)
_L2UF = _f32(0.693145751953125)
_L2LF = _f32(1.428606765330187045e-06)
_EXP_POLY = tuple(_f32(c) for c in (
    0.000198527617612853646278381, 0.00139304355252534151077271, 0.00833336077630519866943359,
    0.0416664853692054748535156, 0.166666671633720397949219, 0.5,
))
_LOW_BITS, _MIDPOINT = (1 << 29) - 1, 1 << 28  # float64 fraction bits below float32's; a float32 tie among them


def _fma(a: torch.Tensor, b, c) -> torch.Tensor:
    """``a * b + c`` rounded once to float32, as a fused multiply-add, for float64 ``a`` and float64 tensors or floats
    ``b``, ``c`` holding float32 values; returns float64 holding the float32 result.

    The product is exact in float64 (24 + 24 bits) and the sum is rounded once there; rounding that to float32 gives
    the correctly rounded sum unless the float64 sum is a float32 tie that the exact sum is not (double rounding).
    Where that happens (rarely) the float64 sum is rounded to odd instead, moved one unit towards the exact sum known
    from TwoSum, which rounds correctly (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved
    algorithms using rounding to odd", 2008)."""
    p = a * b
    s = (p + c).contiguous()  # for the bit views
    # fake tensors (the memory model's pass) have no values: they take the tie path, as its temporaries may be needed
    if is_fake(s) or ((s.view(torch.int64) & _LOW_BITS) == _MIDPOINT).any():
        bb = s - p
        err = (p - (s - bb)) + (c - bb)  # TwoSum (Knuth): s + err == p + c exactly
        tie = ((s.view(torch.int64) & _LOW_BITS) == _MIDPOINT) & (err != 0)
        s = torch.where(tie, torch.nextafter(s, torch.where(err > 0, torch.inf, -torch.inf).to(s)), s)
    return s.float().double()


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """float32 2**e for int32 ``e`` in [-126, 127], built from its bits (exact)."""
    return ((e + 127) << 23).view(torch.float32)


def softmax_exp(d: torch.Tensor) -> torch.Tensor:
    """``exp(d)`` of float32 ``d <= 0`` with the bits of ATen's CPU softmax kernel (SLEEF's ``xexpf``, float32 with
    fused multiply-adds, :func:`_fma`; ``torch.exp`` uses MKL's and differs in ~9% of elements, measured); on other
    devices ``torch.exp``."""
    if d.device.type != "cpu":
        return torch.exp(d)
    q = torch.round(d * _R_LN2F)  # vrint: to nearest, ties to even
    q64 = q.double()
    s = _fma(q64, -_L2UF, d.double())
    s = _fma(q64, -_L2LF, s)
    del q64
    u = _fma(s, _EXP_POLY[0], _EXP_POLY[1])
    for coefficient in _EXP_POLY[2:]:
        u = _fma(u, s, coefficient)
    u = _fma((s * s).float().double(), u, s).float().add_(1.0)
    qi = q.to(torch.int32)
    half = qi >> 1
    u = u * _pow2(half) * _pow2(qi - half)  # vldexp2
    return u.masked_fill_(d < -104, 0.0)


def _fake_once(steps, t: torch.Tensor):
    """``steps`` (ints, or slices of :func:`chunks`) of a loop whose every step frees its temporaries before the next,
    its steps alike but for their length; where ``t`` is a fake tensor (the memory model's pass,
    :mod:`yolo_ckpt.memory.estimate`), the longest step alone: fake tensors have no values to compute, and the peak
    is that step's, reached in a few operations instead of thousands (N / lanes row-sum steps, N / 32 exponential
    blocks per key chunk: a fake pass of yolo12n at 2048 px took minutes)."""
    if not (FAKE_ONCE and is_fake(t)) or len(steps) == 0:
        return steps
    return [max(steps, key=lambda step: step.stop - step.start if isinstance(step, slice) else 0)]


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


def row_dot(a: torch.Tensor, b: torch.Tensor, lanes: int = LANES) -> torch.Tensor:
    """``(a * b).sum(-1)`` in the order of ATen's CPU softmax backward (``vec::map2_reduce_all``): ``lanes``-wide
    partial sums over the row, the tail (``n % lanes`` elements) added to the first lanes with one rounding (the
    compiler fuses that multiply-add, measured: plain rounding there differs in 2 of 256 rows of 100), then the
    vector's halving tree (``vec_reduce_all``). Rows of at least ``lanes``."""
    n = a.shape[-1]
    full = n - n % lanes
    acc = a[..., :lanes] * b[..., :lanes]
    for j in _fake_once(range(lanes, full, lanes), a):
        acc = acc + a[..., j : j + lanes] * b[..., j : j + lanes]
    if full < n:
        tail = n - full
        fused = _fma(a[..., full:].double(), b[..., full:].double(), acc[..., :tail].double()).float()
        acc = torch.cat([fused, acc[..., tail:]], dim=-1)
    while lanes > 1:
        lanes //= 2
        acc = acc[..., :lanes] + acc[..., lanes : 2 * lanes]
    return acc[..., 0]


def softmax_parts(scores: torch.Tensor, d_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(softmax(scores), its backward for d_probs)`` rebuilt as :class:`ChunkedAttention` rebuilds them (rows of
    ``scores`` and ``d_probs``, float32, at least :data:`LANES` long): :func:`softmax_exp` times the reciprocal sum read
    from the kernel's own output, and :func:`row_dot`'s row sum."""
    probs = scores.softmax(-1)
    rebuilt = softmax_exp(scores - scores.amax(-1, keepdim=True)) * probs.amax(-1, keepdim=True)
    return rebuilt, (d_probs - row_dot(d_probs, probs).unsqueeze(-1)) * probs


@functools.cache
def kernel_reproduced() -> bool:
    """Whether this torch build's CPU softmax kernel is the one :func:`softmax_exp` and :func:`row_dot` reproduce:
    :func:`softmax_parts` against ``torch.softmax`` and ``torch._softmax_backward_data`` on rows with and without a
    tail, scores up to ~+-120 (a few ms, once per process). Where it is not (another CPU's vectors, another build), the
    region's exactness would not hold: :func:`attention` then runs stock's product and says so once."""
    g = torch.Generator().manual_seed(0)
    for n in (36, 100, 257):
        scores, d_probs = torch.randn(64, n, generator=g) * 30, torch.randn(64, n, generator=g)
        rebuilt, d_scores = softmax_parts(scores, d_probs)
        probs = scores.softmax(-1)
        if not (torch.equal(rebuilt, probs) and torch.equal(d_scores, torch._softmax_backward_data(d_probs, probs, -1, torch.float32))):
            LOGGER.warning(
                f"yolo-ckpt: the attention region runs stock's attention (exact, O(N^2) memory): this torch build's CPU "
                f"softmax kernel ({torch.__version__}, {torch.backends.cpu.get_cpu_capability()}) is not the one it reproduces"
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
        # pass 1, query rows: dS rows, the query gradient, the softmax backward's row sums
        d_qs_t = q.new_empty(*q.shape[:-2], n, q.shape[-2])  # (B, h, N, d): autograd's dS @ k^T, transposed after
        row_sum = q.new_empty(*q.shape[:-2], n)
        for c in _fake_walk(parts, q):
            probs = (qs[..., c].transpose(-2, -1) @ k).softmax(dim=-1)
            d_probs = (v.transpose(-2, -1) @ grad[..., c]).transpose(-2, -1)
            s = row_dot(d_probs, probs)
            row_sum[..., c] = s
            d_qs_t[..., c, :] = d_probs.sub_(s.unsqueeze(-1)).mul_(probs) @ k.transpose(-2, -1)
        # pass 2, key columns: the key and value gradients, each column a whole product over all queries
        blocks = chunks(n, max(16, EXP_BLOCK // (chunk * q.shape[:-2].numel())))
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        for c in _fake_walk(parts, q):
            probs = (qs.transpose(-2, -1) @ k[..., c]).sub_(row_max.unsqueeze(-1))  # (B, h, N, keys): S - max
            for r in _fake_once(blocks, probs):  # elementwise, in query blocks: the exponential's float64 temporaries stay small
                probs[..., r, :] = softmax_exp(probs[..., r, :]).mul_(row_inv[..., r, None])
            d_probs = (v[..., c].transpose(-2, -1) @ grad).transpose(-2, -1)
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
    kernel the region does not reproduce (:func:`kernel_reproduced`: exactness first, the memory bound lost)."""
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
    outs = [checkpoint(_stock_core, q[..., c], k, v, scale, use_reentrant=False) for c in parts]
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
