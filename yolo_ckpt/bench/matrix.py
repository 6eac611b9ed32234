"""``yolo-ckpt bench matrix=NAME``: run a benchmark matrix, cell by cell, into ``results.csv``.

``NAME`` is a shipped matrix or a path to a matrix file, read and checked whole before any cell runs or any file is
written (:func:`yolo_ckpt.bench.matrix_file.load_matrix`; the file's format is in :mod:`.matrix_file`). Each finished
cell is a row of ``<out>/results.csv`` (written after every cell), with the machine, versions and date it was
measured on (:func:`.results_io.measured_on`); a rerun skips the cells already there with the same settings (column
``settings``) and retries the failed ones (``rerun=True`` measures every cell again). ``cells=4,7`` runs only the
cells of those numbers (file order from 0, as ``dry=True`` lists them). A cell that raises (out of memory included) is
a ``failed`` row with its reason, and the matrix goes on. At the end ``results.md`` (deltas against each cell's
baseline, the machine per group of rows: :mod:`.tables`), PNG plots (:mod:`.plots`) and ``record.json`` (:mod:`.results_io`: commit, date,
machine, versions, seeds, command of the last run, and the same of each earlier run that added cells) are written; a run
that measured nothing writes nothing. A row's ``run_dir`` is relative to ``out``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import torch
from ultralytics.utils import LOGGER, SETTINGS as ULTRALYTICS_SETTINGS, TQDM

from yolo_ckpt.config import Budget
from yolo_ckpt.errors import ConfigError

from . import plots, step_cell, tables, train_cell
from .cells import CELL_KEYS, cell_budget, cell_id, failed, run_name
from .matrix_file import Matrix, load_matrix, select_cells
from .results_io import measured_on, provenance, with_earlier_runs, write_record


def read_results(out: Path) -> pd.DataFrame:
    """``<out>/results.csv`` (an empty frame if there is none yet)."""
    csv = out / "results.csv"
    if not csv.is_file():
        return pd.DataFrame(columns=["cell", "status"])
    table = pd.read_csv(csv, keep_default_na=False, na_values=[""])
    if not {"cell", "status"} <= set(table.columns):  # e.g. a training run's folder, whose results.csv is Ultralytics'
        raise ConfigError(
            f"out={out}: its results.csv is not a bench results table (no cell and status columns); give a new folder or a "
            "bench's out folder"
        )
    return table


def run_matrix(
    path, out=None, command: str | None = None, overrides: dict | None = None, rerun: bool = False, dry: bool = False, datasets=None,
    cells=None,
) -> pd.DataFrame:
    """Run the cells of a matrix file not yet in ``<out>/results.csv`` with the same settings; write the CSV, the
    Markdown delta table, the plots and the record. A run with no cell to measure writes nothing, unless the folder
    has no ``results.md`` (a run stopped before its end): then it writes the table, the plots and the record from
    ``results.csv``. Returns the results table (one row per cell, file order).

    Args:
        path: the matrix file. out: the results folder (default: ``<runs_dir>/bench/<matrix name>``).
        overrides: settings that replace the file's (:func:`load_matrix`).
        command: recorded in ``record.json`` (default: the ``yolo-ckpt bench`` line).
        rerun: measure every cell again, the finished ones included.
        dry: check the matrix and say which cells would run and which datasets they read; run and write nothing.
        datasets: the folder searched first for the matrix's datasets (:func:`~yolo_ckpt.bench.matrix_file.dataset_roots`).
        cells: run only the cells of these numbers (:func:`select_cells`); None: every cell. A step cell is always
            measured beside its baseline, whose row is kept where results.csv has none (the deltas against it: memory,
            time); a train cell's baseline is not added (a training run), and its deltas stay empty until it runs.

    Raises:
        ConfigError: what :func:`load_matrix` and :func:`select_cells` raise, and for a fraction ``memory_budget``
            without a CUDA device; all before anything is written.
    """
    matrix = load_matrix(path, overrides, datasets)
    chosen = select_cells(matrix, cells)
    fractions = [c for c in chosen if isinstance(b := cell_budget(c["memory_budget"]), Budget) and b.is_fraction]
    if fractions and not torch.cuda.is_available():
        raise ConfigError(
            f"{path}: memory_budget={fractions[0]['memory_budget']} is a fraction of CUDA memory and this machine has no CUDA "
            "device; give bytes with a unit, e.g. 8GB"
        )
    out = Path(out) if out else Path(ULTRALYTICS_SETTINGS["runs_dir"]) / "bench" / matrix.name
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out={out} is a file; out= is the folder the bench writes its results into")
    done = read_results(out)
    settings = json.dumps(matrix.settings, sort_keys=True, default=str)
    finished = set(done.loc[(done["status"] == "ok") & (done.get("settings") == settings), "cell"]) if len(done) and not rerun else set()
    todo = [c for c in chosen if cell_id(c) not in finished]
    LOGGER.info(
        f"yolo-ckpt bench {matrix.name}: {len(chosen)} cells, {len(chosen) - len(todo)} already in "
        f"{out / 'results.csv'}, {len(todo)} to run"
    )
    stopped = not (dry or todo) and len(done) > 0 and not (out / "results.md").is_file()  # a run cut short: its table
    if dry or not (todo or stopped):
        data = "".join(f"; dataset {k}: {v}" for k, v in matrix.data.items())
        reason = "dry=True" if dry else "every cell is done (rerun=True measures them again)"
        listed = "".join(f"\n  cell {i}: {run_name(c)}{'' if c in todo else ' (done)'}" for i, c in enumerate(matrix.cells) if c in chosen)
        LOGGER.info(f"yolo-ckpt bench {matrix.name}: {reason}: nothing run, nothing written{data}{listed if dry else ''}")
        return done
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(matrix.settings.get("seed") or 0)]  # a train matrix's seed= setting; Ultralytics' default is 0
    # a run that adds cells to a folder: its record keeps each earlier run's commit, date and command
    record = {"matrix": matrix.name, "kind": matrix.kind, **provenance(command or f"yolo-ckpt bench matrix={path} out={out}", seeds)}
    record = with_earlier_runs(record, out)
    rows = {r["cell"]: r for r in done.to_dict("records")}
    with TQDM(total=len(todo), desc=f"bench {matrix.name}") as bar:
        for group in _groups(matrix, todo):
            bar.set_description(f"bench {matrix.name}: {run_name(group[-1])}")
            for cell, row in zip(group, _run_group(matrix, group, out)):
                # a step cell's baseline, measured beside it, is kept where results.csv has none: the deltas need it
                unrecorded = cell is group[0] and rows.get(cell_id(cell), {}).get("status") != "ok"
                if cell in todo or unrecorded:
                    row = _relative_run_dir(row, out)
                    rows[cell_id(cell)] = {"cell": cell_id(cell), **cell, **row, "settings": settings, **measured_on(record)}
                    _write_csv(matrix, rows, out)
                    bar.update(cell in todo)
    if matrix.path.resolve() != (out / "matrix.yaml").resolve():  # rerunning a results folder's own copy
        shutil.copyfile(matrix.path, out / "matrix.yaml")
    write_record(out, record)
    results = read_results(out)
    table = tables.delta_table(matrix, results)
    (out / "results.md").write_text(tables.markdown(matrix, table, record))
    plots.write_plots(matrix, table, out)
    return results


def _relative_run_dir(row: dict, out: Path) -> dict:
    """``row`` with its ``run_dir`` relative to ``out`` (a results folder names no path of the machine that ran it)."""
    if not row.get("run_dir"):
        return row
    return {**row, "run_dir": Path(os.path.relpath(Path(row["run_dir"]).resolve(), out.resolve())).as_posix()}


def _groups(matrix: Matrix, todo: list[dict]) -> list[list[dict]]:
    """The cells to run together. Step cells: each baseline with the cells to do of its group, baseline first (it
    is measured again beside them, even when finished: time ratios are only taken within one process).
    Train cells: one by one."""
    if matrix.kind == "train":
        return [[c] for c in todo]
    groups: dict = {}
    for cell in todo:
        base = matrix.baseline_of(cell)
        groups.setdefault(cell_id(base), [base])
        if cell is not base:
            groups[cell_id(base)].append(cell)
    return list(groups.values())


def _run_group(matrix: Matrix, cells: list[dict], out: Path) -> list[dict]:
    """Rows of a group of cells; an exception (out of memory included) fails the cells it hit, not the matrix."""
    try:
        if matrix.kind == "step":
            rows = step_cell.measure(cells, matrix.settings)
        else:
            rows = [train_cell.run(cells[0], matrix.settings, matrix.data.get(cells[0]["dataset"]), out / "runs")]
    except Exception as e:  # noqa: BLE001 - recorded, and the matrix goes on
        LOGGER.warning(f"yolo-ckpt bench: {run_name(cells[0])} failed: {type(e).__name__}: {e}")
        rows = [failed(e) for _ in cells]
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def _write_csv(matrix: Matrix, rows: dict, out: Path) -> None:
    """Rewrite results.csv: the matrix's cells in file order, then rows of cells no longer in the matrix."""
    order = [cell_id(c) for c in matrix.cells]
    ordered = [rows[k] for k in order if k in rows] + [r for k, r in rows.items() if k not in order]
    table = pd.DataFrame(ordered)
    first = ["cell", "status", "reason", *CELL_KEYS]
    table = table[[c for c in first if c in table] + [c for c in table if c not in first]]
    tmp = out / "results.csv.tmp"
    table.to_csv(tmp, index=False)
    tmp.replace(out / "results.csv")  # a crash mid-write never leaves a half file
