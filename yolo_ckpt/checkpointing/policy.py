"""Recompute policies: a ``recompute=`` spec -> an explicit, validated set of regions (pure data).

A region is what the engine recomputes in backward instead of keeping its activations: a layer ``model.model[i]``
of an Ultralytics ``BaseModel`` (with, for big layers, its inner blocks one at a time: an engine rule, see
:data:`yolo_ckpt.checkpointing.engine.NESTED_BLOCKS`), the branches of the final task head, or the loss region. A spec is
a union of

- ``backbone``: the layers of the model YAML's ``backbone:`` section (the default);
- ``neck``: the ``head:`` section without the final task head;
- ``head``: the parameterised branches of the final task head (each element of its ``ModuleList``s, ``cv2[i]``,
  ``cv3[i]``, ..., and ``proto``; ``Classify``'s ``conv``); its decode and glue stay stock. The head's index
  (``23``) and class name (``Detect``) mean ``head`` too;
- ``loss``: the loss region (detect, obb, pose and segment models: heads in :data:`LOSS_HEADS`): the task-aligned
  assigner in chunks of objects (:mod:`yolo_ckpt.checkpointing.assigner`) and, for segment models (:data:`MASK_LOSS_HEADS`), the
  mask loss recomputed in backward (:mod:`yolo_ckpt.checkpointing.losses`);
- ``attention``: the attention region (models with Ultralytics' ``Attention`` or ``AAttn``: YOLO11's and YOLO26's
  ``C2PSA``, YOLO26's attention ``C3k2``, YOLOv10's ``PSA``, YOLO12's ``A2C2f``): self-attention in chunks of
  ``attn_chunk`` queries and keys, O(N x chunk) memory instead of O(N^2), exact (:mod:`yolo_ckpt.checkpointing.attention`);
- ``all``: every layer, the head's branches and, where the model has them, the loss and the attention regions;
- layer indices and inclusive ranges, ``0-4,6,8``;
- Ultralytics module class names, the last part of ``layer.type``, ``C3k2,SPPF``.

``none`` (and the ``None`` Ultralytics' own CLI parser makes of it, or ``False``) selects nothing. The CLI parser
turns ``recompute=6`` into the int ``6`` and ``recompute=0,1,2`` into the tuple ``(0, 1, 2)``: both are indices.
Parameter-free layers (Upsample, Concat) and frozen layers are dropped from the result: no region of their own (the
engine folds a parameter-free layer into the recomputed layer it feeds, :func:`yolo_ckpt.checkpointing.engine.folded_layers`).

The grammar reads a :class:`ModelLayout`, never a file: the model file ``model=`` names is read into one by
:mod:`yolo_ckpt.checkpointing.model_file`, a built model by :meth:`ModelLayout.from_model`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError
from ..suggest import did_you_mean

SECTIONS = ("backbone", "neck", "all")
_INDEX = re.compile(r"[0-9]+")  # ASCII digits: str.isdigit also accepts '²', which int() rejects
# recomputed regions beyond the layers of model.model (yolo_ckpt.checkpointing.engine, yolo_ckpt.checkpointing.losses)
REGIONS = ("head", "loss", "attention")
# Heads whose loss has a task-aligned assigner (ultralytics/utils/tal.py, built in ultralytics/utils/loss.py by
# v8DetectionLoss, v8OBBLoss, v8PoseLoss, PoseLoss26, v8SegmentationLoss, SegmentLoss26 and E2ELoss): they have a
# loss region. RT-DETR, YOLO-World and YOLOE heads are left out (their own losses; YOLOE does not train offline).
LOSS_HEADS = ("Detect", "v10Detect", "OBB", "OBB26", "Pose", "Pose26", "Segment", "Segment26")
# Of those, the heads whose loss region also holds the segmentation mask loss (v8SegmentationLoss, SegmentLoss26).
MASK_LOSS_HEADS = ("Segment", "Segment26")
MODES = ("full", "selective")  # recompute_mode=: whole layers, or only their cheap ops (yolo_ckpt.checkpointing.engine)
CHOICES = (
    "valid choices: none, backbone, neck, all, head, loss (detect, obb, pose, segment models), attention (models with "
    "attention layers), layer indices and ranges ('0-4,6'), "
    "module names ('C3k2,SPPF'), joined by commas, or auto (with memory_budget=)"
)


@dataclass(frozen=True)
class ModelLayout:
    """What a policy needs to know of a model: one type name per layer and where the backbone ends.

    Attributes:
        types: the last part of each layer's ``type`` (``"C3k2"``), one per layer of ``model.model``.
        n_backbone: the number of layers in the YAML's ``backbone:`` section.
        param_free: indices of layers without parameters (empty when read from a YAML alone:
            :func:`yolo_ckpt.checkpointing.model_file.yaml_layout`).
        has_attention: whether the model has an ``Attention`` or ``AAttn`` module (the attention region's).
    """

    types: tuple[str, ...]
    n_backbone: int
    param_free: frozenset[int] = frozenset()
    has_attention: bool = False

    @classmethod
    def from_model(cls, model) -> ModelLayout:
        """Layout of a built Ultralytics ``BaseModel`` (``model.model`` layers, ``model.yaml`` sections)."""
        from ultralytics.nn.modules.block import AAttn, Attention

        layers = list(model.model)
        return cls(
            types=tuple(str(m.type).rsplit(".", 1)[-1] for m in layers),
            n_backbone=len(model.yaml["backbone"]),
            param_free=frozenset(i for i, m in enumerate(layers) if not any(True for _ in m.parameters())),
            has_attention=any(isinstance(m, (Attention, AAttn)) for m in model.model.modules()),
        )

    @property
    def head(self) -> int:
        """Index of the final task head (Detect, Segment, OBB, Pose, Classify, ...)."""
        return len(self.types) - 1

    def section(self, name: str) -> range:
        """Layer indices of ``backbone``, ``neck`` or ``all`` (every layer but the head, whose branches are ``head``)."""
        return {
            "backbone": range(0, min(self.n_backbone, self.head)),
            "neck": range(self.n_backbone, self.head),
            "all": range(0, self.head),
        }[name]

    @property
    def has_loss_region(self) -> bool:
        """Whether the final head's task has a loss region (``recompute=loss``): its type is in :data:`LOSS_HEADS`."""
        return self.types[self.head] in LOSS_HEADS

    @property
    def has_mask_loss(self) -> bool:
        """Whether the loss region also recomputes a segmentation mask loss: the head is in :data:`MASK_LOSS_HEADS`."""
        return self.types[self.head] in MASK_LOSS_HEADS

    def describe(self) -> str:
        """The model's sections and recomputable module names, for error messages."""

        def span(r: range) -> str:
            return f"layers {r.start}-{r.stop - 1}" if len(r) else "no layers"

        names = sorted({t for i, t in enumerate(self.types) if i not in self.param_free})
        loss = "with a loss region ('loss')" if self.has_loss_region else (
            f"without a loss region (only detect, obb, pose and segment models have one: heads {', '.join(LOSS_HEADS)})"
        )
        loss += ", with an attention region ('attention')" if self.has_attention else ", without attention layers"

        return (
            f"this model has backbone ({span(self.section('backbone'))}), neck ({span(self.section('neck'))}) "
            f"and the final head (layer {self.head}, {self.types[self.head]}: 'head' recomputes its branches), "
            f"{loss}; {CHOICES}, with indices within 0-{self.head} and module names among {names}"
        )


@dataclass(frozen=True)
class RecomputePolicy:
    """A resolved policy: the spec as given and the regions it selects.

    Attributes:
        spec: the ``recompute=`` value as the user gave it, as a string (``"backbone"``, ``"0-4,6"``).
        indices: sorted indices of the layers of ``model.model`` to recompute (never the final head: its branches
            are ``head``); the planner's candidates.
        types: the type name of each layer in ``indices``.
        mode: ``"full"`` or ``"selective"`` recomputation (``recompute_mode=``), for the layers and the head.
        head: whether the final head's branches are recomputed.
        loss: whether the loss region is applied (only where the head is in :data:`LOSS_HEADS`): the chunked
            assigner and, for segment models, the recomputed mask loss.
        attention: whether the attention region is applied (only to models with attention layers).
    """

    spec: str
    indices: tuple[int, ...]
    types: tuple[str, ...]
    mode: str = "full"
    head: bool = False
    loss: bool = False
    attention: bool = False

    def layers(self) -> list[dict]:
        """``[{"index": i, "type": "C3k2"}, ...]`` for the recomputed layers, as written into run reports (the head
        and the loss are :meth:`regions`)."""
        return [{"index": i, "type": t} for i, t in zip(self.indices, self.types)]

    def regions(self) -> list[str]:
        """The regions recomputed beyond the layers, among :data:`REGIONS`: ``["head", "loss", "attention"]``,
        ``["head"]``, ``[]``."""
        return [r for r, on in zip(REGIONS, (self.head, self.loss, self.attention)) if on]

    def __str__(self) -> str:
        body = ", ".join(f"{i}:{t}" for i, t in zip(self.indices, self.types)) or "no layers"
        extra = "".join(f" + {r}" for r in self.regions())
        return f"recompute={self.spec} recompute_mode={self.mode} -> {len(self.indices)} layers [{body}]{extra}"


def spec_string(spec) -> str:
    """The canonical string form of a ``recompute=`` value: ``None``/``False`` -> ``"none"``, ``(0, 1)`` -> ``"0,1"``."""
    if spec is None or spec is False:
        return "none"
    if isinstance(spec, (list, tuple)):
        return ",".join(str(s) for s in spec)
    return str(spec)


def _tokens(spec, choices: str = CHOICES) -> list[str]:
    """Split a spec into stripped tokens; raise ``ValueError`` for types no parser makes."""
    if spec is True or not (spec is None or spec is False or isinstance(spec, (str, int, list, tuple))):
        raise ConfigError(f"recompute={spec!r} is not a valid value; {choices}")
    return [t.strip() for t in spec_string(spec).split(",") if t.strip()]


def is_auto(spec) -> bool:
    """Whether a ``recompute=`` value is ``auto`` (the planner picks the layers for ``memory_budget=``)."""
    return spec_string(spec).strip().lower() == "auto"


def check_spec(spec, choices: str = CHOICES) -> None:
    """Check the form of a ``recompute=`` value without a model; ``choices`` ends each error message (the valid
    choices, or the model's sections and choices when :func:`resolve` calls it).

    Raises:
        ValueError: for a value of the wrong type, an empty value, ``none`` combined with other tokens, or a
            malformed range such as ``4-2``.
    """
    tokens = _tokens(spec, choices)
    if is_auto(spec):
        return
    if not tokens:
        raise ConfigError(f"recompute={spec!r} is empty; {choices}")
    if "none" in (t.lower() for t in tokens) and len(tokens) > 1:
        raise ConfigError(f"recompute={spec_string(spec)!r} combines 'none' with other layers; {choices}")
    for t in tokens:
        lo, sep, hi = t.partition("-")
        if sep and _INDEX.fullmatch(lo) and _INDEX.fullmatch(hi) and int(lo) > int(hi):
            raise ConfigError(f"recompute={spec_string(spec)!r}: range '{t}' is empty (start > end), write '{hi}-{lo}'; {choices}")


def check_mode(mode) -> None:
    """Raise ``ValueError`` naming the valid modes unless ``mode`` is a ``recompute_mode=`` value."""
    if mode not in MODES:
        raise ConfigError(f"recompute_mode={mode!r} is not valid; valid modes: {', '.join(MODES)}")


def resolve(spec, layout: ModelLayout, frozen=(), mode: str = "full") -> RecomputePolicy:
    """Resolve a ``recompute=`` value against a model's layout.

    Args:
        spec: ``str`` (``"backbone"``, ``"head"``, ``"0-4,6"``, ``"C3k2,SPPF"``, ``"none"``), ``int``,
            ``list``/``tuple`` of ints or names, or ``None``/``False`` (no recomputation).
        layout: the model's :class:`ModelLayout`.
        frozen: indices of frozen layers (``freeze=``), dropped from the result (the head's index drops ``head``).
        mode: the ``recompute_mode=`` carried by the result.

    Returns:
        The :class:`RecomputePolicy`; parameter-free and frozen layers are dropped. The head's index or class
        name, alone or in a range, sets ``head``; ``all`` sets ``head``, ``loss`` where the head is in
        :data:`LOSS_HEADS` and ``attention`` where the model has attention layers.

    Raises:
        ValueError: naming the bad value, the model's sections and the valid choices, for an unknown name (with
            close matches), an index out of range, ``neck`` on a model without one, or ``loss`` on a model whose
            head has no loss region (naming the heads that have one), ``attention`` on a model without attention
            layers; naming the valid modes for a bad ``mode``; or for ``frozen`` that is not a collection of ints.
    """
    check_spec(spec, layout.describe())
    check_mode(mode)
    text = spec_string(spec)
    if is_auto(spec):
        raise ConfigError("recompute=auto is decided by the planner for a memory budget: give memory_budget= to a "
                         "Checkpoint*Trainer, or use yolo_ckpt.memory.memory_model.MemoryModel.plan() on a bare model")
    head = layout.head
    chosen: set[int] = set()  # layer indices, the head's included (it stands for the head's branches)
    loss = attention = False
    for token in _tokens(spec):
        key = token.lower()
        if key == "none":
            continue
        if key == "attention":
            if not layout.has_attention:
                raise ConfigError(f"recompute={text!r}: this model has no attention layer; {layout.describe()}")
            attention = True
            continue
        if key == "loss":
            if not layout.has_loss_region:
                raise ConfigError(
                    f"recompute={text!r}: the final head {layout.types[head]} has no loss region to recompute; "
                    f"{layout.describe()}"
                )
            loss = True
            continue
        if key == "head":
            chosen.add(head)
            continue
        if key in SECTIONS:
            if key == "neck" and not len(layout.section("neck")):
                raise ConfigError(f"recompute={text!r}: this model has no neck; {layout.describe()}")
            chosen.update(layout.section(key))
            if key == "all":  # every region: the head's branches and, where there are, the loss and attention
                chosen.add(head)
                loss = loss or layout.has_loss_region
                attention = attention or layout.has_attention
            continue
        lo, sep, hi = token.partition("-")
        if _INDEX.fullmatch(lo) and (not sep or _INDEX.fullmatch(hi)):
            idx = range(int(lo), int(hi if sep else lo) + 1)
            if idx.stop - 1 > head:
                raise ConfigError(f"recompute={text!r}: layer index {idx.stop - 1} is out of range; {layout.describe()}")
            chosen.update(idx)
            continue
        matches = {i for i, t in enumerate(layout.types) if t.lower() == key}
        if not matches:
            hint = did_you_mean(key, ["none", *SECTIONS, *REGIONS, *sorted(set(layout.types))])
            raise ConfigError(f"recompute={text!r}: unknown layer name or section '{token}'{hint}; {layout.describe()}")
        chosen.update(matches)
    frozen = () if frozen is None else frozen
    if isinstance(frozen, (str, bytes)) or not isinstance(frozen, (list, tuple, set, frozenset, range)) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in frozen
    ):
        raise ConfigError(
            f"frozen={frozen!r} is not valid; give layer indices (ints), as "
            "yolo_ckpt.memory.ultralytics_rules.frozen_layers(freeze=) reads freeze="
        )
    chosen -= layout.param_free | set(frozen)
    indices = tuple(sorted(chosen - {head}))
    return RecomputePolicy(
        spec=text, indices=indices, types=tuple(layout.types[i] for i in indices), mode=mode, head=head in chosen, loss=loss,
        attention=attention,
    )
