"""``yolo-ckpt compare``: runs' reports (:func:`yolo_ckpt.report.record.load_report`) side by side, with deltas
against the first run (:func:`compare_runs`, :func:`compare_markdown`), and the delta and Markdown helpers the bench's
tables share (:func:`add_deltas`, :func:`markdown_table`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError
from .record import load_report

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    import pandas

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


def class_ap(task: str, metrics) -> dict:
    """Per-class AP of the task's own output (boxes for detect/obb, masks for segment, keypoints for pose) from an
    Ultralytics validation's metrics (``validator.metrics`` or ``model.val()``'s result: ``DetMetrics``,
    ``SegmentMetrics``, ``PoseMetrics``, ``OBBMetrics``): ``{"AP50": {class name: AP50}, "AP50-95": {...}}``, fractions,
    for the classes the val set holds (Ultralytics' ``ap_class_index``); {} for classify or a validation without any."""
    attribute = {"box": "box", "mask": "seg", "pose": "pose"}.get(PRIMARY_KIND.get(task))
    metric = getattr(metrics, attribute, None) if attribute else None
    if metric is None or not len(metric.all_ap):
        return {}
    names = [str(metrics.names[int(i)]) for i in metrics.ap_class_index]
    return {"AP50": dict(zip(names, map(float, metric.ap50))), "AP50-95": dict(zip(names, map(float, metric.ap)))}


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
    decimals for accuracy fractions (``top1``, ``top5``, ``*mAP50``, ``*mAP50-95``), 2 for GiB, 3 significant digits for
    seconds, whole numbers otherwise (MiB, steps, megapixels)."""
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
    if column in {"top1", "top5"} or column.endswith(("mAP50", "mAP50-95")):
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
    """Delta table of runs against the first (the baseline), with each run's task, data and imgsz: training peak memory
    (MiB and GiB, % change), median
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
