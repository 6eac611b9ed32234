"""yolo-ckpt's keys as one typed config, validated once where it is built.

:class:`CkptConfig` holds the train keys of ``cfg/default.yaml`` (``recompute``, ``recompute_mode``,
``memory_budget``, ``memory_headroom``, ``loss_chunk``, ``assign_chunk``, ``attn_chunk``) with their types: a budget is a
:class:`Budget`, a headroom a :class:`Headroom`. :meth:`CkptConfig.from_args` is the one constructor: it fills the defaults
from the YAML (and :data:`TASK_DEFAULTS`) and checks every key, before anything is built or written. The trainers
(:mod:`yolo_ckpt.train.trainer`), the CLI (:mod:`yolo_ckpt.cli`) and the benchmark matrix (:mod:`yolo_ckpt.bench.matrix`) read
their keys through it; ``Budget.parse`` is the one place a budget's form is read and ``Headroom.parse`` a headroom's.
:class:`EstimateOptions` holds ``yolo-ckpt profile``/``plan``'s own keys, defaults from ``cfg/estimate.yaml``;
:data:`BENCH_DEFAULTS` ``yolo-ckpt bench``'s, from ``cfg/bench.yaml`` (their values are checked by the bench).

The raw values stay on the trainer's ``args`` as given, so ``args.yaml`` and ``last.pt`` save them as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import yaml

from .checkpointing.chunks import CHUNK_REGIONS, check_assign_chunk, check_attn_chunk, check_loss_chunk
from .checkpointing.policy import check_mode, check_spec, spec_string
from .errors import ConfigError

CFG_DIR = Path(__file__).parent / "cfg"
DEFAULTS_PATH = CFG_DIR / "default.yaml"
DEFAULTS: dict = yaml.safe_load(DEFAULTS_PATH.read_text())  # the train keys and their defaults
ESTIMATE_DEFAULTS_PATH = CFG_DIR / "estimate.yaml"
ESTIMATE_DEFAULTS: dict = yaml.safe_load(ESTIMATE_DEFAULTS_PATH.read_text())  # profile and plan's own keys and their defaults
BENCH_DEFAULTS_PATH = CFG_DIR / "bench.yaml"
BENCH_DEFAULTS: dict = yaml.safe_load(BENCH_DEFAULTS_PATH.read_text())  # bench's own keys and their defaults
# yolo-ckpt keys whose default differs for a task from cfg/default.yaml: the loss region (yolo_ckpt.checkpointing.losses), where
# the task's YOLO heads have one. Exact; it chunks the assigner (no recomputation) and recomputes the segmentation
# mask loss: with many objects per image it frees more memory than any layer policy. Only for the task's own
# trainers (yolo_ckpt.train.trainer): RT-DETR's, YOLO-World's and YOLOE's heads have no loss region.
TASK_DEFAULTS = {task: {"recompute": "backbone,loss"} for task in ("detect", "obb", "pose", "segment")}


def shown_default(key: str, default, form=str) -> str:
    """``key``'s default as ``yolo-ckpt help`` and the keys page show it: ``form(default)`` (the file's value), and for a
    train key a task sets otherwise (:data:`TASK_DEFAULTS`, applied where the model has a loss region) the task's value
    first: the file's ``recompute: backbone`` alone read as every model's default."""
    by_value: dict = {}
    for task, values in TASK_DEFAULTS.items():
        if key in values:
            by_value.setdefault(values[key], []).append(task)
    tasks = [f"{form(value)} for {', '.join(names)} models with a loss region" for value, names in by_value.items()]
    return "; ".join([*tasks, f"{form(default)} otherwise"]) if tasks else form(default)

_UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_BUDGET = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")
_HEADROOM = re.compile(r"^\s*(?:([0-9]*\.?[0-9]+)\s*x)?\s*(?:\+?\s*([0-9]*\.?[0-9]+\s*[A-Za-z]+))?\s*$")
UNIT_FORMS = "12GB = 12e9 bytes, 16GiB = 16*2^30; B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
FORMATS = ("text", "json")  # profile's and plan's format=
# model= default per task, built from its YAML (nothing downloads): YOLO11n, or YOLO26n where only YOLO26 has the task.
# Its keys are Ultralytics' tasks in their order (ultralytics.cfg.TASKS; a test holds them equal), known without torch.
DEFAULT_MODELS = {
    "detect": "yolo11n.yaml",
    "segment": "yolo11n-seg.yaml",
    "semantic": "yolo26n-sem.yaml",
    "depth": "yolo26n-depth.yaml",
    "classify": "yolo11n-cls.yaml",
    "pose": "yolo11n-pose.yaml",
    "obb": "yolo11n-obb.yaml",
}


@dataclass(frozen=True)
class Budget:
    """A ``memory_budget=`` value: bytes, or a fraction of the CUDA memory available to the process.

    Attributes:
        size_bytes: the budget in bytes (None for a fraction).
        fraction: the fraction in (0, 1] (None for bytes).
        given: the value as given, for messages (``str(budget)``); not compared.
    """

    size_bytes: int | None = None
    fraction: float | None = None
    given: object = field(default=None, compare=False)

    @classmethod
    def parse(cls, value) -> Budget:
        """A ``memory_budget=`` value -> :class:`Budget`: bytes with a unit, ``"12GB"`` (12e9 bytes), ``"16GiB"``
        (16 * 2^30), ``"500MiB"``; or a number without a unit, a fraction in (0, 1] of the CUDA memory available.

        Raises:
            ConfigError: naming the value and the valid forms, for a number without a unit outside (0, 1], an
                unknown unit, a value <= 0 or anything else (a bool included).
        """
        forms = f"bytes with a unit ({UNIT_FORMS}) or a fraction in (0, 1] of the CUDA memory available"
        m = _BUDGET.match(str(value))
        if not m or isinstance(value, bool):
            raise ConfigError(f"memory_budget={value!r} is not valid; use {forms}")
        number, unit = float(m.group(1)), m.group(2).upper()
        if not unit:
            if not 0 < number <= 1:
                raise ConfigError(f"memory_budget={value!r}: a number without a unit must be a fraction in (0, 1]; use {forms}")
            return cls(fraction=number, given=value)
        if unit not in _UNITS:
            raise ConfigError(f"memory_budget={value!r}: unknown unit '{m.group(2)}'; use {forms}")
        size = int(number * _UNITS[unit])
        if size <= 0:  # '.1B' too: under one byte
            raise ConfigError(f"memory_budget={value!r} must be more than 0 bytes")
        return cls(size_bytes=size, given=value)

    @property
    def is_fraction(self) -> bool:
        """Whether the budget is a fraction of the CUDA memory available rather than bytes."""
        return self.fraction is not None

    def bytes(self, cuda_available_bytes: int | None) -> int:
        """The budget in bytes; a fraction of ``cuda_available_bytes`` (the CUDA memory available to the process,
        as AutoBatch counts it: free plus what this process reserved; None where there is no CUDA device).

        Raises:
            ConfigError: for a fraction where there is no CUDA device.
        """
        if self.fraction is None:
            return self.size_bytes
        if cuda_available_bytes is None:
            raise ConfigError(f"memory_budget={self.given!r}: a fraction needs a CUDA device; on this device give bytes, e.g. 8GB")
        size = int(self.fraction * cuda_available_bytes)
        if size <= 0:
            raise ConfigError(f"memory_budget={self.given!r} is {size} bytes of the {cuda_available_bytes} available: give more")
        return size

    def __str__(self) -> str:
        if self.given is not None:
            return str(self.given)
        return f"{self.fraction:g}" if self.is_fraction else f"{self.size_bytes}B"


@dataclass(frozen=True)
class Headroom:
    """What a CUDA run holds beyond the estimate of its live tensors: ``factor`` x the estimate plus ``fixed_bytes``.

    The estimate counts tensor storage as the allocator's ``max_memory_allocated`` does. A CUDA process holds more:
    the CUDA context (outside the allocator), the caching allocator's reserve above the allocated peak
    (fragmentation, rounding of blocks), cuDNN/cuBLAS workspaces and autocast's fp16 copies of fp32 weights. The
    factor covers the parts that grow with the step, the fixed bytes the context.

    Attributes:
        factor: multiplier on the estimated peak (>= 1); fixed_bytes: bytes added (>= 0).
    """

    factor: float = 1.0
    fixed_bytes: int = 0

    @classmethod
    def parse(cls, value) -> Headroom:
        """A ``memory_headroom=`` value -> :class:`Headroom`: ``"1.15x+500MiB"``, ``"1.2x"``, ``"800MiB"``, or
        ``1``/``"1x"`` for none.

        Raises:
            ConfigError: naming the value and the valid form, for anything else, a factor below 1 or an unknown unit.
        """
        form = f"FACTORx+BYTES, e.g. 1.15x+500MiB, 1.2x or 800MiB (factor >= 1; bytes with a unit: {UNIT_FORMS})"
        m = _HEADROOM.match(str(value)) if not isinstance(value, bool) else None
        if m is None or not (m.group(1) or m.group(2)):
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1:
                return cls(float(value))
            raise ConfigError(f"memory_headroom={value!r} is not valid; use {form}")
        factor = float(m.group(1)) if m.group(1) else 1.0
        if factor < 1:
            raise ConfigError(f"memory_headroom={value!r}: the factor {factor:g} is below 1; use {form}")
        try:
            fixed = Budget.parse(m.group(2)).bytes(None) if m.group(2) else 0  # the regex requires a unit: bytes
        except ValueError:
            raise ConfigError(f"memory_headroom={value!r}: '{m.group(2)}' is not bytes with a unit; use {form}") from None
        return cls(factor, fixed)

    def need(self, estimated_bytes: int) -> int:
        """Bytes a step of this estimated peak needs with the headroom."""
        return int(estimated_bytes * self.factor + self.fixed_bytes)

    def __str__(self) -> str:
        return f"{self.factor:g}x+{self.fixed_bytes / 2**20:g}MiB"


NO_HEADROOM = Headroom()


def check_bool(key: str, value) -> bool:
    """Return ``value`` if it is a bool (``key=True``/``False``; the CLI's parser reads them so).

    Raises:
        ConfigError: naming ``key`` and the valid values, for anything else.
    """
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} is not valid; valid: True, False")
    return value


_BUILT: dict[tuple, CkptConfig] = {}  # CkptConfig.from_args's configs, by their values


@dataclass(frozen=True)
class CkptConfig:
    """yolo-ckpt's train keys, typed and checked (``cfg/default.yaml`` describes each).

    Attributes:
        recompute: the ``recompute=`` value in its canonical string form (:func:`yolo_ckpt.checkpointing.policy.spec_string`:
            ``None`` -> ``"none"``, ``(0, 1)`` -> ``"0,1"``); its form is checked, not against a model.
        recompute_mode: ``full`` or ``selective``.
        memory_budget: the :class:`Budget`, or None (unset).
        memory_headroom: the :class:`Headroom` a CUDA plan against a budget in bytes keeps.
        loss_chunk: anchors per chunk of the loss region's mask loss forward (a positive int).
        assign_chunk: objects per chunk of the loss region's assigner (a positive int).
        attn_chunk: queries (and keys) per chunk of the attention region (an int >= 32).
        estimate: whether a run estimates its peak for none, all and its policy at set-up (the run report's).
        probe: whether a CPU run measures one training step and one validation batch at its end (the report's peaks).
    """

    recompute: str
    recompute_mode: str
    memory_budget: Budget | None
    memory_headroom: Headroom
    loss_chunk: int
    assign_chunk: int
    attn_chunk: int
    estimate: bool = True
    probe: bool = True

    @classmethod
    def from_args(cls, args: Mapping, task: str | None = None) -> CkptConfig:
        """The config of yolo-ckpt's keys in ``args`` (other keys, Ultralytics', are left to Ultralytics), the
        missing ones from ``task``'s defaults (:data:`TASK_DEFAULTS`) and ``cfg/default.yaml``. Each set of values is
        checked once in a process: asked again (the trainer the CLI starts), the same config comes back.

        Raises:
            ConfigError: naming the key, the bad value and the valid choices, for a bad ``recompute=`` form
                (:func:`yolo_ckpt.checkpointing.policy.check_spec`), ``recompute_mode=``
                (:func:`yolo_ckpt.checkpointing.policy.check_mode`),
                ``memory_budget=`` (:meth:`Budget.parse`), ``memory_headroom=`` (:meth:`Headroom.parse`) or
                ``loss_chunk=`` (:func:`yolo_ckpt.checkpointing.chunks.check_loss_chunk`), ``assign_chunk=``
                (:func:`yolo_ckpt.checkpointing.chunks.check_assign_chunk`), ``attn_chunk=``
                (:func:`yolo_ckpt.checkpointing.chunks.check_attn_chunk`), or
                ``estimate=`` or ``probe=`` (:func:`check_bool`).
        """
        values = {**DEFAULTS, **TASK_DEFAULTS.get(task, {}), **{k: args[k] for k in DEFAULTS if k in args}}
        key = tuple((k, type(v), repr(v)) for k, v in values.items())
        if key not in _BUILT:  # the CLI, then the trainer it starts, ask for the same keys: checked once
            _BUILT[key] = cls._checked(values)
        return _BUILT[key]

    @classmethod
    def _checked(cls, values: dict) -> CkptConfig:
        check_spec(values["recompute"])
        check_mode(values["recompute_mode"])
        budget = values["memory_budget"]
        return cls(
            recompute=spec_string(values["recompute"]),
            recompute_mode=values["recompute_mode"],
            memory_budget=None if budget is None else Budget.parse(budget),
            memory_headroom=Headroom.parse(values["memory_headroom"]),
            loss_chunk=check_loss_chunk(values["loss_chunk"]),
            assign_chunk=check_assign_chunk(values["assign_chunk"]),
            attn_chunk=check_attn_chunk(values["attn_chunk"]),
            estimate=check_bool("estimate", values["estimate"]),
            probe=check_bool("probe", values["probe"]),
        )

    def for_task(self, task: str, given: Mapping) -> CkptConfig:
        """This config with ``task``'s defaults (:data:`TASK_DEFAULTS`, ours: valid as written) for the keys ``given``
        does not set: what :meth:`from_args` builds for ``task``, where the task is known only once the model is loaded."""
        defaults = {k: v for k, v in TASK_DEFAULTS.get(task, {}).items() if k not in given}
        return replace(self, **{k: spec_string(v) if k == "recompute" else v for k, v in defaults.items()})

    def policy_warnings(self, policy) -> list[str]:
        """The warning lines of these keys against ``policy`` (a :class:`~yolo_ckpt.checkpointing.policy.RecomputePolicy`
        applied to the model): a ``recompute=`` that selects nothing (its layers all frozen), and one line for each chunk
        key set to other than its default whose region ``policy`` does not run, so that the key has no effect:
        ``attn_chunk=64`` with ``recompute=backbone``, or with ``all`` on a model without attention layers;
        ``loss_chunk=`` or ``assign_chunk=`` without the loss region. Warnings, not errors: the run is what it would be
        without the key, ``auto`` takes a region or not by the budget, and a sweep over policies keeps its keys."""
        empty = not (policy.indices or policy.regions()) and policy.spec != "none"
        return [f"recompute={policy.spec} selects no layer with trainable parameters"] * empty + [
            f"{key}={getattr(self, key)} has no effect: recompute={policy.spec} runs no {region} region ({runs_it} runs it)"
            for key, (region, runs_it) in CHUNK_REGIONS.items()
            if getattr(self, key) != DEFAULTS[key] and region not in policy.regions()
        ]

    def headroom_on(self, device: str) -> Headroom:
        """The headroom a plan keeps on ``device`` (``"cuda"``, ``"cpu"``, ``"mps"``): ``memory_headroom`` on CUDA
        against a budget in bytes; none against a fraction or no budget (a fraction of the memory available is a
        margin already; batch=-1's default is one) or off CUDA (live tensors are all there is)."""
        in_bytes = self.memory_budget is not None and not self.memory_budget.is_fraction
        return self.memory_headroom if device == "cuda" and in_bytes else NO_HEADROOM


@dataclass(frozen=True)
class EstimateOptions:
    """``yolo-ckpt profile`` and ``plan``'s own keys, typed and checked (``cfg/estimate.yaml`` describes each).

    Attributes:
        objects: objects per image the loss is estimated for without ``data=`` (a positive int).
        object_size: the largest box side as a fraction of the image's side, in (0, 1], for the loss's candidate pairs
            (:func:`yolo_ckpt.memory.runspec.layout_rule`); None: the data's box sizes, or every box the whole image.
        format: ``text`` or ``json``.
        plot: profile: also write the per-layer picture.
    """

    objects: int
    object_size: float | None
    format: str
    plot: bool

    @classmethod
    def from_args(cls, args: Mapping) -> EstimateOptions:
        """The options in ``args``, the missing ones from ``cfg/estimate.yaml``.

        Raises:
            ConfigError: naming the key, the bad value and the valid choices.
        """
        values = {**ESTIMATE_DEFAULTS, **{f.name: args[f.name] for f in fields(cls) if f.name in args}}
        objects, size, fmt, plot = values["objects"], values["object_size"], values["format"], values["plot"]
        if isinstance(objects, bool) or not isinstance(objects, int) or objects < 1:
            raise ConfigError(
                f"objects={objects!r} is not valid; give a positive int (objects per image, default {ESTIMATE_DEFAULTS['objects']})"
            )
        if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size <= 1):
            raise ConfigError(f"object_size={size!r} is not valid; give a number in (0, 1] (the largest box side / the image side)")
        if fmt not in FORMATS:
            raise ConfigError(f"format={fmt!r} is not valid here; valid: {', '.join(FORMATS)}")
        return cls(objects, None if size is None else float(size), fmt, check_bool("plot", plot))
