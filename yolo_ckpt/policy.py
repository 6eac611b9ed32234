"""Recompute policies: a ``recompute=`` spec -> an explicit, validated set of layer indices (pure data).

The unit of recomputation is one layer ``model.model[i]`` of an Ultralytics ``BaseModel``. A spec is a union of

- ``backbone``: the layers of the model YAML's ``backbone:`` section (the default);
- ``neck``: the ``head:`` section without the final task head;
- ``all``: every layer but the final task head (for classify models this equals ``backbone``: their ``head:``
  section holds only the ``Classify`` head);
- layer indices and inclusive ranges, ``0-4,6,8``;
- Ultralytics module class names, the last part of ``layer.type``, ``C3k2,SPPF``.

``none`` (and the ``None`` Ultralytics' own CLI parser makes of it, or ``False``) selects nothing. The CLI parser
turns ``recompute=6`` into the int ``6`` and ``recompute=0,1,2`` into the tuple ``(0, 1, 2)``: both are indices.
Parameter-free layers (Upsample, Concat) and frozen layers are dropped from the result: recomputing them saves
nothing.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

SECTIONS = ("backbone", "neck", "all")
_INDEX = re.compile(r"[0-9]+")  # ASCII digits: str.isdigit also accepts '²', which int() rejects
MODES = ("full", "selective")  # recompute_mode=: whole layers, or only their cheap ops (yolo_ckpt.engine)
CHOICES = "valid choices: none, backbone, neck, all, layer indices and ranges ('0-4,6'), module names ('C3k2,SPPF'), joined by commas, or auto (with memory_budget=)"


@dataclass(frozen=True)
class ModelLayout:
    """What a policy needs to know of a model: one type name per layer and where the backbone ends.

    Attributes:
        types: the last part of each layer's ``type`` (``"C3k2"``), one per layer of ``model.model``.
        n_backbone: the number of layers in the YAML's ``backbone:`` section.
        param_free: indices of layers without parameters (empty when built from a YAML alone).
    """

    types: tuple[str, ...]
    n_backbone: int
    param_free: frozenset[int] = frozenset()

    @classmethod
    def from_model(cls, model) -> ModelLayout:
        """Layout of a built Ultralytics ``BaseModel`` (``model.model`` layers, ``model.yaml`` sections)."""
        layers = list(model.model)
        return cls(
            types=tuple(str(m.type).rsplit(".", 1)[-1] for m in layers),
            n_backbone=len(model.yaml["backbone"]),
            param_free=frozenset(i for i, m in enumerate(layers) if not any(True for _ in m.parameters())),
        )

    @classmethod
    def from_yaml(cls, cfg: dict) -> ModelLayout:
        """Layout of a model YAML dict (rows ``[from, repeats, module, args]``) without building the model."""
        rows = list(cfg["backbone"]) + list(cfg["head"])
        return cls(types=tuple(str(r[2]).rsplit(".", 1)[-1] for r in rows), n_backbone=len(cfg["backbone"]))

    @property
    def head(self) -> int:
        """Index of the final task head (Detect, Segment, OBB, Pose, Classify, ...)."""
        return len(self.types) - 1

    def section(self, name: str) -> range:
        """Layer indices of ``backbone``, ``neck`` or ``all``."""
        return {
            "backbone": range(0, min(self.n_backbone, self.head)),
            "neck": range(self.n_backbone, self.head),
            "all": range(0, self.head),
        }[name]

    def describe(self) -> str:
        """The model's sections and recomputable module names, for error messages."""

        def span(r: range) -> str:
            return f"layers {r.start}-{r.stop - 1}" if len(r) else "no layers"

        names = sorted({t for i, t in enumerate(self.types) if i != self.head and i not in self.param_free})
        return (
            f"this model has backbone ({span(self.section('backbone'))}), neck ({span(self.section('neck'))}) "
            f"and the final head (layer {self.head}, {self.types[self.head]}, never recomputed); "
            f"{CHOICES}, with indices within 0-{self.head - 1} and module names among {names}"
        )


@dataclass(frozen=True)
class RecomputePolicy:
    """A resolved policy: the spec as given and the layers it selects.

    Attributes:
        spec: the ``recompute=`` value as the user gave it, as a string (``"backbone"``, ``"0-4,6"``).
        indices: sorted indices of the layers to recompute.
        types: the type name of each layer in ``indices``.
        mode: ``"full"`` or ``"selective"`` recomputation (``recompute_mode=``).
    """

    spec: str
    indices: tuple[int, ...]
    types: tuple[str, ...]
    mode: str = "full"

    def layers(self) -> list[dict]:
        """``[{"index": i, "type": "C3k2"}, ...]``, as written into run reports."""
        return [{"index": i, "type": t} for i, t in zip(self.indices, self.types)]

    def __str__(self) -> str:
        body = ", ".join(f"{i}:{t}" for i, t in zip(self.indices, self.types)) or "no layers"
        return f"recompute={self.spec} recompute_mode={self.mode} -> {len(self.indices)} layers [{body}]"


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
        raise ValueError(f"recompute={spec!r} is not a valid value; {choices}")
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
        raise ValueError(f"recompute={spec!r} is empty; {choices}")
    if "none" in (t.lower() for t in tokens) and len(tokens) > 1:
        raise ValueError(f"recompute={spec_string(spec)!r} combines 'none' with other layers; {choices}")
    for t in tokens:
        lo, sep, hi = t.partition("-")
        if sep and _INDEX.fullmatch(lo) and _INDEX.fullmatch(hi) and int(lo) > int(hi):
            raise ValueError(f"recompute={spec_string(spec)!r}: range '{t}' is empty (start > end), write '{hi}-{lo}'; {choices}")


def check_mode(mode) -> None:
    """Raise ``ValueError`` naming the valid modes unless ``mode`` is a ``recompute_mode=`` value."""
    if mode not in MODES:
        raise ValueError(f"recompute_mode={mode!r} is not valid; valid modes: {', '.join(MODES)}")


def resolve(spec, layout: ModelLayout, frozen=(), mode: str = "full") -> RecomputePolicy:
    """Resolve a ``recompute=`` value against a model's layout.

    Args:
        spec: ``str`` (``"backbone"``, ``"0-4,6"``, ``"C3k2,SPPF"``, ``"none"``), ``int``, ``list``/``tuple`` of
            ints or names, or ``None``/``False`` (no recomputation).
        layout: the model's :class:`ModelLayout`.
        frozen: indices of frozen layers (``freeze=``), dropped from the result.
        mode: the ``recompute_mode=`` carried by the result.

    Returns:
        The :class:`RecomputePolicy`; parameter-free and frozen layers are dropped.

    Raises:
        ValueError: naming the bad value, the model's sections and the valid choices, for an unknown name (with
            close matches), an index out of range, the final head, or ``neck`` on a model without one; or
            naming the valid modes for a bad ``mode``.
    """
    check_spec(spec, layout.describe())
    check_mode(mode)
    text = spec_string(spec)
    if is_auto(spec):
        raise ValueError("recompute=auto is decided by the planner for a memory budget: give memory_budget= to a "
                         "Checkpoint*Trainer, or use yolo_ckpt.planner.MemoryModel.plan() on a bare model")
    head = layout.head
    chosen: set[int] = set()
    for token in _tokens(spec):
        key = token.lower()
        if key == "none":
            continue
        if key in SECTIONS:
            if key == "neck" and not len(layout.section("neck")):
                raise ValueError(f"recompute={text!r}: this model has no neck; {layout.describe()}")
            chosen.update(layout.section(key))
            continue
        lo, sep, hi = token.partition("-")
        if _INDEX.fullmatch(lo) and (not sep or _INDEX.fullmatch(hi)):
            idx = range(int(lo), int(hi if sep else lo) + 1)
            if idx.stop - 1 > head:
                raise ValueError(f"recompute={text!r}: layer index {idx.stop - 1} is out of range; {layout.describe()}")
            if head in idx:
                raise ValueError(
                    f"recompute={text!r}: layer {head} is the final task head ({layout.types[head]}), which is "
                    f"never recomputed; {layout.describe()}"
                )
            chosen.update(idx)
            continue
        matches = {i for i, t in enumerate(layout.types) if t.lower() == key}
        if matches == {head}:
            raise ValueError(
                f"recompute={text!r}: '{token}' is the final task head (layer {head}), which is never recomputed; "
                f"{layout.describe()}"
            )
        if not matches:
            vocabulary = {v.lower(): v for v in ["none", *SECTIONS, *sorted(set(layout.types[:head]))]}
            close = [vocabulary[c] for c in difflib.get_close_matches(key, vocabulary, n=3, cutoff=0.6)]
            hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
            raise ValueError(f"recompute={text!r}: unknown layer name or section '{token}'{hint}; {layout.describe()}")
        chosen.update(matches - {head})
    indices = tuple(sorted(chosen - layout.param_free - set(frozen or ())))
    return RecomputePolicy(spec=text, indices=indices, types=tuple(layout.types[i] for i in indices), mode=mode)


def layout_of(model_arg) -> ModelLayout:
    """Layout from what ``model=`` names, without building the model: a YAML path or dict, or a ``.pt`` file (of a
    distillation run: its student's).

    Raises:
        FileNotFoundError: for a ``.pt`` path that does not exist.
    """
    if isinstance(model_arg, dict):
        return ModelLayout.from_yaml(model_arg)
    path = str(model_arg)
    if Path(path).suffix.lower() in {".yaml", ".yml"}:
        from ultralytics.nn.tasks import yaml_model_load

        return ModelLayout.from_yaml(yaml_model_load(path))
    from ultralytics.nn.tasks import load_checkpoint

    model = load_checkpoint(path)[0]
    return ModelLayout.from_model(getattr(model, "student_model", model))  # a distill_model= run's last.pt
