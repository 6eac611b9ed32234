"""The run report ``ckpt_report.json``: one :class:`RunReport` record per run (policy, settings, peak memory, step time,
final metrics), written by the trainer (:meth:`yolo_ckpt.trainer.CheckpointTrainerMixin.run_report`) and read back
by ``yolo-ckpt compare`` and the bench's train cells.

Field names carry their units (``_bytes``, ``_s``). Bump :data:`SCHEMA_VERSION` when a field changes meaning
(2: the CPU probe measures the first full-size batch with the optimizer step and says which batch it measured;
``batch`` is the batch that trained, ``batch_at_start`` the one training started with; plans carry their headroom
and what the estimate assumed. 3: ``estimated_none_peak_bytes``. 4: every run of a planned task estimates its step
at set-up: ``estimated_step``, ``estimated_all_peak_bytes``, ``estimated_policy_peak_bytes``, ``estimate_skipped``).
:func:`load_report` reads schemas 2 to 4.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ConfigError, MissingFileError

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    import pandas

REPORT_NAME = "ckpt_report.json"
SCHEMA_VERSION = 4
READABLE_SCHEMAS = (2, 3, 4)  # 3 and 4 only added fields, which an older file lacks (None)
WARMUP_STEPS = 3  # steps left out of the median step time: first-call allocations, lazy init
_SUFFIX = {"(B)": "box", "(M)": "mask", "(P)": "pose"}


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
        """The record of a :class:`yolo_ckpt.memory.plan.Plan` and the assumptions of its estimate."""
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
            recomputed_layers: ``{"index", "type"}`` per layer; recomputed_regions: ``head``, ``loss``.
        device, imgsz (px), batch (images, after Ultralytics' out-of-memory halvings), batch_at_start, amp, epochs.
        memory_source: ``cuda_allocator`` or ``cpu_probe_live_tensors`` (a live-tensor probe of one step at the end).
        memory_probe_images, memory_probe_objects, memory_probe_imgsz: the batch the CPU probe measured (None on CUDA).
        train_peak_allocated_bytes, train_peak_reserved_bytes, val_peak_allocated_bytes, val_peak_reserved_bytes:
            peak memory (reserved: CUDA only; None where not measured).
        train_step_time_median_s: median training step (after :data:`WARMUP_STEPS`), train_steps_timed: steps in it.
        estimated_none_peak_bytes, estimated_all_peak_bytes, estimated_policy_peak_bytes: the memory model's peak of
            this run's step (:attr:`estimated_step`) for ``recompute=none``, ``all`` and the policy that trained,
            estimated at set-up for this run's spec (:func:`yolo_ckpt.memory.planned_run.planned_run`); None where skipped.
        estimated_step: ``{"batch", "imgsz", "objects", "device", "amp"}`` of that estimate (objects per image: the
            data's densest, times its augmentation's factors). estimate_skipped: why there is no estimate
            (``estimate=False``, a model the memory model does not cover), else None.
        plan: the :class:`PlanRecord` of recompute=auto / batch=-1, or None.
        metrics: :func:`task_metrics` names (fractions); ultralytics_metrics: Ultralytics' own.
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
    estimated_none_peak_bytes: int | None = None
    estimated_all_peak_bytes: int | None = None
    estimated_policy_peak_bytes: int | None = None
    estimated_step: dict | None = None
    estimate_skipped: str | None = None
    plan: PlanRecord | None = None
    metrics: dict = field(default_factory=dict)
    ultralytics_metrics: dict = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        """The JSON object of ``ckpt_report.json`` (``schema_version`` first)."""
        data = dataclasses.asdict(self)
        return {"schema_version": data.pop("schema_version"), **data}

    @classmethod
    def from_dict(cls, data: dict, where="the report") -> RunReport:
        """A record from a ``ckpt_report.json`` object of a schema in :data:`READABLE_SCHEMAS`.

        Raises:
            ValueError: for another schema, or keys the schema does not have, naming them and ``where``.
        """
        schema = data.get("schema_version")
        if schema not in READABLE_SCHEMAS:
            raise ConfigError(f"{where}: schema_version={schema!r} is not readable by yolo-ckpt {_version()}; readable: {', '.join(map(str, READABLE_SCHEMAS))}")
        for record, keys in ((cls, data), (PlanRecord, data.get("plan") or {})):
            unknown = set(keys) - {f.name for f in dataclasses.fields(record)}
            if unknown:
                raise ConfigError(f"{where}: unknown keys {sorted(unknown)} for schema_version={schema}")
        return cls(**{**data, "plan": PlanRecord(**data["plan"]) if data.get("plan") else None})

    def headline(self) -> str:
        """One line a person reads at the end of a run: the training peak in MiB and GiB and what measured it (for the
        CPU probe, its batch); what recompute bought: the estimated peaks of this policy, ``none`` and ``all`` at the
        step this run trains (its batch and imgsz, the planner's objects: the data's densest, which a measured batch
        need not have), and for a planned run its budget; and the median step time."""
        peak = self.train_peak_allocated_bytes
        if peak is None:
            text = "training peak not measured"
        else:
            source = {"cuda_allocator": "CUDA allocated", "cpu_probe_live_tensors": "CPU live tensors of one step"}.get(self.memory_source, self.memory_source)
            if self.memory_probe_images:
                objects = f", {self.memory_probe_objects} objects" if self.memory_probe_objects is not None else ""
                source += f" of {self.memory_probe_images} images{objects} at imgsz {self.memory_probe_imgsz}"
            text = f"training peak {peak / 2**20:.1f} MiB ({peak / 2**30:.2f} GiB, {source})"
            text += self._estimates()
        step = self.train_step_time_median_s
        text += f"; median step {step:.3f} s" if step is not None else "; step time not measured (too few steps)"
        return f"recompute={self.recompute}: {text}"

    def _estimates(self) -> str:
        """The headline's estimates: ``; estimated at batch 16, imgsz 640, 80 objects per image: this policy ~X MiB,
        none ~Y MiB, all ~Z MiB``, the plan's budget where it planned, or why there is none."""
        if self.estimated_none_peak_bytes is None:
            return f"; no estimate ({self.estimate_skipped})" if self.estimate_skipped else ""
        plan, mib = self.plan, lambda n: f"~{n / 2**20:.0f} MiB"
        step, policy = self.estimated_step, self.estimated_policy_peak_bytes
        if step is None and plan:  # schema 3: only a planned run estimated, at its planned step
            step, policy = {"batch": plan.batch, "imgsz": plan.imgsz, "objects": (plan.assumed or {}).get("objects")}, plan.estimated_peak_bytes
        step = step or {}
        objects = f", {step['objects']} objects per image" if step.get("objects") else ""
        where = f"batch {step.get('batch')}, imgsz {step.get('imgsz')}{objects}"
        peaks = [("this policy", policy), ("none", self.estimated_none_peak_bytes), ("all", self.estimated_all_peak_bytes)]
        text = f"; estimated at {where}: " + ", ".join(f"{name} {mib(n)}" for name, n in peaks if n is not None)
        if plan:
            text += f" (planned for memory_budget={plan.budget_bytes / 2**20:.0f} MiB)"
        return text

    def write(self, run_dir) -> Path:
        """Write ``<run_dir>/ckpt_report.json``; returns its path."""
        path = Path(run_dir) / REPORT_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path


def _version() -> str:
    from . import __version__

    return __version__


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
        FileNotFoundError: naming the directory, when it holds no report (not a yolo-ckpt run, or unfinished).
        ValueError: for a report of another schema (:meth:`RunReport.from_dict`), or one that is not JSON (a
            truncated or edited file), naming the file.
    """
    path = Path(run_dir) / REPORT_NAME
    if not path.is_file():
        raise MissingFileError(f"{run_dir} has no {REPORT_NAME}: give run directories of finished yolo-ckpt runs")
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not a readable run report ({e.msg}: line {e.lineno} column {e.colno}): the file is truncated or was edited") from None
    return RunReport.from_dict(record, path)


PRIMARY_KIND = {"detect": "box", "obb": "box", "segment": "mask", "pose": "pose"}


def primary_metrics(task: str, metrics: dict) -> dict:
    """The headline accuracy of a run as fractions in [0, 1]: ``mAP50`` and ``mAP50-95`` of the task's own output
    (boxes for detect/obb, masks for segment, keypoints for pose; NaN for classify) and ``top1``/``top5`` accuracy
    (classify; NaN otherwise). ``metrics``: :func:`task_metrics` names."""
    nan = float("nan")
    kind = PRIMARY_KIND.get(task)
    return {
        "mAP50": metrics.get(f"{kind}_mAP50", nan),
        "mAP50-95": metrics.get(f"{kind}_mAP50-95", nan),
        "top1": metrics.get("top1_accuracy", nan),
        "top5": metrics.get("top5_accuracy", nan),
    }


def add_deltas(table, base) -> pandas.DataFrame:
    """``table`` with delta columns against ``base`` (a frame of the same length: each row's baseline):
    ``memory_change_pct`` (peak MiB, %), ``time_ratio`` (step time), ``<metric>_change_pts`` (accuracy points,
    100 x the fraction's change) for mAP50, mAP50-95, top1 and top5. Columns absent from ``table`` are skipped."""
    table = table.copy()
    base = base.reset_index(drop=True).set_axis(table.index)
    if "peak_MiB" in table:
        table["memory_change_pct"] = 100 * (table["peak_MiB"] / base["peak_MiB"] - 1)
    if "step_time_s" in table:
        table["time_ratio"] = table["step_time_s"] / base["step_time_s"]
    for metric in ("mAP50", "mAP50-95", "top1", "top5"):
        if metric in table:
            table[f"{metric}_change_pts"] = 100 * (table[metric] - base[metric])
    return table


COMPARE_COLUMNS = {  # compare.csv column -> the header a person reads in compare.md
    "run": "run", "task": "task", "data": "dataset", "recompute": "recompute", "mode": "mode", "imgsz": "imgsz", "batch": "batch",
    "epochs": "epochs", "peak_MiB": "peak MiB", "peak_GiB": "peak GiB", "memory_change_pct": "memory",
    "step_time_s": "step s", "time_ratio": "time", "mAP50": "mAP50", "mAP50_change_pts": "mAP50 pts",
    "mAP50-95": "mAP50-95", "mAP50-95_change_pts": "mAP50-95 pts", "top1": "top-1", "top1_change_pts": "top-1 pts",
    "top5": "top-5", "top5_change_pts": "top-5 pts",
}


def format_value(value, column: str) -> str:
    """A table cell as a person reads it: ``""`` for a missing number, ``-42.0%`` for ``memory_change_pct``,
    ``+1.5`` for accuracy points (``*_change_pts``), ``0.87x`` for ratios (``time_ratio``, ``flop_bound``), 3
    decimals for accuracy fractions, 2 for GiB, 3 significant digits for seconds, whole MiB otherwise."""
    import pandas as pd

    if not isinstance(value, float):
        return str(value)
    if pd.isna(value):
        return ""
    if column == "memory_change_pct":
        return f"{value:+.1f}%"
    if column.endswith("_pts"):
        return f"{value:+.1f}"
    if column in {"time_ratio", "flop_bound"}:
        return f"{value:.2f}x"
    if column in {"mAP50", "mAP50-95", "top1", "top5"}:
        return f"{value:.3f}"
    if column.endswith("_GiB"):
        return f"{value:.2f}"
    return f"{value:.3g}" if column.endswith("_s") else f"{value:.0f}"


def markdown_table(table, columns: dict) -> list[str]:
    """The Markdown lines of ``table``'s ``columns`` (column -> header) that it has, cells by :func:`format_value`."""
    shown = {k: v for k, v in columns.items() if k in table}
    lines = ["| " + " | ".join(shown.values()) + " |", "|" + "---|" * len(shown)]
    return lines + ["| " + " | ".join(format_value(row[c], c) for c in shown) + " |" for _, row in table.iterrows()]


def compare_runs(run_dirs) -> pandas.DataFrame:
    """Delta table of runs against the first (the baseline), with each run's task, data and imgsz: training peak memory (MiB and GiB, % change), median
    step time (s, ratio), mAP50 and mAP50-95 of the task's output (boxes, masks or keypoints) or classify's
    top-1/top-5 accuracy (change in points), epochs. Metric columns no run has (a task's absent metrics, runs
    without validation) are left out.

    Raises:
        FileNotFoundError: for a directory without a report. ValueError: for fewer than two runs.
    """
    import pandas as pd

    if len(run_dirs) < 2:
        raise ConfigError(f"compare needs at least two run directories, got {len(run_dirs)}")
    rows = []
    for run_dir in run_dirs:
        r = load_report(run_dir)
        peak = r.train_peak_allocated_bytes if r.train_peak_allocated_bytes is not None else float("nan")
        rows.append({
            "run": str(run_dir),
            "task": r.task,
            "data": r.data,
            "recompute": r.recompute,
            "mode": r.recompute_mode,
            "imgsz": r.imgsz,
            "batch": r.batch,
            "epochs": r.epochs,
            "peak_MiB": peak / 2**20,
            "peak_GiB": peak / 2**30,
            "step_time_s": r.train_step_time_median_s if r.train_step_time_median_s is not None else float("nan"),
            **primary_metrics(r.task, r.metrics),
        })
    table = pd.DataFrame(rows)
    table = add_deltas(table, table.iloc[[0] * len(table)])
    metrics = [c for c in table if c.startswith(("mAP50", "top1", "top5"))]
    return table.drop(columns=[c for c in metrics if table[c].isna().all()])


def compare_warning(table) -> str | None:
    """The warning that the compared runs trained different data or tasks (their deltas then mix the policy with
    the training), naming each differing key's values in run order; None when they agree."""
    differ = [f"{key} ({', '.join(map(str, table[key].unique()))})" for key in ("data", "task") if table[key].nunique(dropna=False) > 1]
    return f"Warning: the runs differ in {' and '.join(differ)}: their deltas are not the policy's alone." if differ else None


def compare_markdown(table) -> str:
    """``compare.md``: a line naming the baseline (the first run) and what the deltas mean, the
    :func:`compare_warning` where the runs differ in data or task, then the table (dataset and imgsz always shown)."""
    base = table.iloc[0]
    header = (
        f"Baseline: {base['run']} (recompute={base['recompute']}). memory: training peak change against it; "
        "time: step time ratio; pts: accuracy change in points."
    )
    warning = compare_warning(table)
    return "\n".join([header, *([warning] if warning else []), "", *markdown_table(table, COMPARE_COLUMNS)])
