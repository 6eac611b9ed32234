"""The run report ``ckpt_report.json``: policy, settings, peak memory, step time and final metrics of a run.

Key names carry their units (``_bytes``, ``_s``). The memory and benchmark tools read this file; bump
``SCHEMA_VERSION`` when a key changes meaning (2: the CPU probe measures the first full-size batch with the
optimizer step and says which batch it measured; ``batch`` is the batch that trained, ``batch_at_start`` the one
training started with; plans carry their headroom and what the estimate assumed).
"""

from __future__ import annotations

import contextlib
import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import ultralytics

if TYPE_CHECKING:  # annotations only: pandas is imported where a table is built
    import pandas

REPORT_NAME = "ckpt_report.json"
SCHEMA_VERSION = 2
WARMUP_STEPS = 3  # steps left out of the median step time: first-call allocations, lazy init
_SUFFIX = {"(B)": "box", "(M)": "mask", "(P)": "pose"}


@contextlib.contextmanager
def cuda_peak(trainer, section: str):
    """Count the CUDA allocator's peak inside the block as ``section`` ("val") and the peak before it as "train"."""
    if trainer.device.type != "cuda":
        yield
        return
    _bank_cuda_peak(trainer, "train")
    try:
        yield
    finally:
        _bank_cuda_peak(trainer, section)


def _bank_cuda_peak(trainer, section: str) -> None:
    peaks = trainer.ckpt_stats[f"{section}_peak"]
    peaks["allocated"] = max(peaks.get("allocated", 0), torch.cuda.max_memory_allocated(trainer.device))
    peaks["reserved"] = max(peaks.get("reserved", 0), torch.cuda.max_memory_reserved(trainer.device))
    torch.cuda.reset_peak_memory_stats(trainer.device)


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


def build_run_report(trainer) -> dict:
    """The report of a finished run of a Checkpoint*Trainer (see the module docstring for the keys)."""
    from . import __version__

    args = trainer.args
    stats = trainer.ckpt_stats
    steps = stats["step_s"][WARMUP_STEPS:]
    if trainer.device.type == "cuda":
        _bank_cuda_peak(trainer, "train")
        source = "cuda_allocator"
        train, val = stats["train_peak"], stats["val_peak"]
    else:
        source = "cpu_probe_live_tensors"
        t, v = trainer.memory_probes() if stats["probe_batch"] is not None else (None, None)
        train, val = {"allocated": t}, {"allocated": v}
    policy = trainer.policy
    return {
        "schema_version": SCHEMA_VERSION,
        "versions": {"yolo_ckpt": __version__, "ultralytics": ultralytics.__version__, "torch": torch.__version__},
        "task": args.task,
        "model": str(args.model),
        "data": str(args.data),
        "recompute": policy.spec if policy else None,
        "recompute_mode": args.recompute_mode,
        "recomputed_layers": policy.layers() if policy else [],
        "recomputed_regions": policy.regions() if policy else [],
        "device": str(trainer.device),
        "imgsz": args.imgsz,
        "batch": trainer.batch_size,  # after Ultralytics' halvings on an out-of-memory error in the first epoch
        "batch_at_start": stats["batch_at_start"],
        "amp": bool(trainer.amp),
        "epochs": trainer.epoch + 1,
        "memory_source": source,
        **probe_counts(stats["probe_batch"]),
        "train_peak_allocated_bytes": train.get("allocated"),
        "train_peak_reserved_bytes": train.get("reserved"),
        "val_peak_allocated_bytes": val.get("allocated"),
        "val_peak_reserved_bytes": val.get("reserved"),
        "train_step_time_median_s": statistics.median(steps) if steps else None,
        "train_steps_timed": len(steps),
        "plan": None if trainer.plan is None else {
            "recompute": trainer.plan.recompute,
            "budget_bytes": trainer.plan.budget_bytes,
            "estimated_peak_bytes": trainer.plan.estimated_peak_bytes,
            "batch": trainer.plan.batch,
            "imgsz": trainer.plan.imgsz,
            "recompute_flops": trainer.plan.recompute_flops,
            "recompute_cost_fraction": trainer.plan.recompute_cost,
            "headroom_bytes": trainer.plan.headroom_bytes,
            "margin_bytes": trainer.plan.margin_bytes,
            "assumed": trainer.run_spec.to_dict() if trainer.run_spec else None,
        },
        "metrics": task_metrics(trainer.metrics),
        "ultralytics_metrics": {k: float(v) for k, v in (trainer.metrics or {}).items()},
    }


def write_run_report(trainer) -> dict:
    """Write :func:`build_run_report` to ``<save_dir>/ckpt_report.json`` and return it."""
    data = build_run_report(trainer)
    (trainer.save_dir / REPORT_NAME).write_text(json.dumps(data, indent=2))
    return data


def load_report(run_dir) -> dict:
    """The ``ckpt_report.json`` of a run directory.

    Raises:
        FileNotFoundError: naming the directory, when it holds no report (not a yolo-ckpt run, or unfinished).
    """
    path = Path(run_dir) / REPORT_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no {REPORT_NAME}: give run directories of finished yolo-ckpt runs")
    return json.loads(path.read_text())


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


def compare_runs(run_dirs) -> pandas.DataFrame:
    """Delta table of runs against the first (the baseline): training peak memory (MiB, % change), median step
    time (s, ratio), mAP50 and mAP50-95 of the task's output (boxes, masks or keypoints) or classify's top-1/top-5
    accuracy (change in points), epochs.

    Raises:
        FileNotFoundError: for a directory without a report. ValueError: for fewer than two runs.
    """
    import pandas as pd

    if len(run_dirs) < 2:
        raise ValueError(f"compare needs at least two run directories, got {len(run_dirs)}")
    rows = []
    for run_dir in run_dirs:
        r = load_report(run_dir)
        rows.append({
            "run": str(run_dir),
            "task": r["task"],
            "recompute": r["recompute"],
            "mode": r.get("recompute_mode", "full"),
            "imgsz": r["imgsz"],
            "batch": r["batch"],
            "epochs": r["epochs"],
            "peak_MiB": (r["train_peak_allocated_bytes"] or float("nan")) / 2**20,
            "step_time_s": r["train_step_time_median_s"] if r["train_step_time_median_s"] is not None else float("nan"),
            **primary_metrics(r["task"], r["metrics"]),
        })
    table = pd.DataFrame(rows)
    return add_deltas(table, table.iloc[[0] * len(table)])
