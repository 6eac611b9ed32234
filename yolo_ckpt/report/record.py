"""The run report ``ckpt_report.json``: one :class:`RunReport` record per run (policy, settings, peak memory, step time,
final metrics), written by the trainer (:meth:`yolo_ckpt.train.trainer.CheckpointTrainerMixin.run_report`) and read back
by ``yolo-ckpt compare`` and the bench's train cells.

Field names carry their units (``_bytes``, ``_s``). Bump :data:`SCHEMA_VERSION` when a field changes meaning
(2: the CPU probe measures the first full-size batch with the optimizer step and says which batch it measured;
``batch`` is the batch that trained, ``batch_at_start`` the one training started with; plans carry their headroom
and what the estimate assumed. 3: ``estimated_none_peak_bytes``. 4: every run of a planned task estimates its step
at set-up: ``estimated_step``, ``estimated_all_peak_bytes``, ``estimated_policy_peak_bytes``, ``estimate_skipped``.
5: ``val_time_s``, ``best_epoch``, ``class_ap``, ``not_measured``: a run whose end was interrupted, or finished by
``resume``, still has its report. 6: ``attention``, the attention region's chunking). :func:`load_report` reads schemas 2
to 6.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError, MissingFileError

REPORT_NAME = "ckpt_report.json"
SCHEMA_VERSION = 6
READABLE_SCHEMAS = (2, 3, 4, 5, 6)  # 3 to 6 only added fields, which an older file lacks (None, or an empty list or dict)
WARMUP_STEPS = 3  # steps left out of the median step time: first-call allocations, lazy init
PROBE_SKIPPED = "cpu_probe_skipped"  # memory_source of a CPU run with probe=False: no peak measured
NOT_MEASURED = "not_measured"  # memory_source of a CPU run whose end-of-run probe did not run (interrupted, finished by resume)
# what an interrupted end, or a run finished by resume, did not measure (RunReport.not_measured)
FINAL_VALIDATION, MEMORY_PROBE, STEP_TIMES = "final_validation", "memory_probe", "step_times"
_SUFFIX = {"(B)": "box", "(M)": "mask", "(P)": "pose"}


def one_unit(largest: int):
    """The formatter of the byte counts of one line, in one unit chosen by its ``largest`` figure (bytes): MiB (whole)
    below 10 GiB, else GiB (2 decimals); ``one_unit(3 * 2**30)(797 * 2**20)`` -> ``"797 MiB"``."""
    if largest >= 10 * 2**30:
        return lambda n: f"{n / 2**30:.2f} GiB"
    return lambda n: f"{n / 2**20:.0f} MiB"


@dataclass
class PlanRecord:
    """What a run planned (``recompute=auto``, ``batch=-1``): the ``plan`` object of ``ckpt_report.json``.

    Attributes:
        recompute: the planned units as a ``recompute=`` value; budget_bytes: the budget it was held against.
        estimated_peak_bytes: the memory model's estimate of the planned step; headroom_bytes: what the headroom adds;
            margin_bytes: the budget left after both (negative: over).
        batch, imgsz (px): the step planned. recompute_flops: forward FLOPs recomputed per step;
            recompute_cost_fraction: those as a fraction of a step's FLOPs.
        assumed: what the estimate assumed (:meth:`yolo_ckpt.memory.runspec.RunSpec.to_dict`), or None.
    """

    recompute: str
    budget_bytes: int
    estimated_peak_bytes: int
    batch: int
    imgsz: int
    recompute_flops: int
    recompute_cost_fraction: float
    headroom_bytes: int
    margin_bytes: int
    assumed: dict | None = None

    @classmethod
    def of(cls, plan, assumed: dict | None) -> PlanRecord:
        """The record of a :class:`yolo_ckpt.memory.memory_model.Plan` and the assumptions of its estimate."""
        return cls(
            plan.recompute, plan.budget_bytes, plan.estimated_peak_bytes, plan.batch, plan.imgsz, plan.recompute_flops,
            plan.recompute_cost, plan.headroom_bytes, plan.margin_bytes, assumed,
        )


@dataclass
class RunReport:
    """The record of one finished run: the content of ``ckpt_report.json``, one JSON key per field.

    Attributes:
        versions: ``yolo_ckpt``, ``ultralytics`` and ``torch`` versions. task, model, data: as the run was given.
        recompute, recompute_mode: the policy that trained (``recompute`` its spec, the planned layers for auto);
            recomputed_layers: ``{"index", "type"}`` per layer; recomputed_regions: ``head``, ``loss``, ``attention``.
        device, imgsz, batch, batch_at_start, amp, epochs: as the run trained (imgsz in px; batch in images, after
            Ultralytics' out-of-memory halvings).
        memory_source: ``cuda_allocator``, ``cpu_probe_live_tensors`` (a live-tensor probe of one step at the end),
            :data:`PROBE_SKIPPED` (a CPU run with ``probe=False``: no peak) or :data:`NOT_MEASURED` (the probe did not
            run: see ``not_measured``).
        memory_probe_images, memory_probe_objects, memory_probe_imgsz: the batch the CPU probe measured (None on CUDA).
        train_peak_allocated_bytes, train_peak_reserved_bytes, val_peak_allocated_bytes, val_peak_reserved_bytes:
            peak memory (reserved: CUDA only; None where not measured).
        train_step_time_median_s: median training step (after :data:`WARMUP_STEPS`), train_steps_timed: steps in it.
        val_time_s: seconds spent validating: every epoch's validation and the final one of ``best.pt`` (a resumed run's
            earlier legs included, as its step times are); None in a report before schema 5.
        estimated_none_peak_bytes, estimated_all_peak_bytes, estimated_policy_peak_bytes: the memory model's peak of
            this run's step (:attr:`estimated_step`) for ``recompute=none``, ``all`` and the policy that trained,
            estimated at set-up for this run's spec (:func:`yolo_ckpt.memory.planning.planned_run`); None where skipped.
        estimated_step: ``{"batch", "imgsz", "objects", "device", "amp"}`` of that estimate (objects per image: the
            data's densest, times its augmentation's factors). estimate_skipped: why there is no estimate
            (``estimate=False``, a model the memory model does not cover, ``the estimate failed: ...``), else None.
        plan: the :class:`PlanRecord` of recompute=auto / batch=-1, or None.
        metrics: :func:`task_metrics` names (fractions), of the final validation (``best.pt``'s); ultralytics_metrics:
            Ultralytics' own. best_epoch: the epoch (from 1) whose weights ``best.pt`` holds; None in a report before
            schema 5. class_ap: per-class AP of the task's output in that validation,
            ``{"AP50": {name: AP}, "AP50-95": {...}}`` (:func:`yolo_ckpt.report.compare.class_ap`).
        not_measured: what the run's end did not measure: :data:`FINAL_VALIDATION` (interrupted: ``metrics`` are the
            last epoch's validation, not ``best.pt``'s), :data:`MEMORY_PROBE` (interrupted, or a run whose end
            ``resume`` finished), :data:`STEP_TIMES` (finished by ``resume`` without the exact resume state); empty for
            a run that ended as it should.
        attention: where the attention region ran, ``{"attn_chunk", "modules": [{"layer", "module", "tokens",
            "chunked"}]}`` at the trained imgsz (:func:`yolo_ckpt.memory.attention_shapes.attention_tokens`); None
            where it did not (and before schema 6). :func:`attention_text` says it in one line.
    """

    versions: dict
    task: str
    model: str
    data: str
    recompute: str | None
    recompute_mode: str
    recomputed_layers: list
    recomputed_regions: list
    device: str
    imgsz: int
    batch: int
    batch_at_start: int | None
    amp: bool
    epochs: int
    memory_source: str
    memory_probe_images: int | None = None
    memory_probe_objects: int | None = None
    memory_probe_imgsz: int | None = None
    train_peak_allocated_bytes: int | None = None
    train_peak_reserved_bytes: int | None = None
    val_peak_allocated_bytes: int | None = None
    val_peak_reserved_bytes: int | None = None
    train_step_time_median_s: float | None = None
    train_steps_timed: int = 0
    val_time_s: float | None = None
    estimated_none_peak_bytes: int | None = None
    estimated_all_peak_bytes: int | None = None
    estimated_policy_peak_bytes: int | None = None
    estimated_step: dict | None = None
    estimate_skipped: str | None = None
    plan: PlanRecord | None = None
    metrics: dict = field(default_factory=dict)
    ultralytics_metrics: dict = field(default_factory=dict)
    best_epoch: int | None = None
    class_ap: dict = field(default_factory=dict)
    not_measured: list = field(default_factory=list)
    attention: dict | None = None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        """The JSON object of ``ckpt_report.json`` (``schema_version`` first)."""
        data = dataclasses.asdict(self)
        return {"schema_version": data.pop("schema_version"), **data}

    @classmethod
    def from_dict(cls, data: dict, where="the report") -> RunReport:
        """A record from a ``ckpt_report.json`` object of a schema in :data:`READABLE_SCHEMAS`.

        Raises:
            ConfigError: for what is not a report's JSON object, another schema, keys the schema does not have or
                fields it lacks, naming them and ``where``.
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: not a run report (a JSON {type(data).__name__}, not an object)")
        schema = data.get("schema_version")
        if schema not in READABLE_SCHEMAS:
            raise ConfigError(
                f"{where}: schema_version={schema!r} is not readable by yolo-ckpt {_version()}; readable: "
                f"{', '.join(map(str, READABLE_SCHEMAS))}"
            )
        for f in dataclasses.fields(cls):  # the containers and names compare reads; numbers are read as they are
            kind = {"dict": dict, "list": list, "str": str, "PlanRecord | None": (dict, type(None))}.get(f.type)
            if kind and f.name in data and not isinstance(data[f.name], kind):
                raise ConfigError(f"{where}: {f.name}={data[f.name]!r} is not a run report's {f.name}")
        missing = dataclasses.MISSING
        for record, keys in ((cls, data), *([(PlanRecord, data["plan"])] if data.get("plan") else [])):
            unknown = set(keys) - {f.name for f in dataclasses.fields(record)}
            if unknown:
                raise ConfigError(f"{where}: unknown keys {sorted(unknown)} for schema_version={schema}")
            required = {f.name for f in dataclasses.fields(record) if f.default is missing and f.default_factory is missing}
            if lacks := required - set(keys):
                raise ConfigError(f"{where}: not a complete run report: it lacks {sorted(lacks)} (schema_version={schema})")
        return cls(**{**data, "plan": PlanRecord(**data["plan"]) if data.get("plan") else None})

    def headline(self) -> str:
        """One line a person reads at the end of a run, its sizes in one unit (:func:`one_unit`): first what recompute
        bought, the policy's estimated peak as a ratio of ``none``'s at the step this run trains (its batch and imgsz,
        the planner's objects: the data's densest, which a measured batch need not have; ``all``'s beside them), or why
        there is no estimate; then the training peak and what measured it (for the CPU probe, its batch), a planned
        run's budget and the median step time."""
        peak, plan, step_time = self.train_peak_allocated_bytes, self.plan, self.train_step_time_median_s
        policy, step = self.estimated_policy_peak_bytes, self.estimated_step
        if step is None and plan:  # schema 3: only a planned run estimated, at its planned step
            step = {"batch": plan.batch, "imgsz": plan.imgsz, "objects": (plan.assumed or {}).get("objects")}
            policy = plan.estimated_peak_bytes
        none, every = self.estimated_none_peak_bytes, self.estimated_all_peak_bytes
        figures = [n for n in (peak, policy, none, every, plan.budget_bytes if plan else None) if n is not None]
        size, parts = one_unit(max(figures, default=0)), []
        if none is not None and policy is not None:
            step = step or {}
            objects = f", {step['objects']} objects per image" if step.get("objects") else ""
            also = f"; all ~{size(every)}" if every is not None and self.recompute != "all" else ""
            parts.append(
                f"{policy / none:.2f}x of recompute=none's estimated peak (~{size(policy)} of ~{size(none)}{also}) at batch "
                f"{step.get('batch')}, imgsz {step.get('imgsz')}{objects}{self._unlike(step)}"
            )
        elif self.estimate_skipped:
            parts.append(f"no estimate ({self.estimate_skipped})")
        if peak is None:
            parts.append("training peak not measured" + (" (probe=False)" if self.memory_source == PROBE_SKIPPED else ""))
        else:
            source = {"cuda_allocator": "CUDA allocated", "cpu_probe_live_tensors": "CPU live tensors of one step"}.get(
                self.memory_source, self.memory_source
            )
            if self.memory_probe_images:
                objects = f", {self.memory_probe_objects} objects" if self.memory_probe_objects is not None else ""
                source += f" of {self.memory_probe_images} images{objects} at imgsz {self.memory_probe_imgsz}"
            parts.append(f"training peak {size(peak)} ({source})")
        if plan:
            parts.append(f"planned for memory_budget={size(plan.budget_bytes)}")
        parts.append(f"median step {step_time:.3f} s" if step_time is not None else "step time not measured (too few steps)")
        if self.not_measured:
            parts.append(f"not measured: {', '.join(self.not_measured)}")
        return f"recompute={self.recompute}: " + "; ".join(parts)

    def _unlike(self, step: dict) -> str:
        """Where the estimated step is not the CPU probe's measured one, what differs, said plainly: `` (not the
        measured step: 2 images at imgsz 640)``, or for the objects alone `` (the data's densest image x its
        augmentation; the measured step had 293 per image)``; empty on CUDA (its peak is of every step: the densest
        counts) and where they agree."""
        images, imgsz, objects = self.memory_probe_images, self.memory_probe_imgsz, self.memory_probe_objects
        if not images:
            return ""
        if (images, imgsz) != (step.get("batch"), step.get("imgsz")):
            return f" (not the measured step: {images} images at imgsz {imgsz})"
        if objects is not None and step.get("objects") and round(objects / images) != step["objects"]:
            return f" (the data's densest image x its augmentation; the measured step had {objects / images:.0f} per image)"
        return ""

    def write(self, run_dir) -> Path:
        """Write ``<run_dir>/ckpt_report.json``; returns its path."""
        path = Path(run_dir) / REPORT_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path


def _version() -> str:
    from .. import __version__

    return __version__


def attention_text(attention: dict) -> str:
    """One line of the attention region's chunking (a :class:`RunReport`'s ``attention``, ``profile``'s): its
    ``attn_chunk`` and, per layer, its attention modules' tokens N and whether they ran in chunks or stock (N at most
    ``attn_chunk``): ``attention region, attn_chunk=256: layer 10 1 x Attention of 400 tokens, chunked``."""
    counts = Counter((m["layer"], m["module"], m["tokens"], m["chunked"]) for m in attention["modules"])
    parts = [
        f"layer {layer} {n} x {module} of {tokens} tokens{' per area' if module == 'AAttn' else ''}, "
        + ("chunked" if chunked else "stock (at most attn_chunk tokens)")
        for (layer, module, tokens, chunked), n in counts.items()
    ]
    return f"attention region, attn_chunk={attention['attn_chunk']}: " + ("; ".join(parts) or "no attention layers")


def task_metrics(metrics: dict) -> dict:
    """Ultralytics' metric names -> ``box_mAP50``, ``box_mAP50-95``, ``mask_mAP50-95``, ``pose_...``, ``top1_accuracy``."""
    out = {}
    for key, value in (metrics or {}).items():
        if not key.startswith("metrics/"):
            continue
        name = key[len("metrics/") :]
        for suffix, kind in _SUFFIX.items():
            if name.endswith(suffix):
                out[f"{kind}_{name[: -len(suffix)]}"] = float(value)
                break
        else:
            out[{"accuracy_top1": "top1_accuracy", "accuracy_top5": "top5_accuracy"}.get(name, name)] = float(value)
    return out


def probe_counts(batch: dict | None) -> dict:
    """What the CPU memory probe measured: ``memory_probe_images``, ``memory_probe_objects`` (labelled objects in the
    batch; None for classify) and ``memory_probe_imgsz`` of the kept training batch (all None without one)."""
    if batch is None:
        return dict.fromkeys(("memory_probe_images", "memory_probe_objects", "memory_probe_imgsz"))
    return {
        "memory_probe_images": len(batch["img"]),
        "memory_probe_objects": len(batch["bboxes"]) if "bboxes" in batch else None,
        "memory_probe_imgsz": batch["img"].shape[-1],
    }


def load_report(run_dir) -> RunReport:
    """The :class:`RunReport` in a run directory's ``ckpt_report.json`` (schemas in :data:`READABLE_SCHEMAS`).

    Raises:
        FileNotFoundError: naming the directory, when it does not exist, or holds no report (not a yolo-ckpt run, or
            unfinished).
        ConfigError: for a report of another schema or not a report's object (:meth:`RunReport.from_dict`), or one that
            is not JSON or not UTF-8 text (a truncated, edited or damaged file), naming the file.
    """
    path = Path(run_dir) / REPORT_NAME
    if not Path(run_dir).is_dir():
        raise MissingFileError(f"{run_dir} does not exist: give run directories of finished yolo-ckpt runs")
    if not path.is_file():
        raise MissingFileError(f"{run_dir} has no {REPORT_NAME}: give run directories of finished yolo-ckpt runs")
    try:
        record = json.loads(path.read_bytes().decode())
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path} is not a readable run report ({e.msg}: line {e.lineno} column {e.colno}): the file is truncated or was edited"
        ) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path} is not a readable run report (not UTF-8 text: byte {e.start}): the file is damaged") from None
    return RunReport.from_dict(record, path)
