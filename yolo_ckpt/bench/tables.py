"""A matrix's results against each cell's baseline: the delta table (pandas) and its Markdown (``results.md``)."""

from __future__ import annotations

import ast
import json

import pandas as pd

from yolo_ckpt.config import Budget
from yolo_ckpt.report.compare import add_deltas, markdown_table

from .cells import cell_budget, cell_id

COLUMNS = {  # Markdown columns per kind: results column -> header
    "step": {
        "model": "model", "imgsz_used": "imgsz", "batch_used": "batch", "amp": "amp", "policy": "recompute",
        "layers": "layers", "recomputations_per_step": "recomputed per step",
        "attention_chunks_per_step": "attention chunks", "loss_images_recomputed_per_step": "loss images recomputed",
        "peak_MiB": "peak MiB", "memory_change_pct": "memory", "step_time_s": "step s", "time_ratio": "time vs none",
        "time_interval": "pair ratios", "flop_bound": "FLOP bound", "same_gradients_label": "same gradients", "status": "status",
    },
    "train": {
        "study": "study", "dataset": "dataset", "model": "model", "imgsz_used": "imgsz", "tiles_label": "tiles",
        "train_images": "train images", "val_imgsz": "val imgsz", "batch_used": "batch",
        "policy": "recompute", "epochs_run": "epochs", "best_epoch": "best epoch", "optimizer_steps": "steps", "pixels_M": "Mpx",
        "peak_MiB": "peak MiB", "memory_change_pct": "memory",
        "fits_budget": "fits budget", "step_time_s": "step s", "time_ratio": "time vs base",
        "wall_s": "wall s", "train_s": "train s", "val_s": "val s", "mAP50": "mAP50", "mAP50-95": "mAP50-95",
        "mAP50-95_change_pts": "mAP50-95 pts", "last_mAP50": "last mAP50", "last_mAP50-95": "last mAP50-95",
        "box_mAP50": "box mAP50", "box_mAP50-95": "box mAP50-95", "last_box_mAP50": "last box mAP50",
        "last_box_mAP50-95": "last box mAP50-95", "class_AP50-95_label": "AP50-95 per class",
        "top1": "top-1", "same_weights": "same weights", "status": "status",
    },
}


STEP_MEMORY = "peak bytes a CUDA allocator would count (live tensors on the CPU)"
TRAIN_MEMORY = "the run report (CUDA allocator peak; CPU: live-tensor probe of one step)"


def tiles_setting(row) -> dict | None:
    """A results row's ``tiles`` setting as its matrix gave it (``{"size": px or "fit", "overlap": px}``); None for a
    cell trained on whole images (the csv leaves the column empty)."""
    value = row.get("tiles")
    return ast.literal_eval(value) if isinstance(value, str) and value.strip() not in {"", "nan", "None"} else None


def tiles_label(row) -> str:
    """A tiles cell's tiles as the table shows them, ``352 px, overlap 32`` (the size trained: ``imgsz_used``); a hybrid
    cell's with the epoch its full images start at, ``352 px, overlap 32, full from epoch 41`` (``tile_imgsz``,
    ``switch_epoch``); the size as the matrix gave it where the cell failed; '' for a cell trained on whole images."""
    tiles = tiles_setting(row)
    if not tiles:
        return ""
    hybrid = pd.notna(row.get("tile_imgsz", float("nan")))
    size = row.get("tile_imgsz" if hybrid else "imgsz_used", float("nan"))
    size = f"{size:.0f} px" if pd.notna(size) else f"size {tiles['size']}"
    return f"{size}, overlap {tiles['overlap']}" + (f", full from epoch {row['switch_epoch']:.0f}" if hybrid else "")


def class_ap_label(value) -> str:
    """A row's per-class AP (``class_AP50-95``: JSON ``{name: AP}``) as the table shows it, ``a 0.412, b 0.300``; ''
    where the row has none (a failed cell, a row from before the column)."""
    classes = json.loads(value) if isinstance(value, str) and value.strip() else {}
    return ", ".join(f"{name} {ap:.3f}" for name, ap in classes.items())


def recompute_label(row) -> str:
    """A row's ``recompute=`` and its mode where not ``full`` (a row without the column is ``full``): ``backbone``,
    ``all:selective``."""
    mode = row.get("recompute_mode", "full")
    return str(row["recompute"]) + (f":{mode}" if mode != "full" else "")


def arm_label(row) -> str:
    """A train cell as an arm of an equal-memory study names it: :func:`recompute_label`, the imgsz it trained at, and
    its tiles: ``auto @640``, ``none @352 tiles (352 px, overlap 32)``."""
    return f"{recompute_label(row)} @{row['imgsz_used']:.0f}" + (f" tiles ({tiles_label(row)})" if tiles_setting(row) else "")


def policy_label(row) -> str:
    """:func:`recompute_label`; for auto the planned layers too: ``auto (0-4,9)``."""
    label = recompute_label(row)
    recomputed = row.get("recomputed")
    if str(row["recompute"]) == "auto" and isinstance(recomputed, str) and recomputed:
        label += f" ({recomputed})"
    return label


def delta_table(matrix, results: pd.DataFrame) -> pd.DataFrame:
    """The matrix's cells (grouped by baseline, then file order) with their results and deltas against their baseline row:
    ``memory_change_pct``, ``time_ratio`` (step cells: measured in one process, interleaved), accuracy points,
    ``same_weights`` (train: SHA-256 of the final weights equal to the baseline's), ``fits_budget``
    (peak <= ``memory_budget``, where one is given in bytes) and, for step rows that have them, ``time_interval`` (the
    smallest and largest ratio of one timed pair, ``1.21-1.30``) and ``same_gradients_label`` (yes/no)."""
    by_id = {r["cell"]: r for r in results.to_dict("records")}
    rows, bases = [], []
    group = {id(c): matrix.cells.index(matrix.baseline_of(c)) for c in matrix.cells}
    for cell in sorted(matrix.cells, key=lambda c: group[id(c)]):  # each baseline with its cells, file order
        row = by_id.get(cell_id(cell))
        base = by_id.get(cell_id(matrix.baseline_of(cell)))
        if row is None:
            continue
        rows.append(row)
        bases.append(base if base is not None and base.get("status") == "ok" else {k: float("nan") for k in row})
    if not rows:
        return pd.DataFrame()
    table, base = pd.DataFrame(rows), pd.DataFrame(bases).reindex(columns=pd.DataFrame(rows).columns)
    for column in ("peak_MiB", "step_time_s", "mAP50", "mAP50-95", "top1", "top5"):
        for frame in (table, base):
            if column in frame:
                frame[column] = pd.to_numeric(frame[column], errors="coerce")
    measured = table.get("time_ratio")
    table = add_deltas(table, base)
    if matrix.kind == "step" and measured is not None:
        table["time_ratio"] = pd.to_numeric(measured, errors="coerce")
    table["policy"] = table.apply(policy_label, axis=1)
    if "tiles" in table:
        table["tiles_label"] = table.apply(tiles_label, axis=1)
    if "class_AP50-95" in table:
        table["class_AP50-95_label"] = table["class_AP50-95"].map(class_ap_label)
    if "weights_sha256" in table:
        table["same_weights"] = [
            ("yes" if a == b else "no") if isinstance(a, str) and isinstance(b, str) else ""
            for a, b in zip(table["weights_sha256"], base["weights_sha256"])
        ]
    if "time_ratio_low" in table:
        bounds = zip(table["time_ratio_low"], table["time_ratio_high"])
        table["time_interval"] = [f"{lo:.2f}-{hi:.2f}" if pd.notna(lo) and pd.notna(hi) else "" for lo, hi in bounds]
    if "same_gradients" in table:  # the csv reads True/False, or NaN where the cell's size differed from its baseline's
        labels = {True: "yes", False: "no", "True": "yes", "False": "no"}
        table["same_gradients_label"] = [labels.get(v, "") for v in table["same_gradients"]]
    table["fits_budget"] = [_fits(b, p) for b, p in zip(table["memory_budget"], table.get("peak_MiB", [float("nan")] * len(table)))]
    return table


def _fits(budget, peak_mib) -> str:
    """"yes"/"no" for a budget in bytes with a unit; "" for none, a factor (0.6x) or a CUDA fraction (0.6)."""
    parsed = cell_budget(budget) if isinstance(budget, str) else None  # results.csv reads an unset budget as NaN
    if not isinstance(parsed, Budget) or parsed.is_fraction or pd.isna(peak_mib):
        return ""
    return "yes" if peak_mib * 2**20 <= parsed.bytes(None) else "no"


def machine_groups(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """``table``'s rows grouped by the machine and versions they were measured on (columns ``machine``,
    ``versions``, ``date``: :func:`.results_io.measured_on`), in the order groups first appear, each with its line:
    ``AMD EPYC, 2 cores, ...; yolo_ckpt 0.1.0, ...; 2026-11-30`` (the first and last date where they differ).
    Rows without them are one group, ``not recorded``."""
    def key(row) -> tuple:
        return tuple(row.get(c) if isinstance(row.get(c), str) else None for c in ("machine", "versions"))

    keys = [key(row) for _, row in table.iterrows()]
    groups = []
    for k in dict.fromkeys(keys):
        rows = table[[x == k for x in keys]]
        dates = sorted({d for d in rows.get("date", []) if isinstance(d, str)})
        when = (dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}") if dates else "date not recorded"
        groups.append((f"{k[0]}; {k[1]}; {when}" if k[0] else "not recorded", rows))
    return groups


def markdown(matrix, table: pd.DataFrame, record: dict) -> str:
    """``results.md``: what was run, the delta table per machine it was measured on (:func:`machine_groups`), failed
    cells with their reasons, the settings and the command of the last run (``record``: :func:`.results_io.provenance`)."""
    lines = [f"# {matrix.name}", "", matrix.description.strip(), ""] if matrix.description else [f"# {matrix.name}", ""]
    for i, (measured, rows) in enumerate(machine_groups(table)):
        lines += ([""] if i else []) + [f"Measured on {measured}:", "", *markdown_table(rows, COLUMNS[matrix.kind])]
    if "reason" in table:
        failed = table[table["status"] == "failed"]
        lines += ["", "Failed cells:"] + [f"- `{r['cell']}`: {r['reason']}" for _, r in failed.iterrows()] if len(failed) else []
    settings = ", ".join(f"{k}={v}" for k, v in matrix.settings.items() if v is not None)
    lines += [
        "",
        f"Settings: {settings}. Memory: {STEP_MEMORY if matrix.kind == 'step' else TRAIN_MEMORY}.",
        f"Command of the last run: `{record['command']}`",
        "",
    ]
    return "\n".join(lines)
