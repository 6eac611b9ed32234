"""``yolo-ckpt compare``: the delta table of runs' reports against the first (:mod:`yolo_ckpt.report.compare`)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import ConfigError
from .args import parse_keys


def compare(args: list[str]):
    """``yolo-ckpt compare RUN_DIR_A RUN_DIR_B ... [out=DIR]``: print the delta table of the runs' reports against
    the first and write it as ``compare.csv`` and ``compare.md`` into ``out=`` (default: a new
    ``<runs_dir>/compare/compare<N>``, so nothing is overwritten).

    Returns:
        The table (a pandas DataFrame, a row per run).

    Examples:
        >>> compare(["runs/detect/stock", "runs/detect/recompute-all", "out=runs/compare/ab"])

    Raises:
        SyntaxError: for a key other than ``out=`` (before torch is imported). ConfigError: for ``out=`` a file, and
            as :func:`yolo_ckpt.report.compare.compare_runs` raises (a folder without a report, a damaged one, ...).
    """
    dirs = [a for a in args if "=" not in a]
    options = parse_keys([a for a in args if "=" in a], ("out",), "compare")
    if "out" in options and Path(str(options["out"])).exists() and not Path(str(options["out"])).is_dir():
        raise ConfigError(f"out={options['out']} is a file: give a folder for compare.csv and compare.md (made if missing)")
    from ultralytics.utils import SETTINGS
    from ultralytics.utils.files import increment_path

    from ..report.compare import compare_markdown, compare_runs, compare_warning

    table = compare_runs(dirs)
    markdown = compare_markdown(table)
    if warning := compare_warning(table):
        print(f"yolo-ckpt: {warning[0].lower()}{warning[1:]}", file=sys.stderr)
    print(markdown)
    out = Path(str(options["out"])) if "out" in options else increment_path(Path(SETTINGS["runs_dir"]) / "compare" / "compare")
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "compare.csv", index=False)
    (out / "compare.md").write_text(markdown + "\n")
    print(f"written to {out}")
    return table
