"""A matrix's PNG plots (matplotlib): peak memory against step-time ratio per policy; mAP50-95 against imgsz."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def write_plots(matrix, table: pd.DataFrame, out: Path) -> list[Path]:
    """Write ``memory_vs_time.png`` (every kind) and, for train matrices, ``map_vs_imgsz.png`` into ``out``.

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
    written.append(_save(fig, ax, out / "memory_vs_time.png", xlabel="step time vs baseline (x)", ylabel="peak memory vs baseline (x)", title=f"{matrix.name}: memory against time"))
    if matrix.kind == "train" and ok["mAP50-95"].notna().any():
        fig, ax = plt.subplots(figsize=(7, 5))
        for (dataset, policy), group in ok.groupby(["dataset", "policy"]):
            group = group.sort_values("imgsz_used")
            ax.plot(group["imgsz_used"], group["mAP50-95"], marker="o", label=f"{dataset}: {policy}")
        written.append(_save(fig, ax, out / "map_vs_imgsz.png", xlabel="imgsz", ylabel="mAP50-95", title=f"{matrix.name}: accuracy against imgsz"))
    return written


def _save(fig, ax, path: Path, **labels) -> Path:
    """Label, grid and legend ``ax``; write ``fig`` to ``path`` and close it."""
    import matplotlib.pyplot as plt

    ax.set(**labels)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
