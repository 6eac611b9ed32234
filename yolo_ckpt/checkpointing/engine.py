"""Apply and remove activation checkpointing on the layers, inner blocks and head branches of an Ultralytics model.

A recomputed module keeps only its inputs in the forward pass; its internals are recomputed in backward
(Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"), with ``torch.utils.checkpoint`` in its
non-reentrant form (https://pytorch.org/docs/stable/checkpoint.html). The modules recomputed:

- the layers ``model.model[i]`` the policy selects; in a layer of a type in :data:`NESTED_BLOCKS` (YOLO12's
  area-attention ``A2C2f``) each inner block (each ``ABlock``) is recomputed on its own too, inside the recomputed
  layer (nested non-reentrant checkpoints): the layer's recomputation then holds one block's working set at a time instead of
  all of them. Exact, as nesting replays the same ops;
- with ``policy.head``, the branches of the final head (:func:`head_branches`): each recomputed once per backward,
  while the head's decode and glue (concatenation, DFL, the Pose26 flow model) stay stock;
- the parameter-free layers (``Upsample``, ``Concat``) whose output only a recomputed layer takes are folded into its
  region (:func:`folded_layers`): the region keeps their inputs instead of their output and rebuilds them in its
  backward. A checkpoint keeps its inputs, so without the fold every ``Concat`` output before a recomputed layer stays
  alive until that layer's backward (yolo11n at 3072 px, batch 1: 238 MiB of ``all``'s 1769 MiB peak,
  ``benchmarks/results/attention-floor``). Exact: the region runs the same operators on the same values.

How a module is patched, and why:

- Its class is swapped for a subclass that overrides ``forward`` (``RecomputedC3k2`` for ``C3k2``,
  ``RecomputedSequential`` for a head branch). The module object stays where it was, so ``.f/.i/.type/.np``,
  ``model.save`` and the state_dict keys are untouched, and the forward resolves through ``self``: a ``deepcopy``
  (EMA, AutoBatch's probe) is an independent patched copy. It carries its qualified name under ``model.model``
  (``"23.cv2.0"``) for :func:`count_recomputations`.
- Pickling (``torch.save`` of ``last.pt``/``best.pt``, cloudpickle for DDP) writes the stock class, so saved files
  load where ``yolo_ckpt`` is not installed. The DDP worker and ``resume`` re-apply the policy from the run's args.
- Recomputation runs BatchNorm again; a recompute context puts the module's BatchNorm buffers back after it runs,
  so ``running_mean``/``running_var``/``num_batches_tracked`` are updated once per training forward pass. The
  recomputed output is the same: training-mode BatchNorm normalises with batch statistics either way.
- Active only when the module is training, grad is enabled and the layer has a trainable parameter: eval,
  ``no_grad`` and ``inference_mode`` (val, predict, export) run the stock forward.
- A folded layer runs its stock forward and leaves on its output how to rebuild it from its inputs
  (:data:`FOLD_RECIPE`); the recomputed layer that takes it checkpoints that rebuild and its own forward as one
  function of those inputs (the output computed outside is dropped with its graph, which saves nothing: nearest
  upsampling and concatenation keep only shapes for backward). Not under ``torch.compile``, whose traced graph
  frees what it does not need by itself.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .attention import in_chunked_attention
from .patching import (
    ACTIVE_COUNTERS,
    RECOMPUTE_NAME,
    PickledAsStock,
    model_layers,
    patched_class,
    stock_class,
)
from .policy import ModelLayout, RecomputePolicy, resolve

# Layer types whose inner blocks (the elements of the ModuleList named here, see _inner_blocks) are recomputed one
# at a time inside the recomputed layer. A2C2f: at stride 16 its area-attention blocks dominate (YOLO12n at imgsz
# 1536, batch 1: layer 6 saves 844 MiB that a whole-layer recompute rebuilds at once). Measured without a gain of
# 5% of a bench cell's peak, and so left whole: C2PSA, C3k2 (see the README's recompute= section).
NESTED_BLOCKS = {"A2C2f": "m"}
# The head's single-module branches, beside the elements of its ModuleLists: Segment's and Segment26's mask
# prototypes, Classify's convolution (its pooling and linear layer are glue).
HEAD_BRANCHES = ("proto", "conv")
# What recompute_mode="selective" keeps: the outputs of convolutions, matrix products and attention, which are
# expensive to recompute; BatchNorm, activations, elementwise ops and cat/split are recomputed (Chen et al. 2016,
# section 4.2). Kept as data, as in torchtitan's activation_checkpoint.py op save-list, and given to PyTorch as a list
# (create_selective_checkpoint_contexts: MUST_SAVE the ops listed, PREFER_RECOMPUTE the rest, and the products
# inside the attention region's Function, see _selective_policy). The attention ops are
# private and differ between torch builds: the list is built from the ones this build has (:func:`_save_ops`).
SELECTIVE_SAVE_OP_NAMES = (
    "convolution",
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
)


def _save_ops(names=SELECTIVE_SAVE_OP_NAMES) -> frozenset:
    """The ``.default`` overloads of the ``torch.ops.aten`` ops named in ``names``, leaving out any this torch build
    lacks (the op or its default overload): a missing private op must not fail ``import yolo_ckpt``."""
    packets = (getattr(torch.ops.aten, name, None) for name in names)
    return frozenset(op for op in (getattr(p, "default", None) for p in packets if p is not None) if op is not None)


SELECTIVE_SAVE_OPS = _save_ops()
# The attribute a folded layer's output carries while training: (rebuild, inputs), rebuild(*inputs) giving the output
# again (see the module docstring and folded_layers)
FOLD_RECIPE = "_yolo_ckpt_fold"


@contextlib.contextmanager
def _recompute_context(layer: nn.Module):
    """Entered by ``torch.utils.checkpoint`` around the backward recomputation of ``layer`` (any recomputed module,
    eager mode)."""
    # The forward pass already updated the BatchNorm running statistics: put them back after the recompute.
    # (Turning track_running_stats off instead changes what batch_norm saves for backward, which checkpoint rejects.)
    stats = [b for m in layer.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) for b in m.buffers()]
    saved = [b.clone() for b in stats]
    first = next(layer.parameters(), None)
    for c in ACTIVE_COUNTERS if first is None or not is_fake(first) else ():  # the memory model's fake passes are not training
        c._count(getattr(layer, RECOMPUTE_NAME, ""))
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in zip(stats, saved):
                b.copy_(v)


@contextlib.contextmanager
def _entered(*managers):
    with contextlib.ExitStack() as stack:
        for m in managers:
            stack.enter_context(m)
        yield


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    # The attention region's chunk products are temporaries of its own Function (which keeps O(N) for backward):
    # saving them would keep the N x N matrix the region exists to free.
    if op in SELECTIVE_SAVE_OPS and not in_chunked_attention():
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts(layer: nn.Module):
    forward, recompute = create_selective_checkpoint_contexts(_selective_policy)
    return forward, _entered(_recompute_context(layer), recompute)  # BN snapshot outside the SAC mode


def _recomputed_in_context(layer: nn.Module, forward):
    """``forward`` as is on its first call (the checkpointed forward pass), inside :func:`_recompute_context` on every
    later call (``checkpoint``'s recomputations in backward).

    The full mode's BatchNorm snapshot without a ``context_fn``, which PyTorch's checkpoint debug mode
    (``torch.utils.checkpoint.set_checkpoint_debug_enabled(True)``) refuses ("debug=True is incompatible with
    non-default context_fn"): so debug mode runs, with its own context, and checks the full mode exactly as it
    trains (the selective mode needs its ``context_fn``: PyTorch refuses debug mode for it)."""
    calls = 0

    def run(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 1:
            return forward(*args, **kwargs)
        with _recompute_context(layer):
            return forward(*args, **kwargs)

    return run


class RecomputedLayer(PickledAsStock, nn.Module):
    """Mixin placed before a module's own class: its forward runs under activation checkpointing when training.

    Not instantiated directly: :func:`apply_checkpointing` swaps the class of a layer, an inner block or a head
    branch for ``Recomputed<Class>`` (``recompute_mode="full"``) or ``SelectiveRecomputed<Class>`` (``"selective"``).
    """

    recompute_mode = "full"

    def forward(self, *args, **kwargs):
        """The stock forward, checkpointed while training with grad enabled and a trainable parameter."""
        stock_forward = super().forward
        if not (self.training and torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())):
            return stock_forward(*args, **kwargs)
        recipe = getattr(args[0], FOLD_RECIPE, None) if len(args) == 1 and not kwargs else None
        if torch.compiler.is_compiling():
            # Dynamo takes only a context_fn made in the traced code that returns two dispatch modes. No BatchNorm
            # guard is needed there: AOT autograd applies buffer mutations once, after the forward graph.
            options = {}
            if self.recompute_mode == "selective":
                options["context_fn"] = functools.partial(create_selective_checkpoint_contexts, list(SELECTIVE_SAVE_OPS))
        else:
            # SAC's saved tensors go through the surrounding saved-tensor hooks, as every other saved tensor does
            # (save_on_cpu, the per-layer accounting of yolo_ckpt.memory.layer_accounting); torch 2.14 warns that this becomes the default
            options = {"respect_saved_tensors_hooks": True}
            if self.recompute_mode == "selective":
                options["context_fn"] = functools.partial(_selective_contexts, self)
            else:
                stock_forward = _recomputed_in_context(self, stock_forward)
        if recipe is not None:  # a folded layer's output: the region starts from its inputs
            rebuild, args = recipe
            stock_forward = _after(rebuild, stock_forward)
        return checkpoint(stock_forward, *args, use_reentrant=False, **options, **kwargs)


def _after(rebuild, forward):
    """``forward(rebuild(*inputs))``: a recomputed layer's forward from the inputs of the layers folded into it."""

    def run(*inputs):
        return forward(rebuild(*inputs))

    return run


class FoldedLayer(PickledAsStock, nn.Module):
    """Mixin placed before a parameter-free layer's own class (``Upsample``, ``Concat``) that a recomputed layer's
    region takes in (:func:`folded_layers`): its stock forward, and on its output, while training with grad enabled
    (not under ``torch.compile``), :data:`FOLD_RECIPE`: ``(rebuild, inputs)`` with ``rebuild(*inputs)`` its output
    again (an output that is not a tensor carries none: its consumer keeps it as without the fold). An input that is
    itself a folded layer's output is replaced by that layer's inputs, so a chain (``Upsample`` then ``Concat``) is
    rebuilt from the tensors it started from."""

    def forward(self, x):
        """The stock forward, its output carrying how to rebuild it (see the class)."""
        out = super().forward(x)
        if isinstance(out, torch.Tensor) and self.training and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            setattr(out, FOLD_RECIPE, _recipe(super().forward, x))
        return out


def _recipe(forward, x) -> tuple:
    """``(rebuild, inputs)`` of ``forward(x)``, ``x`` a tensor or a list of them, each folded input opened into its own
    recipe's inputs. The recipe holds no reference to ``x`` (an ``Upsample`` output among them would stay alive)."""
    listed = isinstance(x, list)
    parts = [(getattr(t, FOLD_RECIPE, None), t) for t in (x if listed else [x])]
    inputs, makers = [], []
    for recipe, t in parts:
        rebuild, sources = recipe if recipe is not None else (None, (t,))
        makers.append((rebuild, len(sources)))
        inputs += sources

    def rebuild(*tensors):
        rebuilt, at = [], 0
        for make, n in makers:
            rebuilt.append(make(*tensors[at : at + n]) if make is not None else tensors[at])
            at += n
        return forward(rebuilt if listed else rebuilt[0])

    return rebuild, tuple(inputs)


def folded_layers(model: nn.Module, recomputed) -> dict[int, int]:
    """The parameter-free layers of ``model.model`` folded into a recomputed layer's region, as ``{layer index: index
    of the recomputed layer}``: a layer without parameters whose output one layer alone takes, that layer being in
    ``recomputed`` (indices) or itself folded (a chain: ``Upsample`` into ``Concat`` into ``C3k2``). yolo11n, every
    layer recomputed: ``{11: 13, 12: 13, 14: 16, 15: 16, 18: 19, 21: 22}``. A layer in ``model.save`` that another
    layer takes as well, or the final head's input, is not folded."""
    layers = model_layers(model).model
    consumers: dict[int, list[int]] = {}
    for i in range(len(layers)):
        for j in layer_inputs(layers, i):
            consumers.setdefault(j, []).append(i)
    folded: dict[int, int] = {}
    for j in range(len(layers) - 1, -1, -1):
        if _has_params(layers[j]) or len(consumers.get(j, ())) != 1:
            continue
        c = consumers[j][0]
        if c in recomputed:
            folded[j] = c
        elif c in folded:
            folded[j] = folded[c]
    return folded


def layer_inputs(layers, i: int) -> list[int]:
    """The indices of the layers whose outputs layer ``i`` of ``model.model`` takes (its ``.f``, -1 meaning the layer
    before it; layer 0's input image left out)."""
    f = layers[i].f
    return [i - 1 if j == -1 else j for j in (f if isinstance(f, list) else [f]) if not (i == 0 and j == -1)]


def _recomputed_class(stock: type, mode: str) -> type:
    name = f"{'Selective' if mode == 'selective' else ''}Recomputed{stock.__name__}"
    return patched_class(RecomputedLayer, stock, name, recompute_mode=mode)


def checkpointed_layers(model: nn.Module) -> list[int]:
    """Indices of the layers of ``model.model`` under activation checkpointing (``layer.recompute_mode`` says how)."""
    return [i for i, m in enumerate(model_layers(model).model) if isinstance(m, RecomputedLayer)]


def checkpointed_modules(model: nn.Module) -> list[str]:
    """Qualified names under ``model.model`` of every module under activation checkpointing: layers (``"6"``),
    their inner blocks (``"6.m.0.1"``) and head branches (``"23.cv2.0"``), in module order."""
    return [name for name, m in model_layers(model).model.named_modules() if isinstance(m, RecomputedLayer)]


def recompute_mode_of(layer: nn.Module) -> str | None:
    """``"full"`` or ``"selective"`` if ``layer`` or a module inside it (a head branch) is recomputed, else ``None``."""
    return next((m.recompute_mode for m in layer.modules() if isinstance(m, RecomputedLayer)), None)


def head_branches(head: nn.Module) -> list[tuple[str, nn.Module]]:
    """The parameterised branches of a final task head, as ``(name under the head, module)``.

    A branch is one element of one of the head's ``nn.ModuleList`` attributes (``cv2.0``, ``cv3.1``,
    ``one2one_cv2.0``, Pose26's ``cv4_kpts.2``, ...) or one of :data:`HEAD_BRANCHES` (``proto``, Classify's
    ``conv``). Every one is called once per forward pass (Pose26 feeds ``cv4[i]``'s output to two convolutions,
    computing it once), so each is recomputed once per backward. Modules without parameters are left out.
    """
    found = []
    for name, child in head.named_children():
        if isinstance(child, nn.ModuleList):
            found += [(f"{name}.{j}", m) for j, m in enumerate(child)]
        elif name in HEAD_BRANCHES:
            found.append((name, child))
    return [(name, m) for name, m in found if _has_params(m)]


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _inner_blocks(layer: nn.Module) -> list[tuple[str, nn.Module]]:
    """The inner blocks of a layer of a type in :data:`NESTED_BLOCKS` (none for other layers), as ``(name under the
    layer, module)``: the elements of its ModuleList, a plain ``nn.Sequential`` among them opened into its own
    elements. A2C2f's ``m[j]`` holds two area-attention blocks (``ABlock``): recomputing each on its own lowers
    YOLO12n's ``all`` at imgsz 1536, batch 1 from 0.39x (``m[j]`` whole) to 0.31x of the ``none`` peak."""
    attr = NESTED_BLOCKS.get(type(layer).__name__)
    blocks = []
    for j, block in enumerate(getattr(layer, attr) if attr else ()):
        if type(block) is nn.Sequential:
            blocks += [(f"{attr}.{j}.{k}", b) for k, b in enumerate(block)]
        else:
            blocks.append((f"{attr}.{j}", block))
    return blocks


def sub_regions(model: nn.Module) -> dict[int, list[tuple[str, nn.Module]]]:
    """The modules below the layers that are recomputed on their own, per layer index of ``model.model``: the inner
    blocks of a layer of a type in :data:`NESTED_BLOCKS` (with parameters) and, at the head's index, the head's
    branches (:func:`head_branches`); ``(qualified name under model.model, module)``, e.g. ``("6.m.0.1", ...)``,
    ``("23.cv2.0", ...)``; an empty list for other layers. The memory model accounts these one by one."""
    layers = model_layers(model).model
    head = len(layers) - 1
    return {
        i: [(f"{i}.{name}", b) for name, b in (head_branches(layer) if i == head else _inner_blocks(layer)) if _has_params(b)]
        for i, layer in enumerate(layers)
    }


def _regions(inner: nn.Module, policy: RecomputePolicy) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of every module ``policy`` recomputes: layers, their inner blocks, head branches."""
    layers = inner.model  # stock classes here: apply_checkpointing removed any earlier policy
    parts = sub_regions(inner)
    chosen = []
    for i in policy.indices:
        chosen += [(str(i), layers[i]), *parts[i]]
    if policy.head:
        chosen += parts[len(layers) - 1]
    return chosen


def remove_checkpointing(model: nn.Module) -> None:
    """Restore every module of ``model``, its attention and its loss to their stock classes (a no-op for an unpatched
    model)."""
    from .attention import remove_attention_region
    from .losses import remove_loss_region

    for m in model_layers(model).model.modules():
        if isinstance(m, RecomputedLayer):
            m.__class__ = stock_class(type(m))
            del m.__dict__[RECOMPUTE_NAME]
        elif isinstance(m, FoldedLayer):
            m.__class__ = stock_class(type(m))
    remove_loss_region(model)
    remove_attention_region(model)


def apply_checkpointing(
    model: nn.Module,
    recompute="backbone",
    frozen=(),
    mode: str = "full",
    loss_chunk: int | None = None,
    assign_chunk: int | None = None,
    attn_chunk: int | None = None,
) -> RecomputePolicy:
    """Recompute the regions selected by ``recompute=`` in backward instead of keeping their activations.

    Works on a bare Ultralytics ``BaseModel`` (detect, segment, obb, pose, classify), no trainer needed.
    Replaces any policy applied before, so calling it twice is safe. Layers of a type in :data:`NESTED_BLOCKS`
    also recompute their inner blocks one at a time; ``head`` recomputes each of :func:`head_branches`; the
    parameter-free layers a recomputed layer alone takes (:func:`folded_layers`) fold into its region.

    Args:
        model: an Ultralytics ``BaseModel`` (optionally wrapped in DDP, ``torch.compile`` or the ``DistillationModel``
            of ``distill_model=``, whose student is patched; its teacher runs under ``no_grad``, never recomputed).
        recompute: a ``recompute=`` value, see :mod:`yolo_ckpt.checkpointing.policy`.
        frozen: indices of layers frozen with ``freeze=``, left alone.
        mode: ``"full"`` recomputes the whole module; ``"selective"`` keeps the outputs of its convolutions, matrix
            products and attention (:data:`SELECTIVE_SAVE_OPS`) and recomputes the rest, with PyTorch's selective
            activation checkpointing (``create_selective_checkpoint_contexts``): less memory saved, at much less
            recompute time. The same for layers, inner blocks and head branches; the loss region ignores it
            (selective mode would keep the predicted masks, the very tensors it frees).
        loss_chunk: with ``policy.loss``, anchors per chunk of the mask loss's forward
            (:func:`yolo_ckpt.checkpointing.losses.apply_loss_region`); ``None``: its default. Every value gives the same bits.
        assign_chunk: with ``policy.loss``, objects per chunk of the task-aligned assigner
            (:mod:`yolo_ckpt.checkpointing.assigner`); ``None``: its default. Every value gives the same bits.
        attn_chunk: with ``policy.attention``, queries (and keys) per chunk of the attention region
            (:func:`yolo_ckpt.checkpointing.attention.apply_attention_region`); ``None``: its default. Every value it
            accepts gives stock's bits on the CPU.

    Returns:
        The resolved :class:`~yolo_ckpt.checkpointing.policy.RecomputePolicy` (parameter-free and frozen layers dropped).

    Examples:
        >>> from ultralytics import YOLO
        >>> model = YOLO("yolo11n.yaml").model  # a bare DetectionModel: any training loop
        >>> apply_checkpointing(model, recompute="backbone").indices
        (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
        >>> apply_checkpointing(model, recompute="none").indices  # replaces the policy before
        ()

    Raises:
        ValueError: for an invalid ``recompute=`` value (see :func:`yolo_ckpt.checkpointing.policy.resolve`), ``mode``, ``frozen``
            ``loss_chunk``, ``assign_chunk`` or ``attn_chunk``, or a fused model (``model.fuse()``, for inference) with
            anything to recompute; the model is then left unchanged.
        TypeError: if ``model`` is not an Ultralytics ``BaseModel``.
    """
    from .attention import apply_attention_region
    from .chunks import DEFAULT_ASSIGN_CHUNK, DEFAULT_ATTN_CHUNK, DEFAULT_CHUNK, check_assign_chunk, check_attn_chunk, check_loss_chunk
    from .losses import apply_loss_region

    inner = model_layers(model)
    policy = resolve(recompute, ModelLayout.from_model(inner), frozen, mode)
    chunk = check_loss_chunk(DEFAULT_CHUNK if loss_chunk is None else loss_chunk)
    objects = check_assign_chunk(DEFAULT_ASSIGN_CHUNK if assign_chunk is None else assign_chunk)
    queries = check_attn_chunk(DEFAULT_ATTN_CHUNK if attn_chunk is None else attn_chunk)
    fused = sorted({n.split(".")[0] for n, m in inner.model.named_modules() if "forward" in m.__dict__}, key=int)
    if fused and (policy.indices or policy.head or policy.loss or policy.attention):
        # BaseModel.fuse() sets forward = forward_fuse on each fused module, which would bypass the recomputed class
        raise ValueError(
            f"recompute={policy.spec!r}: the model is fused (model.fuse() folded BatchNorm into the convolutions of "
            f"layers {', '.join(fused)}, for inference): activation checkpointing is for training; build or load the "
            "model unfused (YOLO('model.yaml') or YOLO('last.pt') before predict/val/export fuse it)"
        )
    remove_checkpointing(inner)
    for name, module in _regions(inner, policy):
        module.__class__ = _recomputed_class(type(module), mode)
        module.__dict__[RECOMPUTE_NAME] = name
    for j in folded_layers(inner, set(policy.indices)):
        layer = inner.model[j]
        layer.__class__ = patched_class(FoldedLayer, type(layer), f"Folded{type(layer).__name__}")
    if policy.loss:
        apply_loss_region(inner, chunk, objects)
    if policy.attention:
        apply_attention_region(inner, queries)
    return policy
