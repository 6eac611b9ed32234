"""A matrix's PNG plots (matplotlib): peak memory against step-time ratio per policy; mAP50-95 against imgsz; mAP50
and mAP50-95 against peak memory per cell; the training curves of train cells (with their ``curves.csv``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .tables import arm_label, tiles_setting


def write_plots(matrix, table: pd.DataFrame, out: Path) -> list[Path]:
    """Write ``memory_vs_time.png`` (every kind) and, for train matrices, ``map_vs_imgsz.png``,
    ``map_vs_memory.png`` (:func:`map_memory_plot`) and ``curves.png`` (validation mAP50 per epoch of each cell, from
    its run's Ultralytics ``results.csv``, also written with mAP50-95 and the seconds since the run began, over its
    resumes (:func:`training_seconds`), as ``curves.csv``; a tiles cell's curve is its validation on tiles, its
    full-image result a star: :func:`curves_plot`) into ``out``.

    Returns:
        The files written (none when no cell has finished).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    ok = table[table["status"] == "ok"] if len(table) else table
    if not len(ok):
        return []
    written = []
    fig, ax = plt.subplots(figsize=(7, 5))
    for policy, group in ok.groupby("policy"):
        ax.scatter(group["time_ratio"], 1 + group["memory_change_pct"] / 100, label=policy)
        for _, row in group.iterrows():
            where = row["dataset"] if matrix.kind == "train" else Path(str(row["model"])).stem
            ax.annotate(f"{where}@{row['imgsz_used']}", (row["time_ratio"], 1 + row["memory_change_pct"] / 100), fontsize=6, alpha=0.7)
    written.append(
        _save(
            fig,
            ax,
            out / "memory_vs_time.png",
            xlabel="step time vs baseline (x)",
            ylabel="peak memory vs baseline (x)",
            title=f"{matrix.name}: memory against time",
        )
    )
    if matrix.kind == "train" and ok["mAP50-95"].notna().any():
        fig, ax = plt.subplots(figsize=(7, 5))
        for (dataset, policy), group in ok.groupby(["dataset", "policy"]):
            group = group.sort_values("imgsz_used")
            ax.plot(group["imgsz_used"], group["mAP50-95"], marker="o", label=f"{dataset}: {policy}")
        written.append(
            _save(fig, ax, out / "map_vs_imgsz.png", xlabel="imgsz", ylabel="mAP50-95", title=f"{matrix.name}: accuracy against imgsz")
        )
        written.append(map_memory_plot(ok, out / "map_vs_memory.png", f"{matrix.name}: accuracy against peak memory"))
    if matrix.kind == "train":
        written += _curves(matrix, ok, out)
    return written


def map_memory_plot(ok: pd.DataFrame, path: Path, title: str) -> Path:
    """mAP50 (filled) and mAP50-95 (hollow) of each finished train cell against its training peak memory (MiB), one
    colour per dataset, each point named as an arm (:func:`~yolo_ckpt.bench.tables.arm_label`); a dotted line at each
    memory budget given in bytes."""
    import matplotlib.pyplot as plt

    from yolo_ckpt.config import Budget

    fig, ax = plt.subplots(figsize=(7, 5))
    for i, (dataset, group) in enumerate(ok.groupby("dataset")):
        colour = f"C{i}"
        ax.scatter(group["peak_MiB"], group["mAP50"], color=colour, label=f"{dataset}: mAP50")
        ax.scatter(group["peak_MiB"], group["mAP50-95"], facecolors="none", edgecolors=colour, label=f"{dataset}: mAP50-95")
        for _, row in group.iterrows():
            ax.annotate(arm_label(row), (row["peak_MiB"], row["mAP50"]), xytext=(5, 4), textcoords="offset points", fontsize=7)
    for budget in ok["memory_budget"].dropna().unique() if "memory_budget" in ok else ():
        parsed = Budget.parse(budget)
        if not parsed.is_fraction:
            ax.axvline(parsed.bytes(None) / 2**20, linestyle=":", color="grey", label=f"memory_budget={budget}")
    ax.margins(x=0.25)  # room for the rightmost point's name
    return _save(fig, ax, path, xlabel="training peak memory (MiB)", ylabel="mAP", title=title)


CURVE_COLUMNS = ("metrics/mAP50(B)", "metrics/mAP50-95(B)", "metrics/mAP50(M)", "metrics/mAP50-95(M)")  # boxes; masks (segment)


def _curves(matrix, ok: pd.DataFrame, out: Path) -> list[Path]:
    """``curves.csv`` and ``curves.png`` of the cells whose run folder still holds its ``results.csv`` (its boxes' mAP
    columns, and its masks' for segmentation); a cell whose run folder was moved or deleted keeps its rows of the
    ``curves.csv`` already there."""
    earlier = pd.read_csv(out / "curves.csv") if (out / "curves.csv").is_file() else None
    frames = []
    for _, row in ok.iterrows():
        csv = out / str(row.get("run_dir", "")) / "results.csv"  # run_dir: relative to out (an older row's absolute)
        tiled = tiles_setting(row) is not None
        label = f"{row['dataset']} {row['policy']} @{row['imgsz_used']:.0f}" + (
            f" tiles ({row['train_images']:.0f}, val on tiles)" if tiled else ""
        )
        if not csv.is_file():
            if earlier is not None:
                frames.append(earlier[earlier["cell"] == label])
            continue
        curve = pd.read_csv(csv).rename(columns=str.strip)
        curve = curve[["epoch", "time", *[c for c in CURVE_COLUMNS if c in curve]]].assign(time=lambda c: training_seconds(c["time"]))
        nan = float("nan")
        frames.append(curve.assign(cell=label, full_mAP50=row["mAP50"] if tiled else nan, full_mAP50_95=row["mAP50-95"] if tiled else nan))
    frames = [f for f in frames if len(f)]
    if not frames:
        return []
    curves = pd.concat(frames, ignore_index=True)
    curves.to_csv(out / "curves.csv", index=False)
    return [curves_plot(curves, out / "curves.png", f"{matrix.name}: training curves")]


def training_seconds(time: pd.Series) -> pd.Series:
    """Ultralytics' ``results.csv`` ``time`` column (seconds since this train() call began: ``BaseTrainer.save_metrics``
    reads ``train_time_start``, which ``_do_train`` sets again on a resume) as seconds since the run began, over its
    resumes: each time it drops (a resumed leg), the leg is shifted by the seconds the earlier legs had reached at their
    last saved epoch (an interrupted epoch's seconds are not counted: its epoch is trained again)."""
    legs = (time.diff() < 0).cumsum()
    reached = time.groupby(legs).last().cumsum().shift(fill_value=0.0)
    return time + legs.map(reached)


def curves_plot(curves: pd.DataFrame, path: Path, title: str) -> Path:
    """Plot ``curves.csv`` rows (of one matrix, or several concatenated) to ``path``: validation mAP50 per epoch of
    each cell, of its masks where it has them (segmentation: the row's mAP50), else of its boxes; a tiles cell's curve
    is its validation on tiles, its best weights on the full images a star."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for label, curve in curves.groupby("cell", sort=False):
        masks = "metrics/mAP50(M)" in curve and curve["metrics/mAP50(M)"].notna().any()
        (line,) = ax.plot(curve["epoch"], curve["metrics/mAP50(M)" if masks else "metrics/mAP50(B)"], marker=".", label=label)
        if curve["full_mAP50"].notna().any():
            ax.scatter(
                curve["epoch"].max(),
                curve["full_mAP50"].iloc[0],
                marker="*",
                s=120,
                color=line.get_color(),
                label=f"{label}: best, full images",
            )
    return _save(fig, ax, path, xlabel="epoch", ylabel="validation mAP50", title=title)


def _save(fig, ax, path: Path, **labels) -> Path:
    """Label, grid and legend ``ax``; write ``fig`` to ``path`` and close it."""
    import matplotlib.pyplot as plt

    ax.set(**labels)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
